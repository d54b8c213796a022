"""Real train steps on the device, each step's peak read from the framework's own allocator, the model put back.

What closes ``explain_fit``'s loop: the replay counts the graph's tensors; the allocator also holds what the graph
does not show (whole chunks for smaller requests, cuDNN's workspaces). :class:`StepMeter` runs a few steps of the
user's ``fit`` at one batch size (with or without LMS) from a saved start, reads the allocator's peak of each step
over what the device held before it (``StepPeaks``), and puts back the weights, optimizer state, metrics, Python's
and NumPy's random state and ``model.history``. It exists where the allocator of the device LMS relieves can be read
and reset: TensorFlow on a GPU or on ``simulate_accelerator``'s device, PyTorch on CUDA (``step_meter``).
"""

from __future__ import annotations

import math
import random

import keras
import numpy as np

from ..lms.core import device_model
from ..lms.core.plan import BudgetError
from ..lms.explain.largest import MeasuredStep
from ..quiet import own_retraces_hidden

MEASURED_STEPS = 3  # steps measured at a batch size, after one that warms up (traces) and is not read

class StepPeaks(keras.callbacks.Callback):
    """Reads ``counter`` (a :class:`~lms_magic.memory.frameworks.AllocatorCounter`) around each train step but the
    first ``skip`` (which trace): its peak over what the device held when the step began.

    Example:
        >>> class Counter:  # a fake allocator: each step holds 40 bytes over the 100 before it
        ...     held = 100
        ...     def reset(self): pass
        ...     def read(self): return self.held, self.held + 40
        >>> peaks = StepPeaks(Counter(), skip=1)
        >>> for step in range(3):
        ...     peaks.on_train_batch_begin(step); peaks.on_train_batch_end(step)
        >>> peaks.step_bytes
        [40, 40]
    """

    def __init__(self, counter, skip: int = 0, recording=None):
        super().__init__()
        self.counter, self.skip = counter, skip
        self.step_bytes: list[int] = []
        self._before = 0
        self._recording, self._open = recording, None  # a block entered around the first step read, and it open

    def on_train_batch_begin(self, batch, logs=None):
        if batch >= self.skip:
            self.counter.reset()
            self._before = self.counter.read()[0]
            if batch == self.skip and self._recording is not None:
                self._open = self._recording()
                self._open.__enter__()

    def on_train_batch_end(self, batch, logs=None):
        if batch >= self.skip:
            self.step_bytes.append(max(0, self.counter.read()[1] - self._before))
            self.close()

    def close(self) -> None:
        """Ends the recording block where it is open (the step ended, or the fit stopped in it)."""
        block, self._open = self._open, None
        if block is not None:
            block.__exit__(None, None, None)


