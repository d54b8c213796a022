"""The rewrite of a traced train step: candidates found, and each swap-in gated ``lb`` backward ops ahead."""

from collections import deque

import pytest
import tensorflow as tf

from lms_magic.lms.tensorflow.rewrite import find_candidates, insert_swaps, layer_resolver
from tests import models


def rewritten(lb):
    """The reference CNN's train step traced at batch 16, its candidates swapped as LMS does it: inside the
    trace, after the step's ops. Returns (candidates, notes, records, the step's ops)."""
    model = models.reference_cnn_small()
    specs = (tf.TensorSpec((16, 32, 32, 3), tf.float32), tf.TensorSpec((16,), tf.int64))
    found = {}

    def step(data):
        graph = tf.compat.v1.get_default_graph()
        start = len(graph.get_operations())
        logs = model.train_step(data)
        ops = graph.get_operations()[start:]
        found["candidates"], found["notes"] = find_candidates(ops, layer_resolver(model), lb, 16)
        found["records"] = insert_swaps(graph, found["candidates"], "/CPU:1")
        found["ops"] = graph.get_operations()[start:]
        return logs

    tf.function(step, autograph=False).get_concrete_function(specs)
    return found["candidates"], found["notes"], found["records"], found["ops"]


def data_hops(ops, source_name, target_name):
    """Shortest data path (in ops) from source to target."""
    users = {}
    for op in ops:
        for tensor in op.inputs:
            users.setdefault(tensor.op.name, []).append(op.name)
    seen, queue = {source_name: 0}, deque([source_name])
    while queue:
        name = queue.popleft()
        if name == target_name:
            return seen[name]
        for user in users.get(name, []):
            if user not in seen:
                seen[user] = seen[name] + 1
                queue.append(user)
    return None


@pytest.mark.parametrize("lb", [1, 3])
def test_each_swap_in_waits_for_a_backward_op_lb_ahead_of_its_consumer(lb):
    candidates, notes, records, ops = rewritten(lb)
    assert len(candidates) >= 12 and not notes  # every Conv2D's activation, at least
    by_name = {op.name: op for op in ops}
    deep_enough = 0
    for record in records:
        swap_in = by_name[record.swap_in]
        assert [op.name for op in swap_in.control_inputs] == [record.trigger]
        assert record.trigger.startswith("gradient_tape/")
        assert swap_in.device.endswith("CPU:1") and by_name[record.swap_out].device.endswith("CPU:1")
        first_consumer = min(record.consumers, key=lambda name: ops.index(by_name[name]))
        assert data_hops(ops, record.trigger, first_consumer) == record.hops <= lb
        landed = by_name[record.landed]  # the consumers read it on their own device, from the swap-in
        assert list(landed.inputs) == [swap_in.outputs[0]] and not landed.device.endswith("CPU:1")
        assert all(any(t is landed.outputs[0] for t in by_name[name].inputs) for name in record.consumers)
        deep_enough += record.hops == lb
    assert deep_enough >= len(records) - 2  # only swaps next to the loss have shorter paths


def test_candidates_are_sized_at_the_batch_and_come_in_forward_order():
    candidates, _, _, _ = rewritten(1)
    first = candidates[0].candidate
    assert first.shape[0] == 16 and first.nbytes == 4 * 16 * 32 * 32 * 32  # a Conv2D's 32 channels, float32
    positions = [item.candidate.forward_index for item in candidates]
    assert positions == sorted(positions)
    assert {item.candidate.layer_type for item in candidates} >= {"Conv2D"}


def test_a_swap_op_is_the_node_tf_raw_ops_makes():
    """The swap ops are made without the op-definition library (tf_internals.pass_through_op): the nodes, devices
    and names must be what ``tf.raw_ops`` makes, or Grappler could treat the step otherwise."""
    from lms_magic.lms.tensorflow import internals as tf_internals

    made = {}

    def step(x):
        graph = tf.compat.v1.get_default_graph()
        y = tf.nn.relu(x)
        with graph.name_scope(None), tf.device("/CPU:1"):
            made["raw"] = [tf.raw_ops.EnsureShape(input=y, shape=y.shape, name="out/t"),
                           tf.raw_ops.Snapshot(input=y, name="in/t")]
            made["fast"] = [tf_internals.pass_through_op(graph, "EnsureShape", y, "out/t", y.shape),
                            tf_internals.pass_through_op(graph, "Snapshot", y, "in/t")]
        return y

    tf.function(step, autograph=False).get_concrete_function(tf.TensorSpec((None, 3), tf.float32))
    for raw, fast in zip(made["raw"], made["fast"]):
        assert (fast.op.name, fast.op.device) == (raw.op.name + "_1", raw.op.device)
        raw_def, fast_def = raw.op.node_def, fast.op.node_def
        raw_def.name = fast_def.name = ""
        assert fast_def == raw_def
        assert fast.shape.as_list() == raw.shape.as_list() == [None, 3]
