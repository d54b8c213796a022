"""The liveness replay (pure): peaks, aliasing, in-place kernels, swaps, and the peak's buffers."""

import pytest

from lms_magic.lms.core.simulate import GraphCycleError, Node, Swap, execution_order, replay, with_swaps

from .reference_walk import reference_replay


def chain(*sizes):
    nodes = [Node("n0", (sizes[0],), priority=0)]
    for i, size in enumerate(sizes[1:], 1):
        nodes.append(Node(f"n{i}", (size,), ((f"n{i-1}", 0),), priority=i))
    return nodes


def test_buffers_are_freed_after_their_last_reader():
    assert replay(chain(10, 20, 30, 5)).peak_bytes == 50  # 20 + 30 live together


def test_persistent_bytes_are_added_throughout():
    assert replay(chain(10, 20), persistent_bytes=1000).peak_bytes == 1030


def test_aliasing_ops_share_their_input_buffer():
    nodes = [Node("x", (100,)), Node("view", (100,), (("x", 0),), alias_input=0, priority=1),
             Node("y", (1,), (("view", 0),), priority=2)]
    assert replay(nodes).peak_bytes == 101


def test_identity_n_aliases_each_output_to_its_input():
    nodes = [Node("a", (100,)), Node("b", (100,), priority=1),
             Node("ids", (100, 100), (("a", 0), ("b", 0)), alias_input=-1, priority=2),
             Node("use", (1,), (("ids", 0), ("ids", 1)), priority=3)]
    assert replay(nodes).peak_bytes == 201


def test_elementwise_ops_reuse_a_buffer_nobody_else_reads():
    nodes = [Node("x", (100,)), Node("relu", (100,), (("x", 0),), priority=1, forwards_input=True),
             Node("out", (1,), (("relu", 0),), priority=2)]
    assert replay(nodes).peak_bytes == 101
    shared = nodes + [Node("other", (1,), (("x", 0),), priority=3)]  # x still needed: no reuse
    assert replay(shared).peak_bytes == 201


def test_host_nodes_do_not_count():
    nodes = [Node("x", (100,)), Node("host", (100,), (("x", 0),), on_device=False, priority=1)]
    assert replay(nodes).peak_bytes == 100


def test_order_respects_control_edges_and_priorities():
    nodes = [Node("late", priority=5), Node("early", priority=1), Node("gated", control_inputs=("late",), priority=0)]
    assert [n.name for n in execution_order(nodes)] == ["early", "late", "gated"]


def test_cycle_is_reported():
    nodes = [Node("a", inputs=(("b", 0),)), Node("b", inputs=(("a", 0),))]
    with pytest.raises(GraphCycleError, match="cycle"):
        execution_order(nodes)


def test_swapping_a_long_lived_tensor_lowers_the_peak():
    forward = chain(100, 100, 100, 100)
    backward = [Node("g3", (100,), (("n3", 0),), priority=4), Node("g2", (100,), (("g3", 0), ("n2", 0)), priority=5),
                Node("g1", (100,), (("g2", 0), ("n1", 0)), priority=6),
                Node("g0", (100,), (("g1", 0), ("n0", 0)), priority=7)]
    graph = forward + backward
    plain = replay(graph).peak_bytes
    swapped = replay(with_swaps(graph, [Swap(("n0", 0), ("g0",), "g1", 100), Swap(("n1", 0), ("g1",), "g2", 100)]))
    assert swapped.peak_bytes < plain


def random_graph(seed, size=60):
    import random

    rng = random.Random(seed)
    nodes = []
    for index in range(size):
        sources = rng.sample(range(index), k=min(index, rng.randint(0, 3)))
        nodes.append(Node(f"n{index}", (rng.choice([0, 8, 64, 512]),), tuple((f"n{s}", 0) for s in sources),
                          on_device=rng.random() > 0.1, priority=index,
                          forwards_input=rng.random() < 0.3))
    return nodes


@pytest.mark.parametrize("seed", range(20))
def test_the_buffers_live_at_the_peak_add_up_to_it(seed):
    nodes = random_graph(seed)
    explained = replay(nodes, persistent_bytes=1000, explain=True)
    plain = reference_replay(nodes, 1000)  # the walk written plainly (reference_walk.py)
    assert (explained.peak_bytes, explained.peak_after, explained.live_at_peak) == \
        (plain.peak_bytes, plain.peak_after, plain.live_at_peak)
    assert 1000 + sum(nbytes for _, nbytes in explained.live_at_peak) == explained.peak_bytes
    assert all(nbytes > 0 for _, nbytes in explained.live_at_peak)


def test_a_buffer_written_in_place_belongs_to_its_last_writer():
    nodes = [Node("x", (100,)), Node("relu", (100,), (("x", 0),), forwards_input=True),
             Node("big", (500,), (("relu", 0),))]
    assert replay(nodes, explain=True).live_at_peak == [(("relu", 0), 100), (("big", 0), 500)]
