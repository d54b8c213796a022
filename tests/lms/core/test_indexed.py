"""The replay's engine (core/indexed.py: numbered once, flat, heap-ordered) with nodes removed and their readers
rewired, swaps added and sizes changed, against the walk written plainly (reference_walk.py) of the changed graph
built from scratch: a plan search's forty replays must give what forty plain walks would."""

import random

import pytest

from lms_magic.lms.core.indexed import IndexedGraph
from lms_magic.lms.core.simulate import GraphCycleError, Node
from tests.lms.core.reference_walk import reference_replay


def swapped_graph(seed: int, size: int = 80):
    """A graph with swap-ins (device copies of earlier tensors, gated on a later node) that readers read,
    aliasing and in-place nodes, control edges, inputs from outside and priorities with ties; and, per
    swap-in, the tensor it brings back."""
    rng = random.Random(seed)
    nodes, origins = [], {}
    for index in range(size):
        name = f"n{index}"
        if index > 4 and rng.random() < 0.25:  # a swap-in of an earlier tensor, after a trigger
            source, trigger = rng.sample(range(index), 2)
            nodes.append(Node(name, (rng.choice([64, 512]),), (), (f"n{trigger}",), priority=index))
            origins[name] = (f"n{source}", 0)
            continue
        sources = rng.sample(range(index), k=min(index, rng.randint(0, 3)))
        inputs = tuple((f"n{s}", 0) for s in sources) + ((("outside", 0),) if rng.random() < 0.1 else ())
        controls = tuple(f"n{s}" for s in rng.sample(range(index), k=min(index, rng.randint(0, 1))))
        nodes.append(Node(name, tuple(rng.choice([0, 8, 64, 512]) for _ in range(rng.choice([1, 1, 2]))), inputs,
                          controls, on_device=rng.random() > 0.1, priority=rng.randint(0, size // 2),
                          alias_input=rng.choice([None, None, None, 0, -1]) if inputs else None,
                          forwards_input=rng.random() < 0.3))
    return nodes, origins


def changed_from_scratch(nodes, substitute):
    kept = [node for node in nodes if node.name not in substitute]
    return [Node(node.name, node.outputs, tuple(substitute.get(name, (name, index)) for name, index in node.inputs),
                 node.control_inputs, node.on_device, node.alias_input, node.priority, node.forwards_input)
            for node in kept]


@pytest.mark.parametrize("seed", range(40))
def test_a_replay_with_swaps_undone_is_the_changed_graph_replayed(seed):
    nodes, origins = swapped_graph(seed)
    graph = IndexedGraph(nodes)
    rng = random.Random(seed)
    for _ in range(5):  # several changes of one numbered graph, as a search makes them
        undone = {name: origin for name, origin in origins.items() if rng.random() < 0.5}
        _same_replay(graph.replay(persistent_bytes=7, explain=True, substitute=undone),
                     reference_replay(changed_from_scratch(nodes, undone), 7))
    _same_replay(graph.replay(explain=True), reference_replay(nodes))  # and the graph as it is, after those changes


def test_undoing_a_swap_holds_the_tensor_on_the_device_until_its_reader():
    nodes = [Node("x", (100,), priority=0), Node("y", (50,), (("x", 0),), priority=1),
             Node("z", (200,), (("y", 0),), priority=2), Node("x_back", (100,), (), ("z",), priority=3),
             Node("dx", (10,), (("x_back", 0), ("z", 0)), priority=4)]
    graph = IndexedGraph(nodes)
    assert graph.replay().peak_bytes == 310  # x freed after y, brought back beside z
    undone = graph.replay(substitute={"x_back": ("x", 0)})
    assert (undone.peak_bytes, undone.order) == (350, ["x", "y", "z", "dx"])  # x held beside y and z


def test_a_cycle_is_reported_by_name():
    nodes = [Node("a", (1,), (("c", 0),)), Node("b", (1,), (("a", 0),)), Node("c", (1,), (("b", 0),))]
    with pytest.raises(GraphCycleError, match="cycle through 'a'"):
        IndexedGraph(nodes).order()


@pytest.mark.parametrize("seed", range(30))
def test_a_replay_with_swaps_added_is_the_swapped_graph_replayed(seed):
    from lms_magic.lms.core.simulate import Swap, replay_with_swaps, with_swaps

    nodes, _ = swapped_graph(seed)
    graph = IndexedGraph(nodes)
    rng = random.Random(seed)
    readers = {}
    for node in nodes:
        for name, index in node.inputs:
            readers.setdefault((name, index), []).append(node.name)
    for _ in range(4):  # several sets of swaps on one numbered graph, as a search tries them
        tensors = [tensor for tensor in readers if tensor[0] in graph.index and rng.random() < 0.3]
        swaps = []
        for tensor in tensors:  # a trigger before the first consumer (all edges point down the list)
            consumers = rng.sample(readers[tensor], k=rng.randint(1, len(readers[tensor])))
            first = min(graph.index[name] for name in consumers)
            swaps.append(Swap(tensor, tuple(consumers), nodes[rng.randrange(first)].name, rng.choice([8, 64, 512])))
        _same_replay(replay_with_swaps(graph, swaps, persistent_bytes=3, explain=True),
                     reference_replay(with_swaps(nodes, swaps), 3))


def _same_replay(got, expected):
    fields = ("peak_bytes", "peak_after", "order", "live_at_peak", "live_bytes", "resized_live_bytes")
    assert [getattr(got, name) for name in fields] == [getattr(expected, name) for name in fields]


@pytest.mark.parametrize("seed", range(30))
def test_the_walk_is_the_plain_walk_with_nodes_removed_swaps_added_and_sizes_changed(seed):
    from lms_magic.lms.core.simulate import Swap, replay_with_swaps, with_swaps

    nodes, origins = swapped_graph(seed, size=120)
    graph = IndexedGraph(nodes)
    rng = random.Random(seed)

    def device_bytes(changed):  # the step at another batch size: every output's bytes other, off-device ones none
        return [tuple(3 * n_bytes + 8 if node.on_device else 0 for n_bytes in node.outputs) for node in changed]

    undone = {name: origin for name, origin in origins.items() if rng.random() < 0.5}
    changed = changed_from_scratch(nodes, undone)
    _same_replay(graph.replay(5, explain=True, substitute=undone),
                 reference_replay(changed, 5))
    _same_replay(IndexedGraph(changed).replay(5, explain=True, resized=device_bytes(changed)),
                 reference_replay(changed, 5, device_bytes(changed)))
    readers = {}
    for node in nodes:
        for name, index in node.inputs:
            readers.setdefault((name, index), []).append(node.name)
    tensors = [tensor for tensor in readers if tensor[0] in graph.index and rng.random() < 0.3]
    swaps = []
    for tensor in tensors:
        consumers = rng.sample(readers[tensor], k=rng.randint(1, len(readers[tensor])))
        first = min(graph.index[name] for name in consumers)
        swaps.append(Swap(tensor, tuple(consumers), nodes[rng.randrange(first)].name, rng.choice([8, 64, 512])))
    swapped = with_swaps(nodes, swaps)
    other = IndexedGraph([Node(node.name, sizes, node.inputs, node.control_inputs, node.on_device, node.alias_input,
                               node.priority, node.forwards_input) for node, sizes in zip(nodes, device_bytes(nodes))])
    bigger = [Swap(swap.tensor, swap.consumers, swap.trigger, 3 * swap.nbytes + 8) for swap in swaps]
    copies = with_swaps(nodes, bigger)[len(nodes):]  # the host and device copies, at the bigger sizes
    _same_replay(replay_with_swaps(graph, swaps, 3, explain=True, resized=(other, bigger)),
                 reference_replay(swapped, 3, device_bytes(nodes) + [node.outputs if node.on_device else (0,)
                                                                     for node in copies]))


def test_an_in_place_kernel_takes_over_an_input_read_by_it_alone_and_once():
    def peak(*inputs):
        nodes = [Node("x", (100,), priority=0), Node("y", (100,), inputs, forwards_input=True, priority=1),
                 Node("out", (0,), (("y", 0),), priority=2)]
        return IndexedGraph(nodes).replay(explain=True).peak_bytes

    assert peak(("x", 0)) == 100  # relu(x): y written over x
    assert peak(("x", 0), ("x", 0)) == 200  # x * x: x is read twice by it, y needs a buffer of its own
