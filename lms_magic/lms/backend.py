"""The contract between the ``LMS`` callback and the engine of one framework (pure: no framework import).

A backend does the work of one ``fit``: it is made when training begins (with the model, the
checked :class:`~lms_magic.lms.options.LmsOptions` and the fit's :class:`~lms_magic.lms.core.stats.LmsStats`),
wraps the model's train step, is entered around every LMS step, hears once that the first step
ran (then fills in the stats: what moved, the peaks), says its one-line summary, and is closed
when the fit ends, however it ends. ``TensorFlowBackend`` (``tensorflow/backend.py``) and
``TorchBackend`` (``torch/backend.py``) implement it; ``lms/fakes.py`` has a scripted one for tests.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Protocol

from .core.stats import LmsStats
from .options import LmsOptions


class Backend(Protocol):
    """One fit's LMS on one framework."""

    jit_note: str  # said when the user compiled with XLA / torch.compile, which LMS turns off while it trains

    def train_step(self, original: Callable) -> Callable:
        """The model's train step ``original``, wrapped to move what the plan moves."""

    def step_scope(self) -> ContextManager[None]:
        """What one LMS step needs set, and nothing after it."""

    def first_step_done(self) -> None:
        """After the first LMS step: fills in the stats (what moved, the device peaks)."""

    def summary_line(self) -> str:
        """One line for the user: what moves, and the peaks."""

    def close(self) -> None:
        """Releases what the fit held (streams, pinned buffers); called once, however the fit ended."""


BackendFactory = Callable[[Any, LmsOptions, LmsStats], Backend]