class StepMeter:
    """Measures real train steps of ``model`` on ``data`` with the device's allocator ``counter``.

    Args:
        model: a compiled Keras model.
        data: ``(x, y)`` arrays or a ``tf.data.Dataset``, as ``explain_fit`` takes them.
        counter: the allocator of the device LMS relieves.
        lms_options: the options of the LMS a step with LMS runs under (``min_bytes``, ``device``...).
        device: the device measured ("/GPU:0", "/CPU:0" simulated): a plain step's kernel scratch is read where
            the framework reads it there (``Framework.kernel_scratch_recorded``).
        fit_steps: batch size -> the steps of the fit the steps with LMS stand for (None there, or no
            ``fit_steps``: a fit of unknown length), as ``samples.fit_steps`` counts them.
    """

    def __init__(self, model, data, counter, lms_options: dict | None = None, device: str | None = None,
                 fit_steps=None):
        self.model, self.data, self.counter, self.device = model, data, counter, device
        self.lms_options = dict(lms_options or {})
        self.fit_steps = fit_steps
        self._known: dict[tuple, MeasuredStep] = {}

    def lms_fit_steps(self, batch_size: int) -> float:
        """The steps of the fit a step with LMS at ``batch_size`` stands for (``LMS.fit_steps``): so its first step's
        swaps stand, or the plan is traced, as in that fit; math.inf where its length is unknown."""
        steps = None if self.fit_steps is None else self.fit_steps(batch_size)
        return math.inf if steps is None else steps

    @property
    def on_gpu(self) -> bool:
        """Whether the device is a real GPU (not ``simulate_accelerator``'s)."""
        return self.counter.gpu_index is not None

    @property
    def where(self) -> str:
        """The allocator read, in words: "TensorFlow's allocator on CPU:0 (AMD EPYC 7R13 Processor, AVX2)" (a CPU's
        figures name the CPU: its kernels' scratch differs by it)."""
        where = f"{self.counter.framework}'s allocator on {self.counter.device}"
        if self.on_gpu:
            return where
        from ..memory.machine import cpu_name

        return f"{where} ({cpu_name()})"

    def measure(self, batch_size: int, with_lms: bool = False, options: dict | None = None,
                steps: int = MEASURED_STEPS) -> MeasuredStep:
        """``steps`` + 1 steps at ``batch_size`` (with LMS where ``with_lms``, its ``options`` over the meter's),
        the first not read; the model and the random state end as they were, whatever happens. A batch measured
        the same way before is not measured again."""
        fit_steps = self.lms_fit_steps(batch_size) if with_lms else None
        key = (batch_size, with_lms, tuple(sorted((options or {}).items())), fit_steps)
        if key in self._known:
            return self._known[key]
        kept = self._kept(with_lms, options, fit_steps)
        remembered = None if kept is None else kept.get(batch_size)
        if remembered is not None:
            self._known[key] = remembered
            return remembered
        from ..lms.callback import LMS
        from ..lms.framework import framework

        scratch: list[dict] = []  # a plain step's kernels' scratch, where the framework reads it
        recording = None if with_lms else lambda: framework().kernel_scratch_recorded(scratch.append, self.device)
        peaks = StepPeaks(self.counter, skip=1, recording=recording)
        lms = [LMS(verbose=0, **{**self.lms_options, **(options or {})})] if with_lms else []
        for callback in lms:
            callback.fit_steps = fit_steps
        try:
            outcome = self._run(batch_size, lms, peaks, steps)
        finally:
            peaks.close()
        if outcome is None or outcome.status == "oom":
            found = MeasuredStep(batch_size, with_lms, None, out_of_memory=True)
        elif lms and not self.on_gpu and lms[0].stats.swapped_tensors + lms[0].stats.recomputed_tensors:
            found = _lms_step(batch_size, lms[0].stats)  # the allocator holds what moved to the host too
        else:
            read = peaks.step_bytes or [0]
            found = MeasuredStep(batch_size, with_lms, max(read), (min(read), max(read)),
                                 scratch=scratch[0] if scratch else None,
                                 retrace_s=lms[0].stats.checked_step_s if lms else None)
        self._known[key] = found
        if kept is not None and not found.out_of_memory:  # an out-of-memory step is tried again later
            kept[batch_size] = found
        return found

    def kept_batches(self) -> list[int]:
        """The batch sizes whose plain steps were measured before in this process, on the same model, device and
        data (out-of-memory steps are not kept)."""
        return sorted(self._kept() or ())

    def _kept(self, with_lms: bool = False, options: dict | None = None, fit_steps: float | None = None) -> dict | None:
        """This model's steps kept for this device and data (with LMS: under these options, for a fit of
        ``fit_steps``), by batch size, in the process's one model of the device (``lms.core.device_model``); None
        where they are not kept."""
        measured = self.measured_device()
        if measured is None:
            return None
        way = device_model.lms_way({**self.lms_options, **(options or {}), "fit_steps": fit_steps}) if with_lms \
            else device_model.PLAIN
        return measured.steps.setdefault(way, {})

    def measured_device(self) -> "device_model.MeasuredDevice | None":
        """What was measured on this device for this model and data (``lms.core.device_model``); None where the
        data are not arrays (a dataset read again may yield other batches: measured each time)."""
        if not _arrays(self.data):
            return None
        key = device_model.setup_key(self.model, self.device, device_model.sample_shapes(self.data))
        return None if key is None else device_model.measured_device(self.model, key)

    def _run(self, batch_size: int, lms: list, peaks, steps: int):
        """``steps`` + 1 steps of ``fit`` at ``batch_size`` from a saved start, put back after; the outcome (None:
        no plan of LMS's fits its budget)."""
        from ..fit.runs import FairStart
        from ..lms.samples import fit_arguments, take_samples

        args, data_kwargs = fit_arguments(take_samples(self.data, batch_size * (steps + 1)))
        history = getattr(self.model, "history", None)
        random_state, numpy_state = random.getstate(), np.random.get_state()
        start = FairStart(self.model, reseed=False)
        try:
            # exactly steps + 1 batches, run to the epoch's end (not stopped at its last step: that leaves Keras's
            # epoch generator suspended with its tf.data iterator and threads, for a full collection to free)
            with own_retraces_hidden():
                outcome = start.run(self.model.fit, args, {**data_kwargs, "batch_size": batch_size, "epochs": 1,
                                                           "shuffle": False, "verbose": 0}, lms + [peaks])
        except BudgetError:  # no plan of LMS's fits the budget at this batch: as if out of memory
            outcome = None
        finally:
            start.restore()
            random.setstate(random_state)
            np.random.set_state(numpy_state)
            self.model.history = history
        return outcome


