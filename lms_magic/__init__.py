"""lms_magic: see where the memory of a notebook cell goes, and train models
that do not fit in GPU memory with Large Model Support.

``%load_ext lms_magic`` registers the magics. Loading imports no deep-learning
framework and touches no GPU; the public API below is imported on first use.

Example:
    >>> import lms_magic
    >>> with lms_magic.profile_memory() as report:
    ...     block = bytearray(16 * 2**20)
    >>> report.status
    'ok'
"""

from __future__ import annotations

import importlib
import os
import sys

__version__ = "0.1.0"

# TensorFlow's INFO lines at import (oneDNN, CPU features, absl's preamble) fill a notebook's first output; where
# TensorFlow is not imported yet and the user set no level, they are hidden (its warnings and errors still show)
_LEVEL_CHOSEN = "TF_CPP_MIN_LOG_LEVEL" in os.environ
if "tensorflow" not in sys.modules:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

_PUBLIC = {
    "profile_memory": "lms_magic.memory.profile",
    "MemoryProfiler": "lms_magic.memory.profile",
    "MemoryReport": "lms_magic.memory.report",
    "LMS": "lms_magic.lms.callback",
    "LMSKerasCallback": "lms_magic.lms.tflms",
    "LmsStats": "lms_magic.lms.core.stats",
    "fit_generator": "lms_magic.fit.legacy",
    "parse_bytes": "lms_magic.units",
    "predict_step": "lms_magic.lms.explain.step",
    "autotune": "lms_magic.tuning",
    "TuningSession": "lms_magic.tuning",
    "explain_fit": "lms_magic.sizing.explain_fit",
    "largest_batch": "lms_magic.sizing.largest",
    "simulate_accelerator": "lms_magic.lms.devices",
    "memory_timeline_figure": "lms_magic.ui.plots",
    "save_html": "lms_magic.ui.report_html",
}

__all__ = sorted(_PUBLIC) + ["load_ipython_extension", "unload_ipython_extension"]


def __getattr__(name: str):
    if name in _PUBLIC:
        from .quiet import start_up_lines_hidden

        with start_up_lines_hidden():  # where this is the first import of Keras: no start-up lines in the notebook
            module = importlib.import_module(_PUBLIC[name])
        return getattr(module, name)
    raise AttributeError(f"module 'lms_magic' has no attribute {name!r}")


def __dir__():
    return __all__


def _memory_report_html(report) -> str:
    from .ui.report_html import memory_report_html

    return memory_report_html(report)


def _fit_result_html(result) -> str:
    from .ui.report_html import fit_result_html

    return fit_result_html(result)


def _explanation_html(found) -> str:
    from .ui.explain_html import explanation_html

    return explanation_html(found)


def _render_results_as_html(shell) -> None:
    """Makes a notebook show a ``MemoryReport`` and an ``LmsFitResult`` as HTML tables (the UI's).

    The result objects stay plain data; the shell's HTML formatter is told how to
    draw them, by name, so nothing is imported until one is shown.
    """
    formatter = shell.display_formatter.formatters["text/html"]
    formatter.for_type_by_name("lms_magic.memory.report", "MemoryReport", _memory_report_html)
    formatter.for_type_by_name("lms_magic.fit.results", "LmsFitResult", _fit_result_html)
    formatter.for_type_by_name("lms_magic.lms.explain.results", "FitExplanation", _explanation_html)


if "IPython" in sys.modules and sys.modules["IPython"].get_ipython() is not None:
    _render_results_as_html(sys.modules["IPython"].get_ipython())  # imported in a notebook, with no %load_ext


def load_ipython_extension(ipython) -> None:
    """Called by ``%load_ext lms_magic``: registers the magics, and the results' HTML tables."""
    from .ipython import register
    from .quiet import install_quiet_first_import

    _render_results_as_html(ipython)
    register(ipython)
    if not _LEVEL_CHOSEN:  # the lines TensorFlow prints at import whatever the level: hidden too, where it is ours
        install_quiet_first_import()


def unload_ipython_extension(ipython) -> None:
    """Called by ``%unload_ext lms_magic``: removes what loading registered."""
    from .ipython import unregister
    from .quiet import remove_quiet_first_import

    unregister(ipython)
    remove_quiet_first_import()
