"""One measured model of the device, for every answer in the process: the steps measured on it and the line from
the replay's bytes to the device's (pure Python).

The replay counts the graph's tensors, each kernel's measured scratch at its op; the allocator holds what it does
not show besides. ``explain_fit``, ``largest_batch`` and ``%%lms_fit --batch-size max`` measure real steps
(``sizing/measured.py``) and keep them here with the :class:`Correction` they make; LMS's first step reads them
too, so its figure without LMS, and the dashboard's, is the one ``explain_fit`` showed: the plain step measured at
that batch, or the replay as those steps correct it. Kept by model (weakly: a model deleted takes its figures with
it) and by what a step's peak rests on besides the model object (:func:`setup_key`).

Example:
    >>> class Model:  # anything with weights and a dtype policy
    ...     weights, optimizer, dtype_policy, jit_compile, run_eagerly = [], None, "float32", False, False
    >>> model = Model()
    >>> key = setup_key(model, "/CPU:0", sample_shapes(({"ids": Array((8, 16))}, Array((8,)))))
    >>> measured_device(model, key).steps.setdefault(PLAIN, {})[8] = "a measured step"
    >>> find(model, key).steps[PLAIN][8], find(model, None)
    ('a measured step', None)
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

from ...units import format_size

PLAIN = "plain"  # the steps without LMS, in ``MeasuredDevice.steps``; those with LMS are under LMS's options

# the two measured steps' replayed bytes differ by at least this share of the larger where a line is drawn through
# them; closer, a few percent of noise in a step's peak would tilt the line far off at other batches
LINE_APART = 0.25
# the two steps' ratios to the replay differ by more than this share where a fixed part is drawn; closer, one ratio
# fits both: repeated measures of one batch in one process differ by up to 15% (the tests' causal LM at batch 6),
# and a fixed part made of that noise is off by more than it at batches outside the two
RATIOS_APART = 0.15
# a budget in the replay's bytes is planned for where it is this share under the device's: closer, the two are one
BUDGET_APART = 0.01


@dataclass(frozen=True)
class Correction:
    """What plain steps measured on the device held against the replay's tensors: every way's step bytes (past the
    weights and optimizer state) become ``fixed_bytes + ratio * replay``, a line through two measured batch sizes
    (a fixed part, such as kernels' workspaces, and a part that grows with the batch), or through one where only
    one was measured (``fixed_bytes`` 0).

    Example:
        >>> found = Correction(8, 120 * 2**20, 100 * 2**20, 1.0, "TensorFlow's allocator on CPU:0",
        ...                    other=(4, 70 * 2**20, 50 * 2**20), fixed_bytes=20 * 2**20)
        >>> found.applied(10 * 2**20 + 200 * 2**20, 10 * 2**20) // 2**20  # persistent + fixed + 1.0 x step
        230
    """

    batch_size: int
    measured_bytes: int | None  # the allocator's peak over what the device held before the step
    predicted_bytes: int  # the replay's step bytes at the same batch
    ratio: float  # the measured step bytes per replayed step byte
    source: str  # the allocator read ("TensorFlow's allocator on CPU:0")
    other: tuple[int, int, int] | None = None  # a second measured step: (batch size, measured, replayed bytes)
    fixed_bytes: int = 0  # what the allocator held at any batch beyond the replay's line (may be below 0)
    scratch: str = ""  # the kernels holding the most scratch, where the replay holds each one's as measured

    @classmethod
    def through(cls, batch_size: int, measured_bytes: int, predicted_bytes: int, source: str,
                low: tuple[int, int | None, int] | None = None, scratch: str = "") -> "Correction":
        """The correction by a step measured at ``batch_size`` and, where given, one at a smaller batch (``low``:
        its batch size, measured and replayed step bytes; measured None where it ran out of memory). A line
        through both where their replays are ``LINE_APART`` apart, its slope 0.25-4 and their ratios more than
        ``RATIOS_APART`` apart; one ratio fitting both (least squares) where the ratios are closer; else the
        larger batch's ratio alone.

        Example:
            >>> MiB = 2**20
            >>> Correction.through(8, 72 * MiB, 100 * MiB, "GPU:0", (4, 37 * MiB, 50 * MiB)).fixed_bytes  # noise
            0
            >>> line = Correction.through(8, 120 * MiB, 100 * MiB, "GPU:0", (4, 70 * MiB, 50 * MiB))
            >>> round(line.ratio, 2), line.fixed_bytes // MiB  # a fixed 20 MiB and 1.0 per replayed byte
            (1.0, 20)
        """
        ratio, other, fixed = measured_bytes / max(1, predicted_bytes), None, 0
        low_batch, low_bytes, low_predicted = low if low is not None else (0, None, 0)
        apart = predicted_bytes - low_predicted >= LINE_APART * predicted_bytes  # a fixed scratch can dominate both
        slope = (measured_bytes - low_bytes) / (predicted_bytes - low_predicted) \
            if low_bytes is not None and apart else None
        if slope is not None and 0.25 <= slope <= 4:  # else one step's ratio: a line too steep to trust
            other = (low_batch, low_bytes, low_predicted)
            ratios = sorted((ratio, low_bytes / max(1, low_predicted)))
            if ratios[1] <= ratios[0] * (1 + RATIOS_APART):  # one ratio through both, least squares
                ratio = ((measured_bytes * predicted_bytes + low_bytes * low_predicted)
                         / (predicted_bytes ** 2 + low_predicted ** 2))
            else:
                ratio, fixed = slope, int(measured_bytes - slope * predicted_bytes)
        return cls(batch_size, measured_bytes, predicted_bytes, ratio, source, other, fixed, scratch)

    def applied(self, peak_bytes: int, persistent_bytes: int) -> int:
        """A replayed peak (``persistent_bytes`` of it the weights and optimizer state) as the device holds it."""
        step = peak_bytes - persistent_bytes
        return persistent_bytes + max(0, int(round(self.fixed_bytes + step * self.ratio)))

    def plain_at(self, batch_size: int, peak_bytes: int, persistent_bytes: int) -> int:
        """A plain step's replayed peak at ``batch_size`` as the device holds it: the step measured there, where one
        was, else ``applied``. Every answer says the one figure a measured step gave.

        Example:
            >>> found = Correction(8, 120, 100, 1.1, "CPU:0", other=(4, 70, 50))
            >>> found.plain_at(8, 100, 0), found.plain_at(4, 50, 0), found.plain_at(2, 25, 0)
            (120, 70, 28)
        """
        measured = {self.batch_size: self.measured_bytes, **({self.other[0]: self.other[1]} if self.other else {})}
        if measured.get(batch_size) is not None:
            return persistent_bytes + measured[batch_size]
        return self.applied(peak_bytes, persistent_bytes)

    def replay_budget(self, device_bytes: int, persistent_bytes: int) -> int | None:
        """The budget in the replay's bytes whose plans the device holds within ``device_bytes``, where the steps
        say it holds more than the replay there (by more than ``BUDGET_APART``); else None (plan for it as is).

        Example:
            >>> line = Correction(8, 120, 100, 1.2, "GPU:0")
            >>> line.replay_budget(1200, 0), Correction(8, 100, 100, 1.0, "GPU:0").replay_budget(1200, 0)
            (1000, None)
        """
        if self.measured_bytes is None:
            return None
        budget = self.replayed(device_bytes, persistent_bytes)
        return budget if persistent_bytes < budget < device_bytes * (1 - BUDGET_APART) else None

    def replayed(self, device_bytes: int, persistent_bytes: int) -> int:
        """The replayed peak the device holds as ``device_bytes`` (``applied``'s inverse)."""
        return persistent_bytes + int((device_bytes - persistent_bytes - self.fixed_bytes) / self.ratio)

    @property
    def words(self) -> str:
        if self.measured_bytes is None:
            return f"a plain step at batch {self.batch_size} ran out of memory on the device; figures not corrected"
        steps = [(self.batch_size, self.measured_bytes, self.predicted_bytes)] + ([self.other] if self.other else [])
        held = "; ".join(f"at batch {batch} {format_size(measured)}, {measured / max(1, replayed):.2f}x the replay's "
                         f"{format_size(replayed)}" for batch, measured, replayed in steps)
        done = f"every figure here is the replay's step bytes times {self.ratio:.2f}"
        if self.fixed_bytes:
            done += f", {'plus' if self.fixed_bytes > 0 else 'less'} {format_size(abs(self.fixed_bytes))} at any batch"
        elif self.other:
            done += " (one ratio fits both steps)"
        if self.scratch:  # the replay's bytes hold them
            held = f"{held} (the replay holds each kernel's scratch, as measured, at its op: {self.scratch})"
        return f"measured: plain steps held, in {self.source}, {held}; {done}"


@dataclass
class MeasuredDevice:
    """What was measured on one device for one model and data: the steps by way of training (``PLAIN``, or LMS's
    options in words: ``lms_way``) and batch size, and the :class:`Correction` the plain ones made, the latest."""

    steps: dict = field(default_factory=dict)
    correction: Correction | None = None

    def retrace_s(self) -> float | None:
        """What a retrace of the step costs, as LMS's first checked steps here took (the median of the steps kept
        with LMS that timed one: ``MeasuredStep.retrace_s``); None where none did.

        Example:
            >>> from types import SimpleNamespace as Step
            >>> steps = {PLAIN: {8: Step(retrace_s=None)}, "LMS()": {8: Step(retrace_s=2.0), 16: Step(retrace_s=3.0)}}
            >>> MeasuredDevice(steps).retrace_s(), MeasuredDevice({PLAIN: {8: Step(retrace_s=None)}}).retrace_s()
            (3.0, None)
        """
        timed = sorted(step.retrace_s for way, steps in self.steps.items() if way != PLAIN
                       for step in steps.values() if step.retrace_s is not None)
        return timed[len(timed) // 2] if timed else None


# by model, then by setup_key: every later answer on the same model, device and data reads these rather than measure
# again (a step's peak can differ between two measurements of one batch: the executor may run the backward pass in
# another order, and LMS may plan another way), and reads the same figures as the others
_MEASURED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def model_flags(model) -> tuple:
    """The model's optimizer (by identity), dtype policy and compile flags, as :func:`setup_key` keys them (read
    before a fit whose steps set XLA off while they are traced)."""
    return (id(getattr(model, "optimizer", None)), str(getattr(model, "dtype_policy", "")),
            getattr(model, "jit_compile", None), getattr(model, "run_eagerly", None))


def setup_key(model, device: str | None, samples: tuple | None, flags: tuple | None = None) -> tuple | None:
    """What a step's peak rests on besides the model object and the batch: the device, the model's variables
    (shapes, types, trainable), its optimizer, policy and compile flags (``flags``, else read now:
    :func:`model_flags`), and the data's sample shapes (:func:`sample_shapes`); None where the samples are not
    known (nothing is kept then)."""
    if samples is None or device is None:
        return None
    variables = tuple((tuple(v.shape), str(v.dtype), bool(v.trainable)) for v in model.weights)
    return device, variables, flags if flags is not None else model_flags(model), samples


def measured_device(model, key: tuple) -> MeasuredDevice:
    """The figures kept for ``model`` under ``key`` (made empty where there are none yet)."""
    return _MEASURED.setdefault(model, {}).setdefault(key, MeasuredDevice())


def find(model, key: tuple | None) -> MeasuredDevice | None:
    """The figures kept for ``model`` under ``key``, or None where nothing was measured so."""
    return None if key is None else _MEASURED.get(model, {}).get(key)


def lms_way(options: dict) -> str:
    """LMS's options in words, the key of its steps in ``MeasuredDevice.steps``."""
    return "LMS " + repr(sorted(options.items()))


class Array(NamedTuple):
    """A stand-in with a shape (the docstrings' examples)."""

    shape: tuple


def sample_shapes(data) -> tuple | None:
    """Each input's shape past the batch, in the order the structure holds them (a dict's by key): arrays, a batch's
    traced tensors or ``samples.batch_shapes``' leaves alike; None for anything without a shape.

    Example:
        >>> sample_shapes(({"b": Array((8, 3)), "a": Array((8, 4, 4))}, Array((8,)), None))
        ((4, 4), (3,), ())
    """
    found: list[tuple] = []

    def walk(value) -> bool:
        if value is None:
            return True
        if isinstance(value, dict):
            return all(walk(value[name]) for name in sorted(value))
        if isinstance(value, (tuple, list)) and not hasattr(value, "shape"):
            return all(walk(item) for item in value)
        shape = getattr(value, "shape", None)
        if shape is None:
            return False
        found.append(tuple(shape)[1:])
        return True

    return tuple(found) if walk(data) else None


__all__ = ["PLAIN", "Correction", "MeasuredDevice", "find", "lms_way", "measured_device", "model_flags",
           "sample_shapes", "setup_key"]
