"""The backward order (core/order.py) on small graphs: what runs when, and what the peak becomes."""

from lms_magic.lms.core.order import backward_order, join_name
from lms_magic.lms.core.simulate import Node, execution_order, replay


def _graph(*specs):
    """Nodes in program order from (name, bytes, *input names)."""
    return [Node(name, (size,), tuple((source, 0) for source in sources), priority=index)
            for index, (name, size, *sources) in enumerate(specs)]


# A residual block's backward pass as a tape writes it: the output gradient g forks into the branch (two
# layers: b_bn, b_conv) and the shortcut (s_bn, s_conv), their ops interleaved in program order; each
# normalization's gradient makes two full-size partial gradients that a tape sum adds (AddN_1, AddN_2);
# the block's input gradient sums both branches (AddN_3).
BLOCK = _graph(
    ("g", 100),
    ("s_bn/mul", 100, "g"), ("b_bn/mul", 100, "g"),
    ("s_bn/mean", 100, "g"), ("b_bn/mean", 100, "g"),
    ("AddN_1", 100, "s_bn/mul", "s_bn/mean"), ("AddN_2", 100, "b_bn/mul", "b_bn/mean"),
    ("s_conv/input", 25, "AddN_1"), ("b_conv/input", 25, "AddN_2"),
    ("AddN_3", 25, "s_conv/input", "b_conv/input"),
)
GROUP = {node.name: node.name.split("/")[0] for node in BLOCK if "/" in node.name}


def _ordered(nodes=BLOCK, **kwargs):
    return backward_order(nodes, GROUP.get, lambda name: name.startswith("AddN"), **kwargs)


def test_the_block_runs_one_branch_at_a_time_and_its_peak_falls():
    ordered = _ordered()
    assert ordered.groups[0] in ("s_bn", "b_bn") and len(ordered.groups) == 4
    bn_first = ordered.groups[0]
    assert ordered.groups[1] == bn_first.replace("bn", "conv")  # depth first: that branch's conv next
    order = [node.name for node in execution_order(ordered.applied(BLOCK))]
    other = "b_bn" if bn_first == "s_bn" else "s_bn"
    assert order.index(f"{bn_first.replace('bn', 'conv')}/input") < order.index(f"{other}/mul")
    # interleaved: g and four partial gradients at once; ordered: g, one layer's two and their sum
    assert replay(BLOCK).peak_bytes == 500
    assert replay(ordered.applied(BLOCK)).peak_bytes == 400


def test_a_layers_sum_of_partial_gradients_finishes_its_group():
    ordered = _ordered()
    first = ordered.groups[0]
    adopted = "AddN_1" if first == "s_bn" else "AddN_2"
    assert adopted in ordered.joins[join_name(first)]  # the join waits for the sum
    assert "AddN_3" not in [name for last in ordered.joins.values() for name in last]  # two groups' sum: free


def test_swap_ins_of_a_group_wait_for_the_group_before_it():
    ordered = _ordered()
    second = ordered.groups[1]
    assert ordered.before[f"{second}/input"] == join_name(ordered.groups[0])
    assert not any(name.startswith(ordered.groups[0]) for name in ordered.before)


def test_ops_that_may_not_wait_get_no_edge_and_the_rest_still_does():
    ordered = _ordered(may_wait=lambda name: not name.endswith("/mul"))
    assert not any(name.endswith("/mul") for name in ordered.waits)
    assert any(name.endswith("/mean") for name in ordered.waits)


def test_no_order_for_one_group_or_a_cycle_between_groups():
    assert backward_order(BLOCK, lambda name: "one" if "/" in name else None) is None
    # a layer called twice: its gradient ops sit before and after another layer's
    shared = _graph(("g", 10), ("a/first", 10, "g"), ("b/x", 10, "a/first"), ("a/second", 10, "b/x"))
    assert backward_order(shared, lambda name: name.split("/")[0] if "/" in name else None) is None


def test_the_order_adds_no_cycle_and_keeps_every_node():
    ordered = _ordered()
    nodes = ordered.applied(BLOCK)
    assert {node.name for node in BLOCK} <= {node.name for node in nodes}
    assert len(execution_order(nodes)) == len(nodes)  # raises GraphCycleError on a cycle
