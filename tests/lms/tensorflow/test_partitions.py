"""Reading partition graphs, with hand-made GraphDef-like nodes (no TensorFlow)."""

from types import SimpleNamespace

from lms_magic.lms.core.simulate import replay
from lms_magic.lms.tensorflow.graph import grappler_origins
from lms_magic.lms.tensorflow.partitions import nodes_from_partitions

DEV, HOST = "/job:localhost/replica:0/task:0/device:GPU:0", "/job:localhost/replica:0/task:0/device:CPU:0"


def node(name, op, inputs=(), device=DEV, tensor_name=None):
    attr = {} if tensor_name is None else {"tensor_name": SimpleNamespace(s=tensor_name.encode())}
    return SimpleNamespace(name=name, op=op, input=list(inputs), device=device, attr=attr)


def swapped_graph():
    device = [
        node("act", "Relu"), node("act/_send", "_Send", ["act"], tensor_name="e1"),
        node("mid", "Conv2D", ["act"]), node("grad_mid", "Conv2DBackpropInput", ["mid"]),
        node("gate/_send", "_Send", ["grad_mid"], tensor_name="e3"),
        node("swap_in/_recv", "_Recv", tensor_name="e2"),
        node("grad_act", "Conv2DBackpropInput", ["grad_mid", "swap_in/_recv"]),
    ]
    host = [
        node("act/_recv", "_Recv", device=HOST, tensor_name="e1"),
        node("lms_swap_out/act", "EnsureShape", ["act/_recv"], device=HOST),
        node("gate/_recv", "_Recv", device=HOST, tensor_name="e3"),
        node("lms_swap_in/act", "Snapshot", ["lms_swap_out/act", "^gate/_recv"], device=HOST),
        node("lms_swap_in/_send", "_Send", ["lms_swap_in/act"], device=HOST, tensor_name="e2"),
    ]
    return [SimpleNamespace(node=device), SimpleNamespace(node=host)]


SIZES = {"act": 100, "mid": 100, "grad_mid": 100, "grad_act": 10, "lms_swap_in/act": 100, "lms_swap_out/act": 100}
PROGRAM_ORDER = {"act": 0, "mid": 1, "grad_mid": 2, "grad_act": 3}


def size_of(name, op, index):
    return SIZES.get(name)


def test_recv_on_the_device_allocates_a_copy_after_its_gate():
    nodes, unknown = nodes_from_partitions(swapped_graph(), "device:GPU:0", size_of, lambda name: None)
    assert unknown == []
    recv = next(n for n in nodes if n.name == "swap_in/_recv")
    assert recv.on_device and recv.outputs == (100,)
    order = replay(nodes).order
    assert order.index("grad_mid") < order.index("lms_swap_in/act") < order.index("swap_in/_recv")


def test_undo_swaps_reads_the_original_device_tensor():
    nodes, _ = nodes_from_partitions(swapped_graph(), "device:GPU:0", size_of, lambda name: None, undo_swaps=True)
    names = {n.name for n in nodes}
    assert "swap_in/_recv" not in names and "lms_swap_out/act" not in names and "act/_send" not in names
    grad_act = next(n for n in nodes if n.name == "grad_act")
    assert ("act", 0) in grad_act.inputs


def test_with_lms_the_activation_is_not_held_through_the_middle():
    with_lms, _ = nodes_from_partitions(swapped_graph(), "device:GPU:0", size_of, PROGRAM_ORDER.get)
    without, _ = nodes_from_partitions(swapped_graph(), "device:GPU:0", size_of, PROGRAM_ORDER.get, undo_swaps=True)
    # without LMS, act, mid and grad_mid live together; with it, act waits on the host meanwhile
    assert (replay(with_lms).peak_bytes, replay(without).peak_bytes) == (200, 300)


def recomputed_graph():
    """A ReLU recomputed from the BatchNormalization input its gradient keeps: bn -> relu -> conv forward;
    its clone chain (bn/lms_recompute_2_0 and relu/lms_recompute_2_1), gated on grad_mid, feeds the convolution's gradient."""
    return [SimpleNamespace(node=[
        node("x", "Conv2D"), node("bn", "Mul", ["x"]), node("relu", "Relu", ["bn"]), node("mid", "Conv2D", ["relu"]),
        node("grad_mid", "Conv2DBackpropInput", ["mid"]),
        node("bn/lms_recompute_2_0", "Mul", ["x", "^grad_mid"]),
        node("relu/lms_recompute_2_1", "Relu",
             ["bn/lms_recompute_2_0", "^grad_mid"]),
        node("grad_relu", "Conv2DBackpropFilter", ["grad_mid", "relu/lms_recompute_2_1"]),
        node("grad_x", "Mul", ["grad_relu", "x"]),
    ])]


RECOMPUTED_SIZES = {"x": 100, "bn": 100, "relu": 100, "mid": 100, "grad_mid": 100, "grad_relu": 10, "grad_x": 10,
                    "bn/lms_recompute_2_0": 100,
                    "relu/lms_recompute_2_1": 100}


def test_undo_recomputes_reads_the_original_and_drops_the_clones():
    nodes, _ = nodes_from_partitions(recomputed_graph(), "device:GPU:0",
                                     lambda name, op, index: RECOMPUTED_SIZES.get(name), lambda name: None,
                                     undo_swaps=True)
    assert not any("lms_recompute" in n.name for n in nodes)
    grad_relu = next(n for n in nodes if n.name == "grad_relu")
    assert grad_relu.inputs == (("grad_mid", 0), ("relu", 0))
    # without the recompute, relu lives from the forward pass to its gradient; with it, only the clone does
    with_lms, _ = nodes_from_partitions(recomputed_graph(), "device:GPU:0",
                                        lambda name, op, index: RECOMPUTED_SIZES.get(name), lambda name: None)
    assert replay(with_lms).peak_bytes < replay(nodes).peak_bytes


