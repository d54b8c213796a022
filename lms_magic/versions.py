"""The framework versions LMS is tested with, and the check that refuses others before anything changes.

LMS reaches into Keras's, TensorFlow's and JAX's internals (the ``internals.py`` files);
outside the range below it refuses to start rather than fail half-way.
"""

from __future__ import annotations

import importlib
import os
import re

# The framework versions whose private attributes the internals modules are known to reach (the LMS tests
# pass on each end of the range); outside it LMS refuses to start rather than fail half-way.
# PyTorch is not checked: the PyTorch backend uses only its public saved-tensor hooks.
SUPPORTED = {"tensorflow": ("2.17", "2.21"), "keras": ("3.5", "3.15")}
SKIP_CHECK_VARIABLE = "LMS_MAGIC_SKIP_VERSION_CHECK"


def _release(version: str) -> tuple[int, int]:
    """The (major, minor) of a version string: "2.21.0rc1" -> (2, 21)."""
    parts = re.findall(r"\d+", version)[:2]
    return tuple(int(part) for part in parts) + (0,) * (2 - len(parts))


def unsupported_versions(installed: dict[str, str]) -> list[str]:
    """Each framework of ``installed`` (name -> version) outside SUPPORTED, said with the range.

    Example:
        >>> unsupported_versions({"keras": "3.15.1", "tensorflow": "2.12.0"})
        ['tensorflow 2.12.0 (supported: 2.17 to 2.21)']
    """
    found = []
    for name, version in installed.items():
        low, high = SUPPORTED[name]
        if not _release(low) <= _release(version) <= _release(high):
            found.append(f"{name} {version} (supported: {low} to {high})")
    return found


def check_versions(frameworks: tuple[str, ...] = ()) -> None:
    """Raises RuntimeError when Keras or one of ``frameworks`` (module names: ``("tensorflow",)``) is outside the
    supported range.

    Setting the environment variable LMS_MAGIC_SKIP_VERSION_CHECK=1 skips the check.
    """
    if os.environ.get(SKIP_CHECK_VARIABLE) == "1":
        return
    import keras

    installed = {"keras": keras.__version__}
    for name in frameworks:
        installed[name] = importlib.import_module(name).__version__
    outside = unsupported_versions(installed)
    if outside:
        raise RuntimeError(f"LMS reaches into framework internals and is tested only within a version range: "
                           f"{', '.join(outside)}. Install a supported version, or set {SKIP_CHECK_VARIABLE}=1 "
                           "to try anyway (a failure may then be an unclear one).")
