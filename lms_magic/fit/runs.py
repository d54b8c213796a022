"""One fair run: a ``fit`` from a captured start, timed per step, out of memory caught.

``%%lms_fit --compare`` (compare.py: with and without LMS) and measured
trials (``tuning/trials.py``: K steps per LMS setting) both run through
:meth:`FairStart.run`: each run starts from the same weights, optimizer state,
callback state and random seed, and whatever ends it other than success
puts the model back where it started.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import keras
import numpy as np

from .. import internals
from ..memory.errors import explained, is_out_of_memory
from ..memory.profile import profiling
from .snapshot import CallbackState, TrainingState

OOM_ADVICE = "try LMS (%%lms_fit), a memory budget (--budget 6GiB), or a smaller batch size"


class StepRecorder(keras.callbacks.Callback):
    """Times each training step and keeps its logs; stops after ``max_steps`` if given."""

    def __init__(self, max_steps: int | None = None):
        super().__init__()
        self.max_steps = max_steps
        self.step_s: list[float] = []
        self.losses: list[float] = []
        self._started = 0.0
        self._fit_frames: tuple = ()  # Keras's fit among them, while it runs: to close its epoch if it raises

    def on_train_begin(self, logs=None):
        self._fit_frames = internals.calling_frames()

    def on_train_batch_begin(self, batch, logs=None):
        self._started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.step_s.append(time.perf_counter() - self._started)
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))
        if self.max_steps is not None and len(self.step_s) >= self.max_steps:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        if self.max_steps is not None and len(self.step_s) >= self.max_steps:  # stopped here: nothing left behind
            internals.close_stopped_epoch(internals.calling_frames())
        self._fit_frames = ()

    def close_raised_epoch(self) -> None:
        """Closes the epoch of a fit that raised: as a stopped fit's, its epoch generator would stay suspended in a
        cycle with the data's iterator (tf.data's threads with it) for a later full collection."""
        frames, self._fit_frames = self._fit_frames, ()
        internals.close_stopped_epoch(frames)

    def time_per_step_s(self) -> float | None:
        """The median step time, the first step (which traces) left out when there are others."""
        timed = self.step_s[1:] if len(self.step_s) > 1 else self.step_s
        return statistics.median(timed) if timed else None


@dataclass
class RunOutcome:
    """How one run ended: ``status`` "ok" or "oom", the history, the step recorder."""

    status: str
    history: object | None
    recorder: StepRecorder
    error_line: str | None = None  # the first line of the out-of-memory error
    explained: bool = False  # the LMS callback has said what filled the memory already


class FairStart:
    """Where every run of a comparison starts, and the runs themselves.

    Args:
        model: a compiled Keras model.
        callbacks: the user's callbacks, whose plain-data state (a checkpoint's
            best value, a patience counter) each run starts from as well.
        seed: the random seed of every run (shuffling, dropout). Defaults to a
            fresh random one, the same for all runs from this start.
        reseed: seed each run (False for a start that has one run: it then
            draws from the user's random state, as a plain ``fit`` would, and
            ``tf.random.set_seed``, which clears TensorFlow's kernel caches
            and cost a 2% slower step, is not called). Defaults to True.

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> start = FairStart(model)
        >>> x, y = np.ones((8, 2)), np.zeros(8)
        >>> runs = [start.run(model.fit, (x, y), {"batch_size": 4, "verbose": 0}) for _ in range(2)]
        >>> runs[0].history.history["loss"] == runs[1].history.history["loss"], runs[0].recorder.step_s != []
        (True, True)
    """

    def __init__(self, model, callbacks=(), seed: int | None = None, reseed: bool = True):
        self.model = model
        self.training = TrainingState.capture(model)
        self.callbacks = CallbackState.capture(callbacks)
        self.seed = int(np.random.default_rng().integers(2**31 - 1)) if seed is None else int(seed)
        self.reseed = reseed

    def restore(self) -> None:
        """The model (weights, optimizer state) and the callbacks as they were at the start."""
        self.training.restore()
        self.callbacks.restore()

    def run(self, fit: Callable, args: tuple | list, kwargs: dict, extra_callbacks=(), max_steps: int | None = None,
            profiler=None, before_fit: Callable[[], None] | None = None) -> RunOutcome:
        """Calls ``fit(*args, **kwargs)`` from the start, with a step recorder and ``extra_callbacks`` added.

        Out of memory ends the run with status "oom" and the model put back;
        any other exception (KeyboardInterrupt included) puts the model back
        and propagates. After a successful run the model is as the run left it.
        """
        self.restore()
        if self.reseed:
            keras.utils.set_random_seed(self.seed)
        recorder = StepRecorder(max_steps)
        callbacks = list(kwargs.get("callbacks") or []) + [recorder] + list(extra_callbacks)
        if before_fit is not None:
            before_fit()
        try:
            with profiling(profiler) if profiler is not None else contextlib.nullcontext():
                history = fit(*args, **{**kwargs, "callbacks": callbacks})
        except BaseException as error:
            recorder.close_raised_epoch()
            self.training.restore()
            if isinstance(error, Exception) and is_out_of_memory(error):
                return RunOutcome("oom", None, recorder, str(error).splitlines()[0][:200] if str(error) else "",
                                  explained(error))
            raise
        return RunOutcome("ok", history, recorder)