def test_a_swapped_tensors_route_names_its_device_readers_its_swap_in_and_where_it_lands():
    """Two landings of one tensor (two backward readers): one route; the host's copies and sends are not readers."""
    from types import SimpleNamespace as N

    from lms_magic.lms.tensorflow.partitions import swap_routes

    def node(name, op, inputs, device, tensor=None):
        return N(name=name, op=op, input=inputs, device=f"/job:localhost/replica:0/task:0/device:{device}",
                 attr={"tensor_name": N(s=tensor.encode())} if tensor else {})

    graph = N(node=[node("conv", "Conv2D", [], "GPU:0"), node("relu", "Relu", ["conv"], "GPU:0"),
                    node("pool", "MaxPool", ["relu"], "GPU:0"), node("send", "_Send", ["relu"], "GPU:0", "t0"),
                    node("recv", "_Recv", [], "CPU:0", "t0"),
                    node("lms_swap_out/relu", "EnsureShape", ["recv"], "CPU:0"),
                    node("lms_swap_in/relu", "Snapshot", ["lms_swap_out/relu"], "CPU:0"),
                    node("send_in", "_Send", ["lms_swap_in/relu"], "CPU:0", "t1"),
                    node("recv_in", "_Recv", [], "GPU:0", "t1"),
                    node("grad/a/lms_landed_0", "Snapshot", ["recv_in"], "GPU:0"),
                    node("grad/b/lms_landed_1", "Snapshot", ["recv_in"], "GPU:0")])
    (route,) = swap_routes([graph], "device:GPU:0")
    assert (route.producer, route.op_type, route.index) == ("relu", "Relu", 0)
    assert route.readers == ("pool",) and route.swap_ins == ("lms_swap_in/relu",)
    assert route.landings == ("grad/a/lms_landed_0", "grad/b/lms_landed_1")


def test_an_output_of_unknown_size_holds_its_inputs_elements_at_its_own_element_size():
    """A comparison of float32 logits nobody sized: its bools are a quarter of the logits' bytes where the element
    sizes are known, the logits' bytes where they are not."""
    graph = [SimpleNamespace(node=[node("logits", "MatMul"), node("less", "Less", ["logits", "logits"]),
                                   node("both", "LogicalAnd", ["less", "less"]), node("out", "Cast", ["both"]),
                                   node("sum", "Sum", ["out"])])]
    sizes = {"logits": 400, "sum": 4}
    itemsizes = {"MatMul": (4,), "Less": (1,), "LogicalAnd": (1,), "Cast": (4,), "Sum": (4,)}

    def sized(itemsizes_of):
        nodes, unknown = nodes_from_partitions(graph, "device:GPU:0", lambda name, op, index: sizes.get(name),
                                               lambda name: None, itemsizes_of=itemsizes_of)
        return {n.name: n.outputs for n in nodes}, sorted(unknown)

    assert sized(lambda n: itemsizes[n.op]) == ({"logits": (400,), "less": (100,), "both": (100,), "out": (400,),
                                                 "sum": ()}, ["both", "less", "out"])
    assert sized(None)[0]["less"] == (400,)


def test_two_partitions_nodes_of_one_name_are_each_sized_and_the_step_replays():
    """TensorFlow names some nodes alike in two partitions of one step (a tf.data fit's metrics ``optional`` in
    each, read by its partition's results): each node of unknown size is sized, and the step replays (unsized, the
    replay fails and LMS's prediction falls back to the traced graph)."""
    device = [node("mean", "Mean"), node("optional", "OptionalFromValue", ["mean"]),
              node("done", "Identity", ["optional"])]
    host = [node("count", "Mean", device=HOST), node("optional", "OptionalFromValue", ["count"], device=HOST),
            node("read", "Identity", ["optional"], device=HOST)]
    sizes = {"mean": 8, "count": 8, "done": 8, "read": 8}
    nodes, _ = nodes_from_partitions([SimpleNamespace(node=device), SimpleNamespace(node=host)], "device:GPU:0",
                                     lambda name, op, index: sizes.get(name), lambda name: None)
    assert [n.outputs for n in nodes if n.name == "optional"] == [(8,), (8,)]
    assert replay(nodes).peak_bytes > 0


def test_a_node_grappler_made_of_another_type_is_sized_by_its_origins_elements():
    """Grappler moves a cast past a reshape: the new reshape holds the origin's elements at the cast's input type
    (bfloat16 here, where the traced reshape held float32)."""
    renamed = "dense/ArithmeticOptimizer/ReorderCastLikeAndValuePreserving_bfloat16_Reshape"
    graph = [SimpleNamespace(node=[node("x", "MatMul"), node(renamed, "Reshape", ["x"]),
                                   node("y", "Cast", [renamed]), node("loss", "Sum", ["y"])])]
    elements = {"dense/Reshape": 1000}
    sizes = {"x": 2000, "y": 4000, "loss": 4}
    nodes, unknown = nodes_from_partitions(
        graph, "device:GPU:0", lambda name, op, index: sizes.get(name), lambda name: None,
        itemsizes_of=lambda n: {"Reshape": (2,)}.get(n.op), elements_of=lambda name, op, index: next(
            (elements[origin] for origin in grappler_origins(name) if origin in elements), None))
    assert {n.name: n.outputs for n in nodes}[renamed] == (2000,) and unknown == []
