"""What TensorFlow actually executes with LMS: swaps present, gated, and the memory they save."""

from collections import deque

import pytest
import tensorflow as tf

from lms_magic import LMS

from . import fresh_peak, models
from .conftest import HOST


def fit_reference(lms_options, **options):
    callback = LMS(**{**lms_options, **options})
    model = models.reference_cnn()
    x, y = models.images(64, 64)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    return model, callback


def partition_nodes(callback):
    return {node.name: node for graph in callback.stats["partition_graphs"] for node in graph.node}


def test_every_planned_swap_is_executed_on_the_host(lms_options):
    _, callback = fit_reference(lms_options)
    executed = partition_nodes(callback)
    records = callback.stats["records"]
    assert len(records) == callback.stats["swapped_tensors"] >= 12
    host = tf.DeviceSpec.from_string(HOST)
    for record in records:
        for name in (record.swap_out, record.swap_in):
            matches = [node for full, node in executed.items() if full.endswith("/" + name) or full == name]
            assert matches, f"{name} was removed before execution"
            assert all(tf.DeviceSpec.from_string(n.device).device_index == host.device_index for n in matches)
            assert all(n.op in ("EnsureShape", "Snapshot") for n in matches)


def data_hops(step, source_name, target_name):
    """Shortest data path (in ops) from source to target in the traced step."""
    ops = {op.name: op for op in step.ops}
    users = {}
    for op in step.ops:
        for tensor in op.inputs:
            users.setdefault(tensor.op.name, []).append(op.name)
    seen, queue = {source_name: 0}, deque([source_name])
    while queue:
        name = queue.popleft()
        if name == target_name:
            return seen[name]
        for user in users.get(name, []):
            if user not in seen and user in ops:
                seen[user] = seen[name] + 1
                queue.append(user)
    return None


@pytest.mark.parametrize("lb", [1, 3])
def test_each_swap_in_waits_for_a_backward_op_lb_ahead_of_its_consumer(lms_options, lb):
    _, callback = fit_reference(lms_options, lb=lb)
    step = callback._step
    ops = {op.name: op for op in step.ops}
    deep_enough = 0
    for record in callback.stats["records"]:
        swap_in = ops[record.swap_in]
        assert [op.name for op in swap_in.control_inputs] == [record.trigger]
        assert record.trigger.startswith("gradient_tape/")
        first_consumer = min(record.consumers, key=lambda name: step.ops.index(ops[name]))
        assert data_hops(step, record.trigger, first_consumer) == record.hops <= lb
        deep_enough += record.hops == lb
    assert deep_enough >= len(callback.stats["records"]) - 2  # only swaps next to the loss have shorter paths


def test_reference_cnn_peak_is_at_least_halved(lms_options):
    _, callback = fit_reference(lms_options)
    stats = callback.stats
    assert stats["prediction_source"] == "executed partition graphs"
    assert stats["device_peak_bytes"] <= 0.5 * stats["device_peak_bytes_without_lms"]


@pytest.mark.parametrize("name, build, data, batch_size", [
    ("reference cnn", models.reference_cnn, lambda: models.images(64, 64), 32),
    ("residual", models.residual_bn_dropout, lambda: models.images(64, 32), 32),
    ("subclassed", models.custom_step, lambda: models.images(64, 32), 32),
])
def test_replay_without_lms_agrees_with_tensorflows_measured_peak(lms_options, name, build, data, batch_size):
    x, y = data()
    callback = LMS(**lms_options)
    build().fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    predicted = callback.stats["device_peak_bytes_without_lms"] - callback.stats["persistent_bytes"]
    measured = fresh_peak.measure(name)  # in a fresh process: see fresh_peak.py for why
    assert abs(predicted - measured) <= 0.25 * measured, (name, predicted / 2**20, measured / 2**20)
