"""The contract between the ``LMS`` callback and the engine of one framework (pure: no framework import).

A backend does the work of one ``fit``: it is made when training begins (with the model, the
checked :class:`~lms_magic.lms.options.LmsOptions` and the fit's :class:`~lms_magic.lms.core.stats.LmsStats`),
wraps the model's train step, is entered around every LMS step, hears once that the first step
ran (then fills in the stats: what moved, the peaks), says its one-line summary, and is closed
when the fit ends, however it ends. ``TensorFlowBackend`` (``tensorflow/backend.py``),
``TorchBackend`` (``torch/backend.py``) and ``JaxBackend`` (``jax/backend.py``) implement it;
``lms_magic/testing/backends.py`` has a scripted one for tests.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, ContextManager, Protocol

from .core.stats import LmsStats
from .options import LmsOptions


class Action(enum.Enum):
    """What the callback does after a backend has seen a step it checked."""

    KEEP = "keep"  # the plan stands
    RETRACE = "retrace"  # the backend changed its plan: the train function is made again (the next step traces it)
    STEP_OUT = "step out"  # nothing moves: the model trains with its own train function from the next step


class Backend(Protocol):
    """One fit's LMS on one framework."""

    jit_note: str  # said when the user compiled with XLA / torch.compile, which LMS turns off while it trains

    def train_step(self, original: Callable) -> Callable:
        """The model's train step ``original``, wrapped to move what the plan moves."""

    def step_scope(self) -> ContextManager[None]:
        """What one LMS step needs set, and nothing after it."""

    # Optional: ``train_function(function) -> function``, the train function made with the wrapped step as the
    # callback will call it (JAX's commits the state to the device first); the callback calls ``function``
    # itself where a backend has none.

    def first_step_done(self) -> Action:
        """After the first LMS step (and after the first step of a retrace): fills in the stats (what moved,
        the device peaks) and says what the callback does next."""

    def summary_line(self) -> str:
        """One line for the user: what moves, and the peaks."""

    def close(self) -> None:
        """Releases what the fit held (streams, pinned buffers); called once, however the fit ended."""


BackendFactory = Callable[[Any, LmsOptions, LmsStats], Backend]
