"""Shared fixtures: a real IPython shell with the extension loaded, and the gpu marker."""

from __future__ import annotations

import os
import threading

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The same CPU kernels on every machine: TensorFlow turns oneDNN on by itself only on some CPUs
# (not on the AMD EPYC of some CI machines), and keeps CPU allocator statistics, which the
# measured-peak proofs read, only with it on.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


def _gpu_available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:
        return False


def pytest_ignore_collect(collection_path, config):
    """tests/torch_backend and torch_offload.py's doctests run in their own pytest run with KERAS_BACKEND=torch
    (Keras picks one backend a process, and the TensorFlow run stays free of PyTorch)."""
    torch_only = "torch_backend" in collection_path.parts or collection_path.name == "torch_offload.py"
    if torch_only and os.environ.get("KERAS_BACKEND") != "torch":
        return True
    return None


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _gpu_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (NVML finds none on this machine)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def shell():
    """IPython's test shell with lms_magic loaded and a clean user namespace."""
    from IPython.testing.globalipapp import get_ipython

    import builtins

    if hasattr(builtins, "_"):
        del builtins._  # left by a doctest's last value; while it exists IPython does not set `_`
    ip = get_ipython()
    ip.run_line_magic("load_ext", "lms_magic")
    before = set(ip.user_ns)
    yield ip
    for name in set(ip.user_ns) - before:
        del ip.user_ns[name]
    ip.run_line_magic("unload_ext", "lms_magic")


@pytest.fixture
def no_new_threads():
    """Fails the test if it leaves a thread running."""
    before = set(threading.enumerate())
    yield
    left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not left, f"threads left running: {left}"
