"""The largest batch: the search over a prediction (:func:`largest_fitting`, which asks as few batch sizes as it can:
each may trace), and the largest batch confirmed by real steps (:func:`confirm_largest`), a search over measured
steps guided by the corrected prediction.

Pure: the steps are measured by the function it is given (``sizing/measured.StepMeter.measure`` in use, a fake in
tests). The first step runs at the predicted largest batch. Each measured step corrects the prediction by its own
ratio (measured over predicted step bytes), or two measured steps give a line in the batch, and the next step runs
at the largest batch the corrected prediction fits, kept strictly between the largest batch measured to fit and
the smallest measured not to (halfway after a step that ran out of memory and so measured nothing). The search
ends when those two are neighbours, or after ``max_steps``. ``sizing/largest.py`` is the user's ``largest_batch``
over it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

MAX_BATCH = 1 << 16  # the largest batch looked for


def largest_fitting(fits: Callable[[int], bool], guess: int, limit: int = MAX_BATCH) -> int:
    """The largest batch size ``b`` in 1..``limit`` with ``fits(b)``, 0 where none fits, for a ``fits`` that holds
    up to some size and not past it; ``guess`` is where the search starts (each call of ``fits`` may trace).

    Example:
        >>> calls = []
        >>> def fits(batch):
        ...     calls.append(batch)
        ...     return batch <= 37
        >>> largest_fitting(fits, guess=36), largest_fitting(lambda b: False, 8), largest_fitting(lambda b: True, 8, 100)
        (37, 0, 100)
        >>> len(calls) <= 6
        True
    """
    known: dict[int, bool] = {}

    def check(batch: int) -> bool:
        if batch not in known:
            known[batch] = fits(batch)
        return known[batch]

    low, high = 0, limit + 1  # fits(low) holds (or low is 0), fits(high) does not (or high is past the limit)
    probe = min(max(1, guess), limit)
    if check(probe):
        low, step = probe, 1
        while low < limit and check(min(low + step, limit)):
            low, step = min(low + step, limit), step * 2
        high = min(low + step, limit + 1)
    else:
        high, step = probe, 1
        while high > 1 and not check(max(high - step, 1)):
            high, step = max(high - step, 1), step * 2
        low = max(high - step, 1) if check(max(high - step, 1)) else 0
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if check(middle) else (low, middle)
    return low

MAX_CONFIRMING = 6  # batch sizes measured at most per way of training


@dataclass(frozen=True)
class MeasuredStep:
    """Steps of one way of training at one batch size, measured on the device.

    ``step_bytes`` is the largest of the steps' allocator peaks over what the device held before each step (the
    batch, activations, gradients, workspaces: not the weights and optimizer state held between steps);
    ``spread_bytes`` the smallest and largest of them. ``out_of_memory`` where the device ran out.
    """

    batch_size: int
    with_lms: bool
    step_bytes: int | None
    spread_bytes: tuple[int, int] | None = None
    out_of_memory: bool = False
    scratch: dict[str, int] | None = None  # each op's kernel scratch in one of the steps (None: not read)
    # with LMS: its first checked step's seconds (a trace of the fit's function, LMS's rewrite, a run): what a
    # retrace of that step costs, as LMS weighs it (None: not timed)
    retrace_s: float | None = None


@dataclass(frozen=True)
class Confirmed:
    """The largest batch a measured step fitted, and the steps that showed it.

    ``batch_size`` 0 where no measured step fitted. ``exact`` where the next batch size was measured not to fit (or
    is past the search's limit): a bisection of real steps would find the same batch, where a step's peak grows
    with the batch. ``total_bytes`` is the weights and optimizer state plus the measured step's bytes at
    ``batch_size``; ``limit_bytes`` what it had to stay within.
    """

    batch_size: int
    total_bytes: int | None
    limit_bytes: int
    exact: bool
    tried: tuple[MeasuredStep, ...] = field(default_factory=tuple)

    @property
    def words(self) -> str:
        """"confirmed by a step at 24 (measured peak 70.1 MiB of 76.8 MiB)", or why not."""
        from ...units import format_size

        if not self.batch_size:
            return f"no batch confirmed: a step at {min(step.batch_size for step in self.tried)} did not fit"
        bound = "" if self.exact else f"; {self.batch_size + 1} and above not measured"
        return (f"confirmed by a step at {self.batch_size} (measured peak {format_size(self.total_bytes)} of "
                f"{format_size(self.limit_bytes)}{bound})")


def confirm_largest(measure: Callable[[int], MeasuredStep], predicted_step_bytes: Callable[[int], int],
                    persistent_bytes: int, limit_bytes: int, predicted_largest: int,
                    max_steps: int = MAX_CONFIRMING, limit: int = MAX_BATCH) -> Confirmed:
    """The largest batch whose measured step, with the weights and optimizer state, stays within ``limit_bytes``.

    Args:
        measure: measures steps at a batch size.
        predicted_step_bytes: the predicted step bytes (the peak less ``persistent_bytes``) at a batch size.
        persistent_bytes: the weights and optimizer state, held between steps.
        limit_bytes: what a step may fill (the usable share of the device).
        predicted_largest: where the search starts.
        max_steps: batch sizes measured at most.
        limit: the largest batch looked for.

    Example:
        >>> real = lambda batch: MeasuredStep(batch, False, 130 * batch)  # the device holds 30% over the replay
        >>> found = confirm_largest(real, lambda batch: 100 * batch, 0, 2600, predicted_largest=26)
        >>> found.batch_size, found.exact, [step.batch_size for step in found.tried]
        (20, True, [26, 20, 21])
    """
    good, bad, good_bytes = 0, limit + 1, None
    tried: list[MeasuredStep] = []
    points: list[tuple[int, int]] = []  # (batch, measured step bytes)
    ratio = None
    probe = min(max(1, predicted_largest), limit)
    while len(tried) < max_steps and bad - good > 1:
        step = measure(probe)
        tried.append(step)
        total = None if step.out_of_memory else persistent_bytes + step.step_bytes
        if total is not None and total <= limit_bytes:
            good, good_bytes = probe, total
        else:
            bad = probe
        if step.step_bytes is not None:
            ratio = step.step_bytes / max(1, predicted_step_bytes(probe))
            points.append((probe, step.step_bytes))
        if bad - good <= 1:
            break
        if step.out_of_memory or ratio is None:  # nothing measured to correct by: halve the gap
            probe = max(good + 1, (good + bad) // 2)
            continue
        (first, first_bytes), (last, last_bytes) = points[-2] if len(points) > 1 else points[-1], points[-1]
        slope = (last_bytes - first_bytes) / (last - first) if last != first else 0.0
        if slope > 0:  # two measured steps: the line through them
            corrected = int((limit_bytes - persistent_bytes - last_bytes) / slope) + last
        else:  # one: the prediction times its ratio
            corrected = largest_fitting(lambda batch: persistent_bytes + ratio * predicted_step_bytes(batch)
                                        <= limit_bytes, probe, limit)
        probe = min(max(corrected, good + 1), bad - 1)
    return Confirmed(good, good_bytes, limit_bytes, bad - good <= 1, tuple(tried))


__all__ = ["Confirmed", "MAX_BATCH", "MAX_CONFIRMING", "MeasuredStep", "confirm_largest", "largest_fitting"]
