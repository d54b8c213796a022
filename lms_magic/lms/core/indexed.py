"""The replay's engine: a graph numbered once, replayed many times with a few of its nodes changed.

A plan search replays one graph some forty times, each time with other swaps undone: a few dozen of its
20,000 nodes removed and their readers reading another tensor. :class:`IndexedGraph` numbers the nodes and
their edges once; each replay then rebuilds only what the change touches (the readers of the removed
nodes) and walks the graph with integers. Its results are those of ``simulate.replay`` on the changed node
list, to the byte and the order (the tests compare the two on every change).

Example:
    >>> graph = IndexedGraph([Node("x", (100,)), Node("copy", (100,), (("x", 0),)),
    ...                       Node("y", (10,), (("copy", 0),))])
    >>> graph.replay().peak_bytes, graph.replay(substitute={"copy": ("x", 0)}).peak_bytes
    (200, 110)
"""

from __future__ import annotations

import heapq
from bisect import insort
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Node:
    """One op of a graph, as the replay needs it.

    Args:
        name: unique name.
        outputs: bytes of each output (0 for outputs that hold no new memory).
        inputs: (node name, output index) of each data input.
        control_inputs: names of nodes that must run first.
        on_device: whether its outputs live in the accelerator's memory.
        alias_input: the position of the input whose buffer output 0 shares,
            -1 when every output i shares input i's buffer (``IdentityN``), or
            None. Defaults to None.
        priority: tie-break among ready nodes (lower runs first), such as the
            program order. Defaults to 0.
    """

    name: str
    outputs: tuple[int, ...] = ()
    inputs: tuple[tuple[str, int], ...] = ()
    control_inputs: tuple[str, ...] = ()
    on_device: bool = True
    alias_input: int | None = None
    priority: float = 0.0
    forwards_input: bool = False


@dataclass
class Replay:
    """What a replay found: the peak, where it happened, and the order used.

    ``live_at_peak`` (with ``replay(..., explain=True)``) holds, for each
    device buffer live at the peak, the tensor that last wrote it
    ((producer name, output index)) and its bytes; with ``persistent_bytes``
    they add up to ``peak_bytes``. ``live_bytes`` (with ``explain=True``) is
    the device memory live after each node of ``order`` allocated its outputs
    (``persistent_bytes`` included): the step's memory timeline.
    """

    peak_bytes: int
    peak_after: str | None
    order: list[str] = field(default_factory=list)
    live_at_peak: list[tuple[tuple[str, int], int]] | None = None
    live_bytes: list[int] | None = None
    # with replay(..., resized=...): the bytes live after each step of ``order`` with the nodes' outputs resized
    resized_live_bytes: list[int] | None = None


class GraphCycleError(ValueError):
    """The graph's edges form a cycle, so no execution order exists."""


_GONE = -(10**9)  # the waiting count of a removed node: never ready, however many of its inputs run


