"""A step's memory at every batch size from two replays: where each tensor's bytes grow linearly with the batch.

The replay's order does not depend on sizes, and neither does what it frees when. So where every tensor's bytes
are a line in the batch size, the bytes live after each step of the order are lines too, and two replays of the
same graph at two batch sizes give them at every batch size: the peak at any batch is the highest of those lines
there, with no replay. One walk gives both (:func:`resized_lines`): the walk at one size keeps each buffer's
span, and the other size's bytes are added up over those spans. One thing in the replay compares sizes: an
in-place kernel takes over an input's buffer of its output's size. :func:`size_coincidences` finds the batch sizes
where that choice could differ from the two replays' (``explain_fit``'s searches over batch sizes replay at the
others).

:class:`TwoBatches` is the one rule every backend reads a batch size off two points by: TensorFlow's dimensions
at another batch (``tensorflow/rescale.py``), JAX's rescaled jaxpr (``jax/rescale.py``), PyTorch's saved
activations and counts (``torch/predictor.py``), and the lines here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .indexed import IndexedGraph, Node, Replay


class NotALine(ValueError):
    """Two figures that no whole-number line in the batch size joins."""


@dataclass(frozen=True)
class TwoBatches:
    """Two batch sizes at which a step was traced or run: a figure that grows linearly with the batch (a
    dimension, a tensor's bytes, a count), known at both, is read off them at any other batch size. The
    methods take Python ints or numpy arrays of int64 alike.

    Example:
        >>> two = TwoBatches(8, 16)
        >>> two.at(40 * 8 + 100, 40 * 16 + 100, 3), two.slope(80, 160), two.slope(80, 161)
        (220, 10, None)
        >>> two.exactly_at(80, 161, 3)
        Traceback (most recent call last):
        ...
        lms_magic.lms.core.batch_lines.NotALine: 80 at batch 8, 161 at batch 16
        >>> two.meeting(8, 16, 20, 24)  # 1 per sample from 0, and 0.5 per sample from 16: equal at batch 32
        32
    """

    first: int
    second: int

    @property
    def apart(self) -> int:
        return self.second - self.first

    def at(self, at_first, at_second, batch_size):
        """The line through ``(first, at_first)`` and ``(second, at_second)`` at ``batch_size``, rounded down."""
        return at_first + (at_second - at_first) * (batch_size - self.first) // self.apart

    def each_at(self, pairs, batch_size: int) -> list:
        """:meth:`at` of each ``(at_first, at_second)`` of ``pairs`` (a tensor's dimensions, say), in one call.

        Example:
            >>> TwoBatches(8, 16).each_at([(8, 16), (224, 224), (8 * 24, 16 * 24)], 20)
            [20, 224, 480]
        """
        apart, grown = self.second - self.first, batch_size - self.first
        return [one + (two - one) * grown // apart for one, two in pairs]

    def slope(self, at_first, at_second):
        """The growth per sample, where it is a whole number (for arrays: every one); else None."""
        growth, rest = divmod(at_second - at_first, self.apart)
        return None if _any(rest) else growth

    def exactly_at(self, at_first: int, at_second: int, batch_size: int) -> int:
        """:meth:`at` where the growth per sample is whole.

        Raises:
            NotALine: it is not.
        """
        if self.slope(at_first, at_second) is None:
            raise NotALine(f"{at_first} at batch {self.first}, {at_second} at batch {self.second}")
        return self.at(at_first, at_second, batch_size)

    def meeting(self, a_first: int, a_second: int, b_first: int, b_second: int) -> int | None:
        """The batch size above 0 where the lines of ``a`` and ``b`` take the same value, where that is a whole
        number; None where they never meet there (or are one line)."""
        gap = a_first - b_first
        closing = (b_second - b_first) - (a_second - a_first)  # how the gap changes over ``apart`` samples
        if not closing or (gap * self.apart) % closing:
            return None
        meet = self.first + gap * self.apart // closing
        return meet if meet > 0 else None


def _any(rest) -> bool:
    return bool(rest.any()) if hasattr(rest, "any") else bool(rest)


@dataclass(frozen=True)
class LiveLines:
    """The bytes live after each step of a replay, as lines in the batch size.

    Example:
        >>> lines = live_lines(8, Replay(80, "b", ["a", "b"], live_bytes=[40, 80]),
        ...                    16, Replay(160, "b", ["a", "b"], live_bytes=[80, 160]))
        >>> lines.peak_bytes(12), lines.peak_bytes(100)
        (120, 1000)
    """

    batch_size: int
    highest: tuple[tuple[int, int], ...]  # (bytes per sample, bytes at batch_size): the lines that are highest somewhere

    def peak_bytes(self, batch_size: int) -> int:
        """The replay's peak at ``batch_size`` (0 where nothing is live: a replay's peak starts at 0)."""
        grown = batch_size - self.batch_size
        return max(0, max((live + slope * grown for slope, live in self.highest), default=0))


def _highest(slopes, values) -> tuple[tuple[int, int], ...]:
    """Of the lines ``values + slopes * x`` (numpy arrays of int64), those highest at some point: the upper
    envelope, by rising slope. A line between two others is dropped where those two meet at or above it
    (whole-number arithmetic, in Python's ints: exact)."""
    import numpy as np

    order = np.lexsort((values, slopes))  # by slope, the highest value of each slope last
    slopes, values = slopes[order], values[order]
    last = np.ones(len(slopes), dtype=bool)
    last[:-1] = slopes[1:] != slopes[:-1]
    kept: list[tuple[int, int]] = []
    for slope, value in zip(slopes[last].tolist(), values[last].tolist()):
        while len(kept) >= 2:
            (s1, v1), (s2, v2) = kept[-2], kept[-1]
            # the middle line never highest: the outer two meet at or left of where the first and middle meet
            if (v1 - value) * (s2 - s1) <= (v1 - v2) * (slope - s1):
                kept.pop()
            else:
                break
        kept.append((slope, value))
    return tuple(kept)


def live_lines(first_batch: int, first: Replay, second_batch: int, second: Replay) -> LiveLines | None:
    """The lines through two explained replays (``explain=True``) of one graph at two batch sizes; None where the
    two walked different orders, or a step's bytes do not grow by a whole number of bytes per sample (not a
    line through whole tensors).

    Example:
        >>> live_lines(8, Replay(80, "b", ["a", "b"], live_bytes=[40, 80]),
        ...            16, Replay(160, "a", ["b", "a"], live_bytes=[80, 160])) is None  # another order
        True
    """
    if first.order != second.order or first.live_bytes is None or second.live_bytes is None:
        return None
    return _through(first_batch, first.live_bytes, second_batch, second.live_bytes)


def resized_lines(first_batch: int, replay: Replay, second_batch: int) -> LiveLines | None:
    """The lines through an explained replay at ``first_batch`` and its ``resized_live_bytes``, the same walk with
    the sizes at ``second_batch`` (``IndexedGraph.replay(..., resized=...)``): as :func:`live_lines` of two
    replays, with one walk. One walk has one order: that the replay at ``second_batch`` would walk the same one (its
    order does not depend on sizes) is for the caller to have checked, on the two steps (:func:`lines_hold`).

    Example:
        >>> lines = resized_lines(8, Replay(80, "b", ["a", "b"], live_bytes=[40, 80], resized_live_bytes=[80, 160]), 16)
        >>> lines.peak_bytes(100)
        1000
    """
    if replay.resized_live_bytes is None or replay.live_bytes is None:
        return None
    return _through(first_batch, replay.live_bytes, second_batch, replay.resized_live_bytes)


def _through(first_batch: int, first_bytes: list[int], second_batch: int, second_bytes: list[int]) -> LiveLines | None:
    """The lines through the live bytes of one walk at two batch sizes; None where one is not a whole-number line."""
    import numpy as np

    if second_batch == first_batch:
        return None
    low = np.asarray(first_bytes, dtype=np.int64)
    slopes = TwoBatches(first_batch, second_batch).slope(low, np.asarray(second_bytes, dtype=np.int64))
    return None if slopes is None else LiveLines(first_batch, _highest(slopes, low))


def lines_hold(first_batch: int, first: IndexedGraph, second_batch: int, second: IndexedGraph) -> set[int] | None:
    """Whether the lines of one graph's replays at two batch sizes say what a replay at any other does: the same
    nodes, walked in the same execution order at both sizes (the order must not depend on sizes: a scheduler that
    weighed tensor sizes would break it), and no in-place choice that differs between them. The batch sizes where
    an in-place choice could still differ (:func:`size_coincidences`: there the caller replays), or None where the
    lines say nothing of other batch sizes.

    Example:
        >>> nodes = lambda batch, first: [Node("a", (batch,), priority=0 if first else 1),
        ...                               Node("b", (2 * batch,), priority=1 if first else 0)]
        >>> lines_hold(8, IndexedGraph(nodes(8, True)), 16, IndexedGraph(nodes(16, True)))
        set()
        >>> lines_hold(8, IndexedGraph(nodes(8, True)), 16, IndexedGraph(nodes(16, False))) is None  # orders differ
        True
    """
    if first.order() != second.order():
        return None
    return size_coincidences(first_batch, first.nodes, second_batch, second.nodes)


def size_coincidences(first_batch: int, first: list[Node], second_batch: int, second: list[Node]) -> set[int] | None:
    """The batch sizes where an in-place kernel's choice (take over an input's buffer of its output's size) could
    differ from what it was in the two node lists of one graph at two batch sizes; None where it differed between
    those two (their lines then say nothing of other batch sizes).

    Each node that may take an input's buffer compares its first output's bytes with each data input's: two lines
    that are one line agree at every batch, two that are apart at both batch sizes can meet at one.

    Example:
        >>> nodes = lambda batch: [Node("w", (4000,)), Node("x", (40 * batch,)),
        ...                        Node("y", (40 * batch,), (("x", 0), ("w", 0)), forwards_input=True)]
        >>> size_coincidences(8, nodes(8), 16, nodes(16))  # y meets w's size at batch 100
        {100}
    """
    if [node.name for node in first] != [node.name for node in second]:
        return None
    outputs_first = {node.name: node.outputs for node in first}
    outputs_second = {node.name: node.outputs for node in second}
    two = TwoBatches(first_batch, second_batch)
    batches: set[int] = set()
    for node, again in zip(first, second):
        if not (node.forwards_input and node.on_device and node.outputs):
            continue
        out_low, out_high = node.outputs[0], again.outputs[0]
        for name, index in node.inputs:
            low, high = outputs_first.get(name, ()), outputs_second.get(name, ())
            if index >= len(low) or index >= len(high):
                continue
            in_low, in_high = low[index], high[index]
            if (in_low == out_low) != (in_high == out_high):
                return None
            if in_low == out_low:
                continue  # one line (or two that agree at both: one line through whole bytes)
            meet = two.meeting(in_low, in_high, out_low, out_high)
            if meet is not None:
                batches.add(meet)
    return batches


__all__ = ["LiveLines", "NotALine", "TwoBatches", "lines_hold", "live_lines", "resized_lines", "size_coincidences"]
