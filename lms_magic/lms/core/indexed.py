"""The replay's engine: a graph numbered once, replayed many times with a few of its nodes changed.

A plan search replays one graph some forty times, each time with other swaps undone: a few dozen of its
20,000 nodes removed and their readers reading another tensor. :class:`IndexedGraph` numbers the nodes and
their edges once; each replay then rebuilds only what the change touches (the readers of the removed
nodes) and walks the graph with integers (``core/walk.py``). Its results are those of ``simulate.replay`` on
the changed node list, to the byte and the order (the tests compare the two on every change, and the order and
walk with ones written plainly: tests/lms/core/reference_walk.py).

Example:
    >>> graph = IndexedGraph([Node("x", (100,)), Node("copy", (100,), (("x", 0),)),
    ...                       Node("y", (10,), (("copy", 0),))])
    >>> graph.replay().peak_bytes, graph.replay(substitute={"copy": ("x", 0)}).peak_bytes
    (200, 110)
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort
from itertools import chain
from dataclasses import dataclass, field

from .walk import shares, walk


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
_OUTSIDE_READS = 1 << 62  # the reads left of what inputs from outside the graph read: never all done


class IndexedGraph:
    """``nodes`` numbered once, for replays of the graph and of the graph with some nodes removed.

    Args:
        nodes: the graph, names unique.

    Its state (16 attributes) is the graph read once into flat lists by node number (names, inputs, control
    inputs, priorities, predecessors, users, sizes, shares, readers), each kept because every replay walks them:
    a plan search replays the graph again for each count of tensors it tries.
    """

    def __init__(self, nodes: list[Node]):
        self.nodes = list(nodes)
        self._names = [node.name for node in self.nodes]
        self.index = {name: position for position, name in enumerate(self._names)}
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
        """The walk's flat arrays: each tensor numbered (node by node, output by output), its device bytes and
        data readers; each node's first tensor number, its inputs' numbers and whether it may share an input's
        buffer (aliasing or in place)."""
        if self._walked:
            return
        self._device_bytes = device_bytes_of(self.nodes)
        self._first = _firsts(self._device_bytes, 0)
        self._flat_bytes = [n_bytes for sizes in self._device_bytes for n_bytes in sizes]
        self._flat_data = [_numbered(inputs, self._first) for inputs in self._data]
        self._shares = [shares(node) for node in self.nodes]
        self._readers = [0] * len(self._flat_bytes)  # tensor -> how many data inputs read it
        for inputs in self._flat_data:
            for tensor in inputs:
                if tensor >= 0:
                    self._readers[tensor] += 1
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
        if resized is not None and (not explain or len(resized) != len(change.nodes)):
            raise ValueError("resized: the bytes of every node's outputs, the added ones' too, with explain=True")
        walked = walk(change, order)
        live = walked.live_bytes(change.flat_bytes, persistent_bytes)
        peak_step = int(live.argmax()) if len(live) and live.max() > persistent_bytes else -1
        names = list(map((self._names + [node.name for node in added] if added else self._names).__getitem__, order))
        result = Replay(peak_bytes=int(live[peak_step]) if peak_step >= 0 else persistent_bytes,
                        peak_after=names[peak_step] if peak_step >= 0 else None, order=names)
        if explain:
            result.live_bytes = live.tolist()
            result.live_at_peak = walked.at_peak(change, peak_step)
        if resized is not None:
            result.resized_live_bytes = walked.live_bytes([*chain.from_iterable(resized), 0], persistent_bytes).tolist()
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
        waiting, priority = change.waiting, change.priority
        users = self._users + [[]] * (len(change.nodes) - len(self.nodes))
        for position, changed in change.users.items():
            users[position] = changed
        ready = [(priority[p], p, p) for p, count in enumerate(waiting) if count == 0]
        heapq.heapify(ready)
        readied, order = 0, []
        append = order.append
        pop, push = heapq.heappop, heapq.heappush
        following = None  # the node next: readied by the last one, below every other ready (a chain skips the heap)
        while following is not None or ready:
            position = pop(ready)[2] if following is None else following
            append(position)
            last = None
            for user in users[position]:
                left = waiting[user] - 1
                waiting[user] = left
                if not left:
                    readied += 1
                    if last is not None:
                        push(ready, last)
                    last = (priority[user], -readied, user)
            following = None
            if last is not None:
                if not ready or last < ready[0]:
                    following = last[2]
                else:
                    push(ready, last)
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
        """The walk's flat arrays (``IndexedGraph._walk_arrays``) of the graph as changed, each with one more
        tensor at the end: what an input from outside the graph (numbered -1) reads, never freed."""
        added_bytes = device_bytes_of(added)
        self.first = graph._first[:-1] + _firsts(added_bytes, graph._first[-1]) if added else graph._first
        self.flat_bytes = graph._flat_bytes + [n_bytes for sizes in added_bytes for n_bytes in sizes] + [0]
        self.shares = graph._shares + [shares(node) for node in added] if added else graph._shares
        self.flat_data = graph._flat_data
        self.flat_inputs = {position: _numbered([(-1, output) if source in removed else (source, output)
                                                 for source, output in inputs], self.first)
                            for position, inputs in self.inputs.items()}  # a removed node's output: as outside
        added_tensors = len(self.flat_bytes) - 1 - len(graph._readers)
        self.readers = readers = graph._readers + [0] * added_tensors + [_OUTSIDE_READS]
        for position in (*removed, *(p for p in self.inputs if p < base)):
            for tensor in graph._flat_data[position]:
                if tensor >= 0:
                    readers[tensor] -= 1
        for position, inputs in self.flat_inputs.items():
            for tensor in inputs:
                if tensor >= 0:
                    readers[tensor] += 1

    def node_of(self, tensor: int) -> int:
        """The position of the node whose output ``tensor`` (a flat number) is."""
        return bisect_right(self.first, tensor) - 1

    def _users_of(self, graph: IndexedGraph, source: int) -> list[int]:
        if source not in self.users:
            self.users[source] = list(graph._users[source])
        return self.users[source]


def device_bytes_of(nodes: list[Node]) -> list[tuple[int, ...]]:
    """The bytes each node's outputs hold on the device (0 for a node off it)."""
    return [node.outputs if node.on_device else (0,) * len(node.outputs) for node in nodes]


def _firsts(device_bytes: list[tuple[int, ...]], first: int) -> list[int]:
    """Each node's first tensor number, from ``first``, and the number after the last."""
    firsts = [first]
    for sizes in device_bytes:
        firsts.append(firsts[-1] + len(sizes))
    return firsts


def _numbered(inputs, first: list[int]) -> tuple[int, ...]:
    """(node position, output index) inputs as tensor numbers; -1 for one from outside the graph."""
    return tuple(first[source] + output if 0 <= source < len(first) - 1 and output < first[source + 1] - first[source]
                 else -1 for source, output in inputs)
