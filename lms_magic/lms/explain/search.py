"""The largest batch size that fits, by a search that asks as few batch sizes as it can (each may trace)."""

from __future__ import annotations

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


__all__ = ["MAX_BATCH", "largest_fitting"]