class IndexedGraph:
    """``nodes`` numbered once, for replays of the graph and of the graph with some nodes removed.

    Args:
        nodes: the graph, names unique.
    """

    def __init__(self, nodes: list[Node]):
        self.nodes = list(nodes)
        self.index = {node.name: position for position, node in enumerate(self.nodes)}
        get = self.index.get
        self._data = data = [tuple([(get(name, -1), output) for name, output in node.inputs]) for node in self.nodes]
        self._control = control = [tuple([get(name, -1) for name in node.control_inputs]) for node in self.nodes]
        self._priority = [node.priority for node in self.nodes]
        self._preds = preds = []
        self._users: list[list[int]] = [[] for _ in self.nodes]  # each in node order: the executor's tie-break
        users = self._users
        for position, inputs in enumerate(data):
            sources = {source for source, _ in inputs}
            sources.update(control[position])
            sources.discard(-1)
            preds.append(sources)
            for source in sources:
                users[source].append(position)
        self._waiting = [len(sources) for sources in preds]
        self._walked = False  # the walk's arrays, made at the first replay (an execution order needs none)

    def _walk_arrays(self) -> None:
        """Each node's output keys, device bytes and whether it may share an input's buffer, and each tensor's
        readers: what the liveness walk reads."""
        if self._walked:
            return
        self._outputs, self._device_bytes, self._shares = _walk_fields(self.nodes, 0)
        self._readers: dict[tuple[int, int], int] = {}  # (node, output) -> how many data inputs read it
        readers = self._readers
        for inputs in self._data:
            for key in inputs:
                if key[0] >= 0:
                    readers[key] = readers.get(key, 0) + 1
        self._walked = True

    def replay(self, persistent_bytes: int = 0, explain: bool = False,
               substitute: dict[str, tuple[str, int]] | None = None, added: list[Node] = (),
               rewired: dict[str, dict[tuple[str, int], tuple[str, int]]] | None = None,
               resized: list[tuple[int, ...]] | None = None) -> Replay:
        """The replay of the graph (as ``simulate.replay``), changed: each node named in ``substitute`` removed
        and its readers reading the tensor it maps to instead (any output of the removed node); the ``added``
        nodes after the graph's; each node named in ``rewired`` reading, for each tensor in its mapping, the
        tensor it maps to.

        ``resized`` (with ``explain``): the device bytes of each output of the graph's nodes and the added ones,
        in their order, at other sizes (the same step at another batch size, as :meth:`device_bytes`):
        ``Replay.resized_live_bytes`` then has the bytes live after each step with those sizes, the order,
        buffers and frees kept (what two replays give where no in-place choice changes with the sizes:
        ``core/batch_lines.py``).
        """
        self._walk_arrays()
        change = _Change(self, substitute or {}, list(added), rewired or {})
        order = self._order(change)
        peak, peak_step, live_bytes, buffers, spans = _walk(change, order, persistent_bytes, explain)
        names = [change.nodes[position].name for position in order]
        result = Replay(peak_bytes=peak, peak_after=names[peak_step] if peak_step >= 0 else None, order=names)
        if explain:
            result.live_bytes = live_bytes
            result.live_at_peak = [((change.nodes[writer[0]].name, writer[1]), n_bytes) for writer, n_bytes in buffers]
        if resized is not None:
            if not explain or len(resized) != len(change.nodes):
                raise ValueError("resized: the bytes of every node's outputs, the added ones' too, with explain=True")
            result.resized_live_bytes = _live_bytes(spans, resized, len(order), persistent_bytes)
        return result

    def device_bytes(self) -> list[tuple[int, ...]]:
        """The bytes each node's outputs hold on the device (0 for a node off it), in node order."""
        self._walk_arrays()
        return self._device_bytes

    def order(self) -> list[int]:
        """The positions of the nodes in execution order (``simulate.execution_order``'s rule).

        Raises:
            GraphCycleError: the edges form a cycle (the message names a node in it).
        """
        return self._order(_Change(self, {}, [], {}, walk=False))

    def _order(self, change: _Change) -> list[int]:
        """The execution order (``simulate.execution_order``'s rule) of the graph as changed."""
        waiting, priority, users = change.waiting, change.priority, change.users
        ready = [(priority[p], p, p) for p, count in enumerate(waiting) if count == 0]
        heapq.heapify(ready)
        readied, order, base_users = 0, [], self._users
        pop, push = heapq.heappop, heapq.heappush
        while ready:
            position = pop(ready)[2]
            order.append(position)
            changed = users.get(position)
            for user in base_users[position] if changed is None else changed:
                waiting[user] -= 1
                if waiting[user] == 0:
                    readied += 1
                    push(ready, (priority[user], -readied, user))
        if len(order) != len(change.nodes) - len(change.removed):
            ordered = set(order)
            stuck = next(node.name for p, node in enumerate(change.nodes) if p not in change.removed and p not in ordered)
            raise GraphCycleError(f"the graph has a cycle through {stuck!r}")
        return order


