"""Liveness replay: the device memory a graph needs, op by op (pure Python).

A graph is a list of :class:`Node`. The replay walks the nodes in an order
consistent with their data and control edges, allocates each node's outputs
when it runs, and frees a buffer once the last node that reads it has run
(reference counting, as TensorFlow's executor does). Nodes that only pass a
buffer through (``Identity``, ``Reshape``...) share their input's buffer.
Only nodes in the accelerator role count toward the peak.

Example:
    >>> nodes = [
    ...     Node("x", outputs=(100,)),
    ...     Node("y", outputs=(50,), inputs=(("x", 0),)),
    ...     Node("z", outputs=(10,), inputs=(("y", 0),)),
    ... ]
    >>> replay(nodes).peak_bytes  # x and y live together, then y and z
    150
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from dataclasses import dataclass
from typing import Iterator

from .indexed import GraphCycleError, IndexedGraph, Node, Replay  # noqa: F401 (re-exported: the replay's words)
from .indexed import device_bytes_of


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for one walk over a graph.

    A replay makes and drops some 100,000 small acyclic objects; with the
    collector on, those alive at a collection are promoted, and every dozen
    replays a full collection walks the whole process, which costs more than
    the replay itself once TensorFlow and Keras hold some 100,000s of objects.
    Off, they are freed by reference counting and never promoted. The same
    holds for ordering a graph in a process that has run many fits.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def execution_order(nodes: list[Node]) -> list[Node]:
    """A topological order of ``nodes``, as TensorFlow's executor tends to run them.

    Among ready nodes the lowest priority (program order) runs first; among
    equal priorities, the node that became ready last (the executor runs a
    finished op's successor inline, depth first). Edges to names that are not
    in ``nodes`` are ignored (inputs from outside).

    Raises:
        GraphCycleError: the edges form a cycle (the message names a node in it).
    """
    with collector_paused():
        graph = IndexedGraph(nodes)
        return [graph.nodes[position] for position in graph.order()]


STEP_START = 10.0**12  # how far before every program position a node that is ready from the start runs
_JUST_AFTER = 1e-6  # how far after its latest input a node that runs as soon as it is ready runs


def as_soon_as_ready(nodes: list[Node], step_inputs: set[str], after: float | None = None) -> list[Node]:
    """``nodes`` where a dataflow executor runs them: as soon as their inputs are ready, not in program order.

    The replay runs the lowest program position among the ready nodes, which is how the forward and backward
    passes run. Two kinds of ops an executor runs earlier: those that no step input reaches (by data or
    control edges), which depend only on the weights and the optimizer state (SGD's ``momentum * velocity``, a
    weight cast to float16), run at the step's start and are held until their readers run; and those placed
    after program position ``after`` (the optimizer's updates), each run right after its latest input, so that
    a weight's gradient is applied, and freed, while the backward pass goes on.

    Example:
        >>> nodes = [Node("x", (100,)), Node("y", (100,), (("x", 0),), priority=1), Node("v", (0,)),
        ...          Node("dy", (30,), (("y", 0),), priority=2), Node("dx", (100,), (("dy", 0), ("x", 0)), priority=3),
        ...          Node("momentum", (40,), (("v", 0),), priority=4),
        ...          Node("update", (40,), (("momentum", 0), ("dy", 0)), priority=5)]
        >>> [node.name for node in execution_order(as_soon_as_ready(nodes, {"x"}, after=3))]
        ['v', 'momentum', 'x', 'y', 'dy', 'update', 'dx']
        >>> replay(nodes).peak_bytes, replay(as_soon_as_ready(nodes, {"x"}, after=3)).peak_bytes
        (230, 270)
    """
    users: dict[str, list[str]] = {}
    for node in nodes:
        for source in {name for name, _ in node.inputs} | set(node.control_inputs):
            users.setdefault(source, []).append(node.name)
    reached, frontier = set(step_inputs), list(step_inputs)
    while frontier:
        for user in users.get(frontier.pop(), ()):
            if user not in reached:
                reached.add(user)
                frontier.append(user)
    moved = [node if node.name in reached else dataclasses.replace(node, priority=node.priority - STEP_START)
             for node in nodes]
    if after is None:
        return moved
    priority = {node.name: node.priority for node in moved}
    for node in execution_order(moved):  # a node's inputs are placed before it
        if node.priority > after:
            sources = [name for name, _ in node.inputs] + list(node.control_inputs)
            priority[node.name] = max((priority[name] for name in sources if name in priority),
                                      default=node.priority) + _JUST_AFTER
    return [node if priority[node.name] == node.priority else dataclasses.replace(node, priority=priority[node.name])
            for node in moved]


def replay(nodes: list[Node], persistent_bytes: int = 0, explain: bool = False) -> Replay:
    """Replays ``nodes`` and returns the peak device memory.

    Args:
        nodes: the graph.
        persistent_bytes: memory held throughout (weights, optimizer state),
            added to every point of the replay. Defaults to 0.
        explain: also list the buffers live at the peak (``Replay.live_at_peak``).
            Defaults to False.

    Example:
        >>> nodes = [Node("x", (100,)), Node("y", (50,), (("x", 0),)), Node("z", (10,), (("y", 0),))]
        >>> replay(nodes, explain=True).live_at_peak
        [(('x', 0), 100), (('y', 0), 50)]
    """
    with collector_paused():
        return IndexedGraph(nodes).replay(persistent_bytes, explain)


@dataclass(frozen=True)
class Swap:
    """A planned swap, for predicting its effect before the graph is rewritten.

    Args:
        tensor: (producer name, output index).
        consumers: names of the nodes that will read the swapped-in copy.
        trigger: the node the swap-in waits for.
        nbytes: the tensor's size.
    """

    tensor: tuple[str, int]
    consumers: tuple[str, ...]
    trigger: str
    nbytes: int


def with_swaps(nodes: list[Node], swaps: list[Swap]) -> list[Node]:
    """``nodes`` with each swap added: a host copy after the producer, and a
    device copy (the swap-in) after the trigger that the consumers read instead.

    Example:
        >>> graph = [Node("a", (100,), priority=0), Node("b", (1,), (("a", 0),), priority=1),
        ...          Node("c", (50,), (("b", 0),), priority=2), Node("e", (50,), (("c", 0),), priority=3),
        ...          Node("d", (0,), (("e", 0), ("a", 0)), priority=4)]
        >>> replay(graph).peak_bytes, replay(with_swaps(graph, [Swap(("a", 0), ("d",), "e", 100)])).peak_bytes
        (200, 150)
    """
    by_name = {node.name: node for node in nodes}
    extra, rewired = _swap_nodes(swaps, lambda name: by_name[name].priority if name in by_name else 0.0)
    result = []
    for node in nodes:
        if node.name in rewired:
            mapping = rewired[node.name]
            node = Node(node.name, node.outputs, tuple(mapping.get(s, s) for s in node.inputs), node.control_inputs,
                        node.on_device, node.alias_input, node.priority, node.forwards_input)
        result.append(node)
    return result + extra


def replay_with_swaps(graph: IndexedGraph, swaps: list[Swap], persistent_bytes: int = 0,
                      explain: bool = False, resized: tuple[IndexedGraph, list[Swap]] | None = None) -> Replay:
    """``replay(with_swaps(graph.nodes, swaps))``, on a graph numbered once: what a search over many sets of
    swaps of one step replays. ``resized`` (with ``explain``): the same graph at other sizes (the step at another
    batch size: the same names, numbered alike) and the same swaps there: the replay's ``resized_live_bytes``
    are its live bytes there (``IndexedGraph.replay``).

    Raises:
        ValueError: ``resized``'s graph or swaps are not this one's at other sizes.

    Example:
        >>> graph = IndexedGraph([Node("a", (100,), priority=0), Node("b", (1,), (("a", 0),), priority=1),
        ...                       Node("c", (50,), (("b", 0),), priority=2), Node("e", (50,), (("c", 0),), priority=3),
        ...                       Node("d", (0,), (("e", 0), ("a", 0)), priority=4)])
        >>> replay_with_swaps(graph, []).peak_bytes, replay_with_swaps(graph, [Swap(("a", 0), ("d",), "e", 100)]).peak_bytes
        (200, 150)
    """
    index, nodes = graph.index, graph.nodes
    extra, rewired = _swap_nodes(swaps, lambda name: nodes[index[name]].priority if name in index else 0.0)
    if resized is not None:
        other, other_swaps = resized
        other_extra = _swap_nodes(other_swaps, lambda name: 0.0)[0]
        if other.index != graph.index or [node.name for node in other_extra] != [node.name for node in extra]:
            raise ValueError("resized: the same graph and swaps at other sizes (the same names, in the same order)")
        resized = other.device_bytes() + device_bytes_of(other_extra)
    return graph.replay(persistent_bytes, explain, added=extra, rewired=rewired, resized=resized)


def _swap_nodes(swaps: list[Swap], priority_of) -> tuple[list[Node], dict[str, dict]]:
    """Each swap's host copy, swap-in and device copy, and the consumers' inputs it rewires (consumer -> {tensor:
    the device copy})."""
    rewired: dict[str, dict] = {}
    extra: list[Node] = []
    for swap in swaps:
        producer, index = swap.tensor
        label = f"{producer}:{index}"
        out_name, in_name, copy_name = f"{label}/swap_out", f"{label}/swap_in", f"{label}/device_copy"
        trigger_priority = priority_of(swap.trigger)
        extra += [
            Node(out_name, (swap.nbytes,), (swap.tensor,), on_device=False, priority=priority_of(producer)),
            Node(in_name, (swap.nbytes,), ((out_name, 0),), (swap.trigger,), on_device=False, priority=trigger_priority),
            Node(copy_name, (swap.nbytes,), ((in_name, 0),), on_device=True, priority=trigger_priority),
        ]
        for consumer in swap.consumers:
            rewired.setdefault(consumer, {})[swap.tensor] = (copy_name, 0)
    return extra, rewired
