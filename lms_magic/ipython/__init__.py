"""The IPython layer: the three magics (``gpumem.py``, ``lms_fit.py``, ``lms_tune.py``), which parse their
options, call the library and show its results; nothing below this package imports it."""

from __future__ import annotations

from .gpumem import GpuMemMagics
from .lms_fit import LmsFitMagics
from .lms_tune import LmsTuneMagics

MAGIC_NAMES = ("gpumem", "lms_fit", "lms_tune")


def register(shell) -> None:
    """Registers the magics with ``shell`` (called by ``%load_ext lms_magic``).

    ``%lms_tune``'s Apply sets the defaults of the ``%%lms_fit`` registered
    with it (the fit magics object owns them).
    """
    shell.register_magics(GpuMemMagics)
    fit_magics = LmsFitMagics(shell)
    shell.register_magics(fit_magics)
    shell.register_magics(LmsTuneMagics(shell, on_apply=fit_magics.apply_defaults))


def unregister(shell) -> None:
    """Removes every magic that :func:`register` added (``%unload_ext lms_magic``)."""
    manager = shell.magics_manager
    for kind in ("line", "cell"):
        for name in MAGIC_NAMES:
            manager.magics[kind].pop(name, None)
    for magics in (GpuMemMagics, LmsFitMagics, LmsTuneMagics):
        manager.registry.pop(magics.__name__, None)