class _Change:
    """One replay's graph: the indexed graph's arrays, copied where the change touches them."""

    def __init__(self, graph: IndexedGraph, substitute: dict, added: list[Node], rewired: dict, walk: bool = True):
        base = len(graph.nodes)
        index = graph.index
        added_index = {node.name: base + offset for offset, node in enumerate(added)}

        def get(name: str) -> int:
            position = index.get(name)
            return added_index.get(name, -1) if position is None else position

        self.nodes = graph.nodes + added if added else graph.nodes
        self.removed = removed = {index[name] for name in substitute if name in index}
        by_removed = {index[name]: (get(target[0]), target[1]) for name, target in substitute.items() if name in index}
        moved = {index[name]: {(get(tensor[0]), tensor[1]): (get(new[0]), new[1]) for tensor, new in mapping.items()}
                 for name, mapping in rewired.items() if name in index}
        affected = {user for gone in removed for user in graph._users[gone] if user not in removed} | set(moved)
        self.inputs: dict[int, tuple] = {}  # position -> its data inputs, where changed (and the added nodes')
        for user in affected:
            mapping = moved.get(user, {})
            self.inputs[user] = tuple(by_removed.get(source, (-1, output)) if source in removed else
                                      mapping.get((source, output), (source, output))
                                      for source, output in graph._data[user])
        controls = {}
        for offset, node in enumerate(added):
            self.inputs[base + offset] = tuple((get(name), output) for name, output in node.inputs)
            controls[base + offset] = tuple(get(name) for name in node.control_inputs)
        self.data = graph._data
        self.priority = graph._priority + [node.priority for node in added] if added else graph._priority
        self.waiting = graph._waiting + [0] * len(added)
        self.users: dict[int, list[int]] = {base + offset: [] for offset in range(len(added))}  # changed lists
        for gone in removed:
            self.waiting[gone] = _GONE
        for position, data in self.inputs.items():
            preds = {source for source, _ in data}
            preds.update(controls[position] if position >= base else graph._control[position])
            preds.discard(-1)
            preds -= removed
            self.waiting[position] = len(preds)
            before = graph._preds[position] if position < base else set()
            for source in before - preds - removed:
                self._users_of(graph, source).remove(position)
            for source in preds - before:
                insort(self._users_of(graph, source), position)
        if walk:
            self._walk_arrays(graph, base, added, removed)

    def _walk_arrays(self, graph: IndexedGraph, base: int, added: list[Node], removed: set[int]) -> None:
        """The walk's arrays (``IndexedGraph._walk_arrays``) of the graph as changed."""
        outputs, device_bytes, shares = _walk_fields(added, base)
        self.outputs, self.device_bytes, self.shares = (graph._outputs + outputs, graph._device_bytes + device_bytes,
                                                        graph._shares + shares)
        self.readers = graph._readers
        if self.inputs or removed:
            self.readers = readers = dict(graph._readers)
            for position in (*removed, *(p for p in self.inputs if p < base)):
                for key in graph._data[position]:
                    if key[0] >= 0:
                        readers[key] -= 1
            for data in self.inputs.values():
                for key in data:
                    if key[0] >= 0 and key[0] not in removed:
                        readers[key] = readers.get(key, 0) + 1

    def _users_of(self, graph: IndexedGraph, source: int) -> list[int]:
        if source not in self.users:
            self.users[source] = list(graph._users[source])
        return self.users[source]


def _walk_fields(nodes: list[Node], first: int) -> tuple[list, list, list]:
    """For ``nodes`` numbered from ``first``: each one's output keys, the bytes each output holds on the device,
    and whether it may share an input's buffer (aliasing or in place)."""
    return ([tuple([(first + offset, index) for index in range(len(node.outputs))]) for offset, node in enumerate(nodes)],
            [node.outputs if node.on_device else (0,) * len(node.outputs) for node in nodes],
            [node.alias_input is not None or (node.forwards_input and node.on_device) for node in nodes])


