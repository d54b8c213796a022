"""A scripted LMS backend, for testing the ``LMS`` callback's contract without a framework's engine.

As ``testing/memory.py`` stands in for NVML, :class:`FakeBackends` stands in for the TensorFlow and
PyTorch backends: ``LMS(backend=FakeBackends(...))`` trains a model plainly while the callback
drives the fake through the contract of ``lms/backend.py``; each fake logs what it was asked, can
fail at a chosen point, and fills the stats with a scripted report after the first step.
"""

from __future__ import annotations

import contextlib
from typing import Callable

from ..lms.backend import Action
from ..lms.core.stats import LmsStats
from ..lms.options import LmsOptions


class FakeFailure(RuntimeError):
    """The error a fake backend raises where it was told to fail."""


class FakeBackend:
    """One fit's scripted backend: ``events`` logs each call ("begin", "train_step", "step",
    "first_step_done", "summary_line", "close").

    Args:
        model, options, stats: what the callback hands a backend.
        report: the stats fields set after the first step. Defaults to 2 of 4 tensors swapped.
        fail_at: the event at which to raise :class:`FakeFailure`, or None.
        actions: what ``first_step_done`` answers, in turn (the last repeats). Defaults to ``[Action.KEEP]``.
    """

    jit_note = "the fake backend turns jit_compile off while it trains"
    DEFAULT_REPORT = {"candidates": 4, "swapped_tensors": 2, "swapped_bytes_per_step": 2048,
                      "device_peak_bytes": 1000, "device_peak_bytes_without_lms": 1500, "peak_source": "predicted",
                      "prediction_source": "fake", "plan_rule": "lowest predicted peak"}

    def __init__(self, model, options: LmsOptions, stats: LmsStats, report: dict | None = None,
                 fail_at: str | None = None, actions=(Action.KEEP,)):
        self.model, self.options, self.stats = model, options, stats
        self.report = dict(self.DEFAULT_REPORT if report is None else report)
        self.fail_at = fail_at
        self._actions = list(actions)
        self.events: list[str] = []
        self._log("begin")
        stats.update(active=True)

    def _log(self, event: str) -> None:
        self.events.append(event)
        if event == self.fail_at:
            raise FakeFailure(f"the fake backend failed at {event!r}")

    def train_step(self, original: Callable) -> Callable:
        self._log("train_step")
        return original

    @contextlib.contextmanager
    def step_scope(self):
        self._log("step")
        yield

    def first_step_done(self) -> Action:
        self._log("first_step_done")
        self.stats.update(self.report)
        return self._actions.pop(0) if len(self._actions) > 1 else self._actions[0]

    def summary_line(self) -> str:
        self._log("summary_line")
        return f"LMS (fake): {self.stats.swapped_tensors} of {self.stats.candidates} tensors"

    def close(self) -> None:
        self._log("close")


class FakeBackends:
    """A backend factory for ``LMS(backend=...)`` that keeps every :class:`FakeBackend` it made.

    Example:
        >>> import keras, numpy as np
        >>> from lms_magic import LMS
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> backends = FakeBackends()
        >>> callback = LMS(backend=backends, verbose=0)
        >>> _ = model.fit(np.ones((8, 4)), np.ones(8), batch_size=4, verbose=0, callbacks=[callback])
        >>> backends.made[0].events
        ['begin', 'train_step', 'step', 'first_step_done', 'summary_line', 'step', 'close']
        >>> callback.stats.swapped_tensors, callback.stats.steps
        (2, 2)
    """

    def __init__(self, report: dict | None = None, fail_at: str | None = None, actions=(Action.KEEP,)):
        self.report, self.fail_at, self.actions = report, fail_at, actions
        self.made: list[FakeBackend] = []

    def __call__(self, model, options: LmsOptions, stats: LmsStats) -> FakeBackend:
        backend = FakeBackend(model, options, stats, self.report, self.fail_at, self.actions)
        self.made.append(backend)
        return backend