class Unmeasured(Exception):
    """A step with LMS ran on ``simulate_accelerator``'s device and LMS could not read what the device held in it
    (its profile missed a swap, or another profiler held TensorFlow's); the message says why."""


def _lms_step(batch_size: int, stats) -> MeasuredStep:
    """A step with LMS that moved tensors on the simulated device: LMS's reading of its checked step, the allocator
    (which the host shares) less what the host held (``lms/tensorflow/shared_host.py``).

    Raises:
        Unmeasured: LMS did not read its step.
    """
    if stats.measured_source is None or stats.measured_step_peak_bytes is None or stats.persistent_bytes is None:
        why = next((note for note in stats.notes if "not measured" in note),
                   "its profile read nothing (another profiler session, such as TensorBoard(profile_batch=...)'s, "
                   "held TensorFlow's profiler, or the profile missed a swap)")
        raise Unmeasured(f"LMS's step at batch {batch_size} was not measured on the simulated device: {why}")
    step_bytes = stats.measured_step_peak_bytes - stats.persistent_bytes
    return MeasuredStep(batch_size, True, step_bytes, (step_bytes, step_bytes), retrace_s=stats.checked_step_s)


def _arrays(data) -> bool:
    """Whether ``data`` are arrays (tuples, dicts of them), which a step reads the same each time."""
    leaves = data if isinstance(data, (tuple, list)) else (data,)
    values = [value for leaf in leaves for value in (leaf.values() if isinstance(leaf, dict) else (leaf,))]
    return all(getattr(value, "shape", None) is not None and getattr(value, "dtype", None) is not None
               for value in values)


def step_meter(model, data, device: str | None, lms_options: dict | None = None,
               fit_steps=None) -> tuple[StepMeter | None, str]:
    """The meter of the device LMS relieves (``device``: "/GPU:0", "/CPU:0" simulated), or None and why not
    (``fit_steps``: as :class:`StepMeter` takes it).

    Example:
        >>> print(step_meter(None, None, None)[1])
        no accelerator to measure on: the figures are the graph's tensors only
    """
    from ..lms.devices import is_simulated

    if device is None or device.startswith("/CPU") and not is_simulated(device):
        return None, "no accelerator to measure on: the figures are the graph's tensors only"
    from ..memory.frameworks import BFC_ADVICE, MISSES_SMALL_TENSORS, resettable_counter

    counter = resettable_counter(device)
    why = (f"{device}'s allocator cannot be read and reset on {keras.backend.backend()}: the figures are the graph's "
           "tensors only")
    if counter is None:
        return None, why
    on_cpu = counter.gpu_index is None and counter.framework == "TensorFlow"
    advice = (f"{BFC_ADVICE} (simulate_accelerator() does) to have steps measured; the figures are the graph's "
              "tensors only")
    try:
        counter.reset()
        counter.read()
    except Exception as error:  # TensorFlow's CPU allocator keeps no statistics with oneDNN off and no BFC
        return None, (f"TensorFlow's CPU allocator keeps no statistics: {advice}" if on_cpu else why) + f" ({error})"
    if not counter.counts_every_tensor():
        return None, f"TensorFlow's CPU allocator (oneDNN's) {MISSES_SMALL_TENSORS}: {advice}"
    return StepMeter(model, data, counter, lms_options, device, fit_steps), ""


__all__ = ["MEASURED_STEPS", "StepMeter", "StepPeaks", "Unmeasured", "step_meter"]
