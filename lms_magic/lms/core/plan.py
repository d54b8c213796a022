"""Which tensors to swap, and when to bring them back (pure Python).

The candidates are forward tensors that the backward pass reads, in the order
the forward pass produces them: the first ones are held the longest, so they
are swapped first (as TFLMS did). The plans are the prefixes of that order.
By default the plan is the one with the lowest predicted peak (the liveness
replay), and among those within 1% of it the one that moves the fewest bytes;
never one above the peak without LMS. The predicted peak is not monotonic in
the number swapped (swap-ins that arrive with other backward or optimizer work
can raise it), so the search scans the prefix lengths on a grid and zooms in
around the best, rather than assuming that more swaps is lower. ``n_tensors``
-1 swaps all, N the first N; a ``budget`` takes the fewest bytes whose
predicted peak fits. Where the device's capacity is known (a GPU, or
``simulate_accelerator(memory=...)``), the default is to fit it: nothing moves
when the step fits in the capacity less a headroom, else the fewest bytes that
fit (the least step time: the step-time model grows with the bytes moved).
:func:`plan_swaps` is the one rule; it returns a :class:`Plan`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Callable, Iterable

from ...units import format_size
from .costs import StepCost

DEFAULT_MIN_BYTES = 64 * 1024  # smaller tensors cost a transfer and save little
PLANNED = None  # n_tensors's default: the plan with the lowest predicted peak
PEAK_TOLERANCE = 0.01  # plans within 1% of the lowest peak count as equal: the fewest bytes moved wins
# The share of a device's capacity LMS plans to leave free: the replay predicts a little less than allocators
# measure, and allocators fragment (docs/measurements.md: the prediction against the allocator).
CAPACITY_HEADROOM = 0.2
# A traced-graph prediction at most this share of the usable capacity is trusted as it is: the step fits with room
# for the traced graph's error (docs/lms.md: "What the default does"), so no step is probed or replayed for it.
TRUSTED_FIT = 0.75


# what a peak read from the framework itself (every tensor a PyTorch step makes, counted; XLA's compiled step) may
# fill of a device: the allocator's rounding and the libraries' workspaces are what it leaves out
MEASURED_HEADROOM = 0.05


def usable_bytes(capacity_bytes: int) -> int:
    """What LMS plans to fill of a device's capacity: all of it less the headroom.

    Example:
        >>> usable_bytes(10_000)
        8000
    """
    return int(capacity_bytes * (1 - CAPACITY_HEADROOM))


class Rule(str, enum.Enum):
    """What decided a plan (``LmsStats.plan_rule``; compares equal to its words)."""

    LOWEST_PEAK = "lowest predicted peak"  # the default where the device's capacity is unknown
    FITS_DEVICE = "fits the device"  # the default where it is known: nothing, or the fewest bytes that fit
    BUDGET = "budget"  # the user's budget: the fewest bytes that fit it
    ALL = "all eligible"  # n_tensors=-1
    FIRST_N = "first N"  # n_tensors=N

    def __str__(self) -> str:
        return self.value

@dataclass(frozen=True)
class Candidate:
    """A forward tensor that the backward pass reads.

    Args:
        tensor: the tensor's name in the traced graph ("op:index").
        layer: the Keras layer that produced it (or the op's scope).
        layer_type: the layer's class name, or "" if unknown.
        shape: the tensor's shape.
        nbytes: its size in bytes.
        forward_index: its producer's position in the forward pass.
        path: the layers it was made in, outermost first ("backbone/block_0/attention"), where known.
    """

    tensor: str
    layer: str
    layer_type: str
    shape: tuple[int, ...]
    nbytes: int
    forward_index: int
    path: str = ""  # the layers it was made in, outermost first, where the backend knows them (explanations)


NAME_FIELDS = ("include_layers", "exclude_layers", "include_types", "exclude_types")


@dataclass(frozen=True)
class Selection:
    """The static filters of the LMS options (checked by ``lms.options.LmsOptions``, which builds them)."""

    n_tensors: int | None = PLANNED
    min_bytes: int = 0
    include_layers: tuple[str, ...] = ()
    exclude_layers: tuple[str, ...] = ()
    include_types: tuple[str, ...] = ()
    exclude_types: tuple[str, ...] = ()

    def unknown_names(self, layer_types: dict[str, str]) -> list[str]:
        """Notes for filter names that match no layer of the model (``layer_types``: layer name -> class name).

        Example:
            >>> Selection(include_layers=("dense_x",)).unknown_names({"dense_a": "Dense"})
            ["include_layers names no layer of the model: 'dense_x'"]
        """
        known = {"layers": set(layer_types), "types": set(layer_types.values())}
        notes = []
        for field in NAME_FIELDS:
            missing = [name for name in getattr(self, field) if name not in known[field.split("_")[1]]]
            if missing:
                what = "layer" if field.endswith("layers") else "layer type"
                notes.append(f"{field} names no {what} of the model: {', '.join(map(repr, missing))}")
        return notes

    def eligible(self, candidates: Iterable[Candidate]) -> list[Candidate]:
        """The candidates that pass the size and layer filters, in forward order."""
        chosen = []
        for candidate in sorted(candidates, key=lambda c: c.forward_index):
            if candidate.nbytes < self.min_bytes:
                continue
            if self.include_layers and candidate.layer not in self.include_layers:
                continue
            if self.include_types and candidate.layer_type not in self.include_types:
                continue
            if candidate.layer in self.exclude_layers or candidate.layer_type in self.exclude_types:
                continue
            chosen.append(candidate)
        return chosen

    def select(self, candidates: Iterable[Candidate]) -> list[Candidate]:
        """Applies the filters, then ``n_tensors`` (the first N in forward order; all for -1 and, where
        there is no peak predictor to plan with, for None)."""
        eligible = self.eligible(candidates)
        if self.n_tensors in (-1, PLANNED):
            return eligible
        return eligible[: self.n_tensors]


class BudgetError(ValueError):
    """No plan that the search tried fits the budget."""


@dataclass
class PlanSearch:
    """What the search chose and what it tried.

    Attributes:
        chosen: the candidates to swap, in forward order.
        peak_bytes: the predicted peak of the chosen plan (persistent bytes included).
        peak_bytes_without_lms: the predicted peak with nothing swapped.
        lowest_peak_bytes: the lowest predicted peak of any plan tried.
        peaks: the predicted peak of each prefix length tried.
    """

    chosen: list[Candidate]
    peak_bytes: int | None = None
    peak_bytes_without_lms: int | None = None
    lowest_peak_bytes: int | None = None
    peaks: dict[int, int] = dataclass_field(default_factory=dict)

    @property
    def plans_tried(self) -> int:
        return len(self.peaks)


class _PrefixPeaks:
    """The predicted peak of each prefix length of ``eligible``, memoised."""

    def __init__(self, eligible: list[Candidate], predicted_peak: Callable[[list[Candidate]], int]):
        self.eligible, self._predicted_peak, self.peaks = eligible, predicted_peak, {}

    def __call__(self, count: int) -> int:
        if count not in self.peaks:
            self.peaks[count] = self._predicted_peak(self.eligible[:count])
        return self.peaks[count]

    def scan(self, low: int, high: int, intervals: int, until: int | None = None) -> None:
        """Evaluates about ``intervals`` + 1 evenly spaced lengths from ``low`` to ``high``, shortest first; with
        ``until``, none past the first whose peak is <= it (the lengths past it cannot be the shortest that fits)."""
        step = max(1, math.ceil((high - low) / intervals))
        for count in list(range(low, high, step)) + [high]:
            peak = self(count)
            if until is not None and peak <= until:
                return

    def lowest(self) -> int:
        """The length with the lowest peak found, the shortest among equals."""
        return min(self.peaks, key=lambda count: (self.peaks[count], count))

    def zoom_on_lowest(self, intervals: int = 8) -> None:
        """Scans ever finer around the lowest peak found until neighbouring lengths have been tried."""
        while True:
            best, tried = self.lowest(), sorted(self.peaks)
            position = tried.index(best)
            low = tried[position - 1] if position > 0 else best
            high = tried[position + 1] if position + 1 < len(tried) else best
            if all(count in self.peaks for count in range(low, high + 1)):
                return  # every length between the lowest's neighbours has been tried
            self.scan(low, high, intervals)

    def shortest_within(self, limit_bytes: int, intervals: int = 8) -> int | None:
        """The shortest length found whose peak is <= ``limit_bytes``, refined between it and the tried
        length before it (which did not fit) until they are neighbours, each scan stopping at its first fit."""
        while True:
            fitting = [count for count in sorted(self.peaks) if self.peaks[count] <= limit_bytes]
            if not fitting:
                return None
            shortest = fitting[0]
            below = [count for count in self.peaks if count < shortest]
            if not below or shortest - max(below) <= 1:
                return shortest
            self.scan(max(below) + 1, shortest - 1, intervals, until=limit_bytes)


def lowest_peak_plan(eligible: list[Candidate], predicted_peak: Callable[[list[Candidate]], int],
                     tolerance: float = PEAK_TOLERANCE, grid: int = 16) -> PlanSearch:
    """The prefix of ``eligible`` with the lowest predicted peak; among those within ``tolerance`` of it, the
    shortest (fewest bytes moved). Never a plan above the peak with nothing swapped.

    A coarse scan of ``grid`` + 1 lengths, then finer scans around the lowest,
    then around the shortest within tolerance: at most 84 predictions in a fit (the traced graph's search and
    the executed graphs' together) on the keras.applications models of ``benchmarks/lms_default_plan.py``
    (a few hundred candidates each; 40 to 84, and 28 on a bumpy curve of 320, measured before the last scans
    stopped at their first fit). A dip narrower than the grid between two tried lengths can be missed.

    Example:
        >>> cands = [Candidate(f"t{i}", "l", "", (1,), 100, i) for i in range(40)]
        >>> valley = lambda swapped: 1000 - 20 * len(swapped) if len(swapped) <= 25 else 500 + 30 * (len(swapped) - 25)
        >>> search = lowest_peak_plan(cands, valley)
        >>> len(search.chosen), search.peak_bytes, search.peak_bytes_without_lms
        (25, 500, 1000)
        >>> len(lowest_peak_plan(cands, lambda swapped: 1000 + len(swapped)).chosen)  # no swap helps
        0
    """
    peaks = _PrefixPeaks(eligible, predicted_peak)
    peaks.scan(0, len(eligible), grid)
    peaks.zoom_on_lowest()
    lowest = peaks.peaks[peaks.lowest()]
    limit = min(peaks(0), int(lowest * (1 + tolerance)))
    count = peaks.shortest_within(limit)
    return PlanSearch(eligible[:count], peaks(count), peaks(0), lowest, peaks.peaks)


def fewest_swaps_within(eligible: list[Candidate], budget_bytes: int,
                        predicted_peak: Callable[[list[Candidate]], int], grid: int = 16) -> PlanSearch:
    """The shortest prefix of ``eligible`` (fewest bytes moved) whose predicted peak fits ``budget_bytes``.

    The peak is not assumed to fall as more tensors are swapped: lengths are
    scanned on a grid up to the first that fits, the lowest peak is searched for when none does, and
    the shortest fitting length is refined against the tried length before it.
    The chosen plan's peak is a prediction the replay made, not an interpolation.

    Raises:
        BudgetError: no plan tried fits; the message gives the lowest predicted peak found.

    Example:
        >>> cands = [Candidate(f"t{i}", "l", "", (1,), 100, i) for i in range(64)]
        >>> len(fewest_swaps_within(cands, 6_050, lambda swapped: 10_000 - 100 * len(swapped)).chosen)
        40
    """
    peaks = _PrefixPeaks(eligible, predicted_peak)
    if peaks(0) <= budget_bytes:
        return PlanSearch([], peaks(0), peaks(0), peaks(0), peaks.peaks)
    peaks.scan(0, len(eligible), grid, until=budget_bytes)  # the grid up to its first length that fits
    if all(peak > budget_bytes for peak in peaks.peaks.values()):
        peaks.zoom_on_lowest()
    count = peaks.shortest_within(budget_bytes)
    if count is None:
        best = peaks.lowest()
        raise BudgetError(
            f"the lowest predicted device peak of any plan tried is {format_size(peaks.peaks[best])} (swapping {best} of "
            f"{len(eligible)} eligible tensors; all of them: {format_size(peaks(len(eligible)))}), above the budget "
            f"of {format_size(budget_bytes)}; try a smaller batch, a lower min_bytes, or a larger budget"
        )
    return PlanSearch(eligible[:count], peaks(count), peaks(0), min(peaks.peaks.values()), peaks.peaks)


@dataclass(frozen=True)
class Plan:
    """What LMS moves in a train step, what decided it, and what it predicts (the one plan value of
    both backends, the predictor, the tuner and autotune).

    Attributes:
        moved: the candidates that move, in forward order.
        rule: what decided them.
        peak_bytes, peak_bytes_without_lms: the predicted peaks with the plan and with nothing moved
            (persistent bytes included); None without a predictor.
        budget_bytes: what the plan had to fit: the user's budget, or the device's capacity less the
            headroom (``FITS_DEVICE``); None otherwise.
        fits: whether ``peak_bytes`` is within ``budget_bytes`` (None without a budget).
        plans_tried: predictions the search made.
        note: said to the user (where nothing fits, or nothing helps).
        step_ratio: the predicted step time with the plan over the plain step (core/costs.py; 1.0 when
            nothing moves); None without a step cost.
    """

    moved: tuple[Candidate, ...] = ()
    rule: Rule = Rule.LOWEST_PEAK
    peak_bytes: int | None = None
    peak_bytes_without_lms: int | None = None
    budget_bytes: int | None = None
    fits: bool | None = None
    plans_tried: int = 0
    note: str = ""
    step_ratio: float | None = None

    @property
    def moved_bytes(self) -> int:
        """Bytes copied out per step (and the same again back in)."""
        return sum(candidate.nbytes for candidate in self.moved)

    @property
    def rule_text(self) -> str:
        """The rule as people read it ("first 3" for FIRST_N)."""
        return f"first {len(self.moved)}" if self.rule is Rule.FIRST_N else self.rule.value


def plan_swaps(selection: Selection, candidates: Iterable[Candidate],
               transient_peak: Callable[[list[Candidate]], int] | None, persistent_bytes: int = 0,
               budget_bytes: int | None = None, capacity_bytes: int | None = None,
               cost: StepCost | None = None, tolerance: float = PEAK_TOLERANCE) -> Plan:
    """The one planning rule of LMS: which candidates move.

    An explicit option wins: a ``budget_bytes`` takes the fewest bytes whose predicted peak
    (``persistent_bytes`` plus ``transient_peak(moved)``) fits it; an explicit ``selection.n_tensors``
    takes all (-1) or the first N. Else, where the device's ``capacity_bytes`` is known, the plan fits
    it: nothing when the step fits its usable part (:func:`usable_bytes`), else the fewest bytes that
    fit, else (nothing fits) the lowest peak, said in ``note``. Else the lowest predicted peak (see
    :func:`lowest_peak_plan`). Without a predictor (``transient_peak`` None), the default moves every
    eligible candidate. ``tolerance``: the lowest-peak plans' (``PEAK_TOLERANCE``; the hybrid plan asks 0, the
    lowest itself, so that it never predicts above swapping everything). With a ``cost``, the plan carries its
    predicted ``step_ratio``: the plans are
    prefixes in forward order (the first activations, whose copies have the longest forward-to-backward
    gap to hide in, move first; the last layers', whose copies back cannot hide, last), and the cost grows
    with the bytes moved, so the fewest bytes that fit is also the least predicted step time.

    Raises:
        BudgetError: the weights and optimizer state alone exceed the budget
            (LMS does not swap them), or no plan tried fits it; the message says what to try.

    Example:
        >>> cands = [Candidate(f"t{i}", "l", "", (1,), 100, i) for i in range(5)]
        >>> peak = lambda swapped: 600 - 100 * len(swapped)
        >>> [c.tensor for c in plan_swaps(Selection(n_tensors=2), cands, peak, 400).moved]
        ['t0', 't1']
        >>> plan = plan_swaps(Selection(), cands, peak, 400, budget_bytes=750)
        >>> [c.tensor for c in plan.moved], plan.rule, plan.peak_bytes
        (['t0', 't1', 't2'], <Rule.BUDGET: 'budget'>, 700)
        >>> plan_swaps(Selection(), cands, peak, 400, capacity_bytes=1250).moved  # 1000 fits 80% of 1250
        ()
        >>> len(plan_swaps(Selection(), cands, peak, 400, capacity_bytes=1000).moved)  # 800 fits: 2 swaps
        2
        >>> cost = StepCost(compute_s=12e-6, source="measured", to_host_bytes_per_s=1e8, to_device_bytes_per_s=1e8)
        >>> plan_swaps(Selection(), cands, peak, 400, capacity_bytes=800, cost=cost).step_ratio  # 4 us hidden
        1.0
        >>> round(plan_swaps(Selection(n_tensors=-1), cands, peak, 400, cost=cost).step_ratio, 3)  # 5 us out, 4 hide
        1.083
    """
    plan = _planned(selection, candidates, transient_peak, persistent_bytes, budget_bytes, capacity_bytes, tolerance)
    if cost is None:
        return plan
    return dataclasses.replace(plan, step_ratio=cost.ratio(plan.moved_bytes))


def _planned(selection, candidates, transient_peak, persistent_bytes, budget_bytes, capacity_bytes,
             tolerance: float) -> Plan:
    eligible = selection.eligible(candidates)

    def predicted_peak(chosen):
        return persistent_bytes + transient_peak(chosen)

    if budget_bytes is not None:
        if persistent_bytes > budget_bytes:
            raise BudgetError(f"the model's weights and optimizer state alone take {format_size(persistent_bytes)}, "
                              f"above the budget of {format_size(budget_bytes)}; LMS swaps activations, not weights: "
                              "raise the budget or use a smaller model")
        if transient_peak is None:
            return Plan(tuple(eligible), Rule.BUDGET, budget_bytes=budget_bytes)
        return _plan(fewest_swaps_within(eligible, budget_bytes, predicted_peak), Rule.BUDGET, budget_bytes)
    if selection.n_tensors is not PLANNED or transient_peak is None:
        chosen = selection.select(candidates)
        rule = Rule.FIRST_N if selection.n_tensors not in (-1, PLANNED) else Rule.ALL
        if transient_peak is None:
            return Plan(tuple(chosen), rule)
        return Plan(tuple(chosen), rule, predicted_peak(chosen), predicted_peak([]), plans_tried=2)
    if capacity_bytes is not None:
        usable = usable_bytes(capacity_bytes)
        try:
            return _plan(fewest_swaps_within(eligible, usable, predicted_peak), Rule.FITS_DEVICE, usable)
        except BudgetError:
            lowest = lowest_peak_plan(eligible, predicted_peak, tolerance)
            note = (f"the step does not fit the device even so: predicted {format_size(lowest.peak_bytes)} with the "
                    f"lowest-peak plan, above {format_size(usable)} ({1 - CAPACITY_HEADROOM:.0%} of its "
                    f"{format_size(capacity_bytes)}); try a smaller batch")
            return _plan(lowest, Rule.FITS_DEVICE, usable, note)
    return _plan(lowest_peak_plan(eligible, predicted_peak, tolerance), Rule.LOWEST_PEAK)


def _plan(search: PlanSearch, rule: Rule, budget_bytes: int | None = None, note: str = "") -> Plan:
    fits = None if budget_bytes is None else search.peak_bytes <= budget_bytes
    return Plan(tuple(search.chosen), rule, search.peak_bytes, search.peak_bytes_without_lms, budget_bytes, fits,
                search.plans_tried, note)
