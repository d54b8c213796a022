"""The liveness walk: a graph's execution order, numbered flat, walked for when each buffer is made and freed.

``core/indexed.py`` numbers a graph (and each change of it) once: every tensor a number, each node's first
tensor number, its inputs as tensor numbers (-1: from outside the graph), each tensor's device bytes and
readers. :func:`walk` follows an execution order over those arrays: a buffer is its allocating tensor's
number, so the walk only follows reads (when each buffer's last reader runs) and the aliasing and in-place
choices; numpy adds the bytes up (:meth:`Walked.live_bytes`), at the graph's sizes or at others.

Example:
    >>> from lms_magic.lms.core.indexed import IndexedGraph, Node
    >>> graph = IndexedGraph([Node("x", (100,)), Node("y", (50,), (("x", 0),)), Node("z", (10,), (("y", 0),))])
    >>> graph.replay(explain=True).live_bytes  # x freed once y has read it, y once z has
    [100, 150, 60]
"""

from __future__ import annotations

from dataclasses import dataclass


def shares(node) -> tuple[int | None, bool] | None:
    """How an output of ``node`` (a ``core.indexed.Node``) may share an input's buffer: (the aliased input, as
    ``Node.alias_input``; whether output 0 may take an input's in place); None where it may not."""
    in_place = node.forwards_input and node.on_device
    return (node.alias_input, in_place) if node.alias_input is not None or in_place else None


@dataclass
class Walked:
    """What the liveness walk found, by tensor number: the buffer each tensor's bytes live in (its own number
    where it allocated one), the step each buffer was allocated and freed at, and the in-place writers."""

    owned: object  # numpy bool array: the tensor allocated a buffer
    allocated: object  # numpy int64: the step of its producer (-1: never run)
    freed: object  # numpy int64: the step its last reader ran (its producer's where none reads it)
    steps: int
    in_place: dict[int, list[tuple[int, int]]]  # buffer -> (step, tensor) of each in-place kernel that took it over

    def live_bytes(self, flat_bytes: list[int], persistent_bytes: int):
        """The bytes live after each step (numpy int64), each buffer holding its allocating tensor's
        ``flat_bytes`` from its allocation to its freeing, both included."""
        import numpy as np

        n_bytes = np.asarray(flat_bytes[:len(self.owned)], dtype=np.int64)[self.owned]
        change = np.zeros(self.steps + 1, dtype=np.int64)
        np.add.at(change, self.allocated[self.owned], n_bytes)
        np.subtract.at(change, np.minimum(self.freed[self.owned], self.steps - 1) + 1, n_bytes)
        return np.cumsum(change[:self.steps]) + persistent_bytes

    def at_peak(self, change, peak_step: int) -> list[tuple[tuple[str, int], int]]:
        """The buffers live at ``peak_step`` (a buffer freed there was live when the peak was counted), in the
        order they were allocated, each as (the tensor that last wrote it, its bytes)."""
        import numpy as np

        n_bytes = np.asarray(change.flat_bytes[:len(self.owned)], dtype=np.int64)
        live = self.owned & (n_bytes > 0) & (self.allocated <= peak_step) & (peak_step <= self.freed)
        buffers = np.flatnonzero(live)
        buffers = buffers[np.argsort(self.allocated[buffers], kind="stable")].tolist()
        result = []
        for buffer in buffers:
            writer = buffer if buffer not in self.in_place else \
                max((w for w in self.in_place[buffer] if w[0] <= peak_step), default=(0, buffer))[1]
            position = change.node_of(writer)
            result.append(((change.nodes[position].name, writer - change.first[position]), int(n_bytes[buffer])))
        return result


def walk(change, order: list[int]) -> Walked:
    """The liveness walk over ``order`` (simulate.replay's rules): each tensor's buffer, and when each buffer is
    allocated and freed. Every output allocates a buffer of its own unless it shares an input's (:func:`shares`);
    a buffer is freed after the step of its last reader, or at once where nobody reads it."""
    import numpy as np

    first, flat_bytes, sharing, nodes = change.first, change.flat_bytes, change.shares, change.nodes
    data, changed = change.flat_data, change.flat_inputs
    count = len(flat_bytes)  # the tensors, and the one outside the graph (last: -1)
    buffer_of = list(range(count))
    remaining = list(change.readers)  # each buffer's reads still to come
    freed = [-1] * count
    in_place: dict[int, list[tuple[int, int]]] = {}
    get = changed.get
    for step, position in enumerate(order):
        inputs = get(position)
        if inputs is None:
            inputs = data[position]
        share = sharing[position]
        if share is not None:  # an output may take an input's buffer: an aliased input's, or one taken in place
            alias, in_place_too = share
            start = first[position]
            for tensor in range(start, first[position + 1]):
                index, buffer = tensor - start, -1
                if alias is not None:
                    aliased = (inputs[index] if index < len(inputs) else -1) if alias == -1 else \
                        (inputs[alias] if index == 0 and alias < len(inputs) else -1)
                    if aliased >= 0:
                        buffer = buffer_of[aliased]
                if buffer < 0 and in_place_too and index == 0 and flat_bytes[tensor] > 0:
                    for source in inputs:  # same size, its one read left this node's (reads are counted per input)
                        if source >= 0 and remaining[buffer_of[source]] == 1 and \
                                flat_bytes[buffer_of[source]] == flat_bytes[tensor]:
                            buffer = buffer_of[source]
                            in_place.setdefault(buffer, []).append((step, tensor))
                            break
                if buffer >= 0:
                    buffer_of[tensor] = buffer
                    remaining[buffer] += remaining[tensor]
        for tensor in inputs:
            buffer = buffer_of[tensor]
            left = remaining[buffer] - 1
            remaining[buffer] = left
            if not left:
                freed[buffer] = step
    tensors = count - 1
    step_of = np.full(len(nodes), -1, dtype=np.int64)
    step_of[np.asarray(order, dtype=np.int64)] = np.arange(len(order), dtype=np.int64)
    allocated = np.repeat(step_of, np.diff(np.asarray(first, dtype=np.int64)))
    owned = (np.asarray(buffer_of[:tensors]) == np.arange(tensors)) & (allocated >= 0)
    freed_at = np.asarray(freed[:tensors], dtype=np.int64)
    unread = np.asarray(change.readers[:tensors], dtype=np.int64) == 0
    freed_at = np.where(freed_at >= 0, freed_at, np.where(unread, allocated, len(order)))
    return Walked(owned, allocated, freed_at, len(order), in_place)
