"""The step's compute estimate (compute.py) and the step-time ratio LMS predicts with it (core/costs.py)."""

import keras
import pytest
import tensorflow as tf

from lms_magic import LMS
from lms_magic.lms.tensorflow.compute import device_flops_per_s, op_flops, step_flops
from tests import models


def traced_train_step_ops(model, x, y):
    """The ops of the model's traced train step (forward, backward, optimizer), as LMS reads them."""
    model.optimizer.build(model.trainable_variables)

    @tf.function(autograph=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
        model.optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return step.get_concrete_function(tf.TensorSpec(x.shape, x.dtype), tf.TensorSpec(y.shape, y.dtype)).graph.get_operations()


def test_a_dense_steps_flops_are_its_three_matrix_products_per_layer():
    keras.utils.set_random_seed(1)
    model = models.compiled(keras.Sequential([keras.Input((300,)), keras.layers.Dense(200), keras.layers.Dense(10)]),
                            metrics=None)
    x, y = tf.zeros((64, 300)), tf.zeros((64,), "int32")
    ops = traced_train_step_ops(model, x, y)
    # forward x @ W, and the backward pass's two products (the input's gradient, the weights'); the first
    # layer's input gradient is not computed (nothing reads it)
    forward = 2 * 64 * (300 * 200 + 200 * 10)
    expected = 3 * forward - 2 * 64 * 300 * 200
    assert step_flops(ops, 64) == expected


def test_a_convolutions_flops_count_its_output_times_its_filter():
    conv = tf.function(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME")).get_concrete_function(
        tf.TensorSpec((None, 8, 8, 3)), tf.TensorSpec((3, 3, 3, 16))).graph
    (op,) = [op for op in conv.get_operations() if op.type == "Conv2D"]
    assert op_flops(op, 4) == 2 * (4 * 8 * 8 * 16) * (3 * 3 * 3)
    assert op_flops(op, None) == 0  # an unknown batch: not counted, never guessed


def test_the_devices_rate_is_measured_once(devices):
    first = device_flops_per_s(devices.accelerator)
    assert first > 1e8 and device_flops_per_s(devices.accelerator) is first


@pytest.mark.parametrize("capacity", ["fits", "every swap"])
def test_the_predicted_step_time_is_the_plain_steps_when_nothing_moves(capacity, lms_options, devices):
    chosen = {"fits": {"n_tensors": None, "budget": "1GiB"}, "every swap": {"n_tensors": -1}}[capacity]  # 1 GiB: nothing moves
    callback = LMS(**{**lms_options, **chosen})
    x, y = models.images(32, 32)
    models.reference_cnn_small().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    stats = callback.stats
    assert stats.compute_s > 0 and stats.compute_source.startswith("estimated: the step's")
    if capacity == "fits":
        assert stats.swapped_bytes_per_step == 0 and stats.predicted_step_ratio == 1.0
    else:
        assert stats.swapped_bytes_per_step > 0 and stats.predicted_step_ratio >= 1.0
        assert f"predicted step time {stats.predicted_step_ratio - 1:+.0%}" in callback.summary()
