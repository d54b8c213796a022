"""Which tensors to swap, and when to bring them back (pure Python).

The candidates are forward tensors that the backward pass reads, in the order
the forward pass produces them: the first ones are held the longest, so they
are swapped first (as TFLMS did). The selection is by count (``n_tensors``),
size (``min_bytes``), layer name or type, or by a memory budget, found by a
binary search over the count with a peak predictor (the liveness replay).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from ..units import format_mib, parse_bytes  # noqa: F401  (parse_bytes: callers import it from here)

DEFAULT_MIN_BYTES = 64 * 1024  # smaller tensors cost a transfer and save little

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
    """

    tensor: str
    layer: str
    layer_type: str
    shape: tuple[int, ...]
    nbytes: int
    forward_index: int


NAME_FIELDS = ("include_layers", "exclude_layers", "include_types", "exclude_types")


def _names(field: str, value) -> tuple[str, ...]:
    """A name filter as a tuple of names: one string is one name, a layer class counts by its name."""
    if isinstance(value, (str, type)):
        value = (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise ValueError(f"{field} takes a layer {'type' if 'types' in field else 'name'} or a list of them, "
                         f"got {value!r}") from None
    names = tuple(item.__name__ if isinstance(item, type) else item for item in items)
    wrong = [item for item in names if not isinstance(item, str)]
    if wrong:
        raise ValueError(f"{field} takes names (strings){' or layer classes' if 'types' in field else ''}, "
                         f"got {wrong[0]!r}")
    return names


@dataclass(frozen=True)
class Selection:
    """The static filters of the LMS options."""

    n_tensors: int = -1
    min_bytes: int = 0
    include_layers: tuple[str, ...] = ()
    exclude_layers: tuple[str, ...] = ()
    include_types: tuple[str, ...] = ()
    exclude_types: tuple[str, ...] = ()

    def __post_init__(self):
        for field in NAME_FIELDS:
            object.__setattr__(self, field, _names(field, getattr(self, field)))
        if not isinstance(self.n_tensors, int) or self.n_tensors < -1:
            raise ValueError(f"n_tensors must be -1 (all), 0 (LMS off) or a positive count, got {self.n_tensors!r}")
        if self.min_bytes < 0:
            raise ValueError(f"min_bytes must be >= 0, got {self.min_bytes!r}")

    def unknown_names(self, layer_types: dict[str, str]) -> list[str]:
        """Notes for filter names that match no layer of the model (``layer_types``: layer name -> class name).

        Example:
            >>> Selection(include_layers="dense_x").unknown_names({"dense_a": "Dense"})
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
        """Applies the filters, then ``n_tensors`` (the first N in forward order)."""
        eligible = self.eligible(candidates)
        if self.n_tensors == -1:
            return eligible
        return eligible[: self.n_tensors]


class BudgetError(ValueError):
    """Even swapping every eligible tensor does not fit the budget."""


def fewest_swaps_within(eligible: list[Candidate], budget_bytes: int,
                        predicted_peak: Callable[[list[Candidate]], int]) -> list[Candidate]:
    """The shortest prefix of ``eligible`` whose predicted peak fits ``budget_bytes``.

    The peak does not grow as more tensors are swapped, so a binary search
    over the prefix length needs about log2(N) predictions.

    Raises:
        BudgetError: swapping all of ``eligible`` still exceeds the budget; the
            message gives the predicted peak.

    Example:
        >>> cands = [Candidate(f"t{i}", "l", "", (1,), 100, i) for i in range(5)]
        >>> peak = lambda swapped: 1000 - 100 * len(swapped)
        >>> len(fewest_swaps_within(cands, 750, peak))
        3
    """
    if predicted_peak([]) <= budget_bytes:
        return []
    lowest = predicted_peak(eligible)
    if lowest > budget_bytes:
        raise BudgetError(
            f"the predicted device peak is {format_mib(lowest)} even with all {len(eligible)} eligible tensors "
            f"swapped, above the budget of {format_mib(budget_bytes)}; try a smaller batch, a lower min_bytes, "
            "or a larger budget"
        )
    low, high = 1, len(eligible)  # invariant: prefix of `high` fits
    while low < high:
        middle = (low + high) // 2
        if predicted_peak(eligible[:middle]) <= budget_bytes:
            high = middle
        else:
            low = middle + 1
    return eligible[:high]


def choose_swaps(selection: Selection, candidates: Iterable[Candidate], budget_bytes: int | None,
                 persistent_bytes: int, transient_peak: Callable[[list[Candidate]], int]) -> list[Candidate]:
    """The one planning rule of LMS, the budget search and the tuner: which candidates to swap.

    Without a budget, ``selection`` decides (filters, then the first
    ``n_tensors``). With one, the fewest first-produced eligible tensors whose
    predicted peak (``persistent_bytes`` plus ``transient_peak(swapped)``) fits.

    Raises:
        BudgetError: the weights and optimizer state alone exceed the budget
            (LMS does not swap them), or even swapping every eligible tensor
            does not fit; the message says what to try.

    Example:
        >>> cands = [Candidate(f"t{i}", "l", "", (1,), 100, i) for i in range(5)]
        >>> peak = lambda swapped: 600 - 100 * len(swapped)
        >>> [c.tensor for c in choose_swaps(Selection(n_tensors=2), cands, None, 400, peak)]
        ['t0', 't1']
        >>> [c.tensor for c in choose_swaps(Selection(), cands, 750, 400, peak)]
        ['t0', 't1', 't2']
    """
    if budget_bytes is None:
        return selection.select(candidates)
    if persistent_bytes > budget_bytes:
        raise BudgetError(f"the model's weights and optimizer state alone take {format_mib(persistent_bytes)}, "
                          f"above the budget of {format_mib(budget_bytes)}; LMS swaps activations, not weights: "
                          "raise the budget or use a smaller model")
    return fewest_swaps_within(selection.eligible(candidates), budget_bytes,
                               lambda chosen: persistent_bytes + transient_peak(chosen))

