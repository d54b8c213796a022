"""Importing Keras and its framework without their start-up lines in a notebook.

TensorFlow writes its start-up lines (absl's preamble, "oneDNN custom operations are on", CPU features,
CUDA plugin registrations) from C++ straight to the process's standard error, where a notebook shows them
as a red box, whatever ``TF_CPP_MIN_LOG_LEVEL`` says for some of them. Where this package is the first
to import the framework, it does so with file descriptor 2 captured, and writes back every line that is
not one of those; after ``%load_ext lms_magic``, so does TensorFlow's first import by anyone (a notebook's own
``import keras``).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import logging
import importlib.machinery
import os
import re
import sys
import tempfile
from typing import Iterator

# lines a framework writes at import that tell a notebook user nothing they can act on
START_UP_NOISE = re.compile(
    r"absl::InitializeLog|oneDNN custom operations are on|cpu_feature_guard|This TensorFlow binary is optimized"
    r"|^To enable the following instructions|Unable to register cu(DNN|FFT|BLAS) factory|computation_placer"
    r"|TF-TRT Warning|Could not find cuda drivers|All log messages before")


def noise_removed(text: str) -> str:
    """``text`` without the frameworks' start-up lines.

    Example:
        >>> noise_removed("W0000 ... All log messages before absl::InitializeLog() is called\\nreal problem\\n")
        'real problem\\n'
    """
    kept = [line for line in text.splitlines() if not START_UP_NOISE.search(line)]
    return "".join(line + "\n" for line in kept)


@contextlib.contextmanager
def start_up_lines_hidden() -> Iterator[None]:
    """Standard error (the file descriptor, where C++ writes) captured inside the block, and written back
    without the frameworks' start-up lines after it; a no-op where Keras is imported already."""
    if "keras" in sys.modules or "tensorflow" in sys.modules:
        yield
        return
    with _noise_filtered():
        yield


@contextlib.contextmanager
def _noise_filtered() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = noise_removed(captured.read().decode(errors="replace"))
            if kept:
                sys.stderr.write(kept)


class _QuietFirstImport(importlib.abc.MetaPathFinder):
    """On ``sys.meta_path`` from ``%load_ext lms_magic`` until TensorFlow is imported: it finds nothing itself, but
    TensorFlow's first import, whoever asks for it (``import keras`` in a notebook, say), runs with the start-up
    lines hidden. It then leaves ``sys.meta_path``."""

    def find_spec(self, name, path, target=None):
        if name != "tensorflow":
            return None
        remove_quiet_first_import()
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    """TensorFlow's own loader, its module run with the start-up lines hidden; the module keeps that loader (what
    ``importlib.resources`` and the like ask of it)."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self._loader
        with _noise_filtered():
            self._loader.exec_module(module)


def install_quiet_first_import() -> None:
    """From now on, TensorFlow's first import shows none of its start-up lines (``%load_ext lms_magic`` calls this
    where TensorFlow is not imported yet and the user chose no log level: a level they set keeps its lines)."""
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietFirstImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietFirstImport())


def remove_quiet_first_import() -> None:
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _QuietFirstImport)]


def import_keras_quietly() -> None:
    """Imports Keras (and its backend's framework) with the start-up lines hidden."""
    with start_up_lines_hidden():
        import keras  # noqa: F401


class _OwnRetraces(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "triggered tf.function retracing" not in record.getMessage()


@contextlib.contextmanager
def own_retraces_hidden() -> Iterator[None]:
    """TensorFlow's warning that a function was traced again and again, left out while this package runs steps of
    its own (each batch size measured and each tuning trial traces the step anew): the warning would tell the user
    to change code that is not theirs. Any other warning still shows.

    Example:
        >>> with own_retraces_hidden():
        ...     logging.getLogger("tensorflow").warning("5 out of the last 13 calls triggered tf.function retracing")
    """
    hidden, logger = _OwnRetraces(), logging.getLogger("tensorflow")
    logger.addFilter(hidden)
    try:
        yield
    finally:
        logger.removeFilter(hidden)