def _walk(change: _Change, order, persistent_bytes, explain):
    """The liveness walk over ``order`` (simulate.replay's rules). Returns the peak, the step it happened
    at, the live bytes after each step (explain), the buffers live at the peak as (last writer, bytes) and each
    buffer's (step allocated, step freed, first writer) (explain)."""
    data, outputs, device_bytes, shares, nodes = change.data, change.outputs, change.device_bytes, change.shares, change.nodes
    changed, readers = change.inputs, change.readers
    buffer_of: dict[tuple[int, int], int] = {}
    buffer_bytes: list[int] = []
    buffer_readers: list[int] = []
    live = peak = persistent_bytes
    peak_step = -1
    allocated_at: list[int] = []
    freed_at: list[int] = []
    writers: dict[int, list[tuple[int, tuple[int, int]]]] = {}
    live_bytes: list[int] = []
    end = len(order)
    get_buffer, get_readers = buffer_of.get, readers.get
    for step, position in enumerate(order):
        inputs = changed.get(position)
        if inputs is None:
            inputs = data[position]
        new_buffers = []
        for key, n_bytes in zip(outputs[position], device_bytes[position]):
            buffer = _shared(nodes[position], key[1], n_bytes, inputs, buffer_of, buffer_bytes,
                             buffer_readers) if shares[position] else None
            if buffer is not None and explain and buffer < 0:  # an in-place kernel: the buffer now holds this output
                buffer = -buffer - 1
                writers.setdefault(buffer, []).append((step, key))
            elif buffer is not None and buffer < 0:
                buffer = -buffer - 1
            if buffer is None:
                buffer = len(buffer_bytes)
                buffer_bytes.append(n_bytes)
                buffer_readers.append(0)
                live += n_bytes
                new_buffers.append(buffer)
                if explain:
                    allocated_at.append(step)
                    freed_at.append(end)
                    writers[buffer] = [(step, key)]
            buffer_of[key] = buffer
            buffer_readers[buffer] += get_readers(key, 0)
        if explain:
            live_bytes.append(live)
        if live > peak:
            peak, peak_step = live, step
        for source in inputs:
            buffer = get_buffer(source)
            if buffer is None:
                continue
            buffer_readers[buffer] -= 1
            if buffer_readers[buffer] == 0:
                live -= buffer_bytes[buffer]
                if explain:
                    freed_at[buffer] = step
        for buffer in new_buffers:  # outputs nobody reads are freed at once
            if buffer_readers[buffer] == 0:
                live -= buffer_bytes[buffer]
                buffer_readers[buffer] = -1
                if explain:
                    freed_at[buffer] = step
    at_peak = []
    if explain:  # a buffer freed at the peak's step was live when the peak was counted
        at_peak = [(max((w for w in writers[buffer] if w[0] <= peak_step), key=lambda w: w[0])[1], buffer_bytes[buffer])
                   for buffer in range(len(buffer_bytes))
                   if buffer_bytes[buffer] and allocated_at[buffer] <= peak_step <= freed_at[buffer]]
    spans = [(allocated_at[buffer], freed_at[buffer], writers[buffer][0][1]) for buffer in range(len(buffer_bytes))] \
        if explain else []
    return peak, peak_step, live_bytes, at_peak, spans


def _live_bytes(spans, device_bytes, steps: int, persistent_bytes: int) -> list[int]:
    """The bytes live after each of ``steps`` steps, each buffer of ``spans`` (step allocated, step freed, first
    writer) holding its first writer's ``device_bytes`` from its allocation to its freeing, both included."""
    import numpy as np

    count = len(spans)
    allocated = np.fromiter((span[0] for span in spans), dtype=np.int64, count=count)
    freed = np.minimum(np.fromiter((span[1] for span in spans), dtype=np.int64, count=count), steps - 1) + 1
    n_bytes = np.fromiter((device_bytes[position][index] for _, _, (position, index) in spans), dtype=np.int64,
                          count=count)
    change = np.zeros(steps + 1, dtype=np.int64)
    np.add.at(change, allocated, n_bytes)
    np.subtract.at(change, freed, n_bytes)
    return (np.cumsum(change[:steps]) + persistent_bytes).tolist()


def _shared(node: Node, index: int, n_bytes: int, inputs, buffer_of, buffer_bytes, buffer_readers) -> int | None:
    """The buffer output ``index`` shares: an aliased input's (its number), or an input's that an in-place
    kernel takes over (same size, read by this node alone: ``-number - 1``); None for a new buffer."""
    alias = node.alias_input
    if alias is not None:
        aliased = (inputs[index] if index < len(inputs) else None) if alias == -1 else \
            (inputs[alias] if index == 0 and alias < len(inputs) else None)
        buffer = buffer_of.get(aliased) if aliased is not None else None
        if buffer is not None:
            return buffer
    if index == 0 and node.forwards_input and node.on_device:
        for source in inputs:
            buffer = buffer_of.get(source)
            if buffer is not None and buffer_readers[buffer] == 1 and buffer_bytes[buffer] == n_bytes > 0 \
                    and inputs.count(source) == 1:
                return -buffer - 1
    return None
