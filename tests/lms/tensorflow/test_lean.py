"""lean_ops=True: BatchNormalization's gradient in one piece (lms/tensorflow/lean.py), on the two logical CPUs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from lms_magic import LMS
from lms_magic.lms.tensorflow.lean import lean_batch_norm
from tests import models
from tests.conftest import DEVICES


def gradients(normalize, x, gamma, beta, axis, dy):
    """The normalization of ``x`` by its batch statistics, and its gradients to x, gamma and beta."""
    axes = [a for a in range(len(x.shape)) if a != axis % len(x.shape)]

    @tf.function
    def run(x, gamma, beta):
        with tf.GradientTape() as tape:
            tape.watch([x, gamma, beta])
            mean, variance = keras.ops.moments(x, axes)
            y = normalize(x, mean, variance, gamma, beta, axis, 1e-3)
        return y, tape.gradient(y, [x, gamma, beta], output_gradients=dy)

    return run(x, gamma, beta)


def keras_own(x, mean, variance, gamma, beta, axis, epsilon):
    return keras.ops.batch_normalization(x, mean, variance, axis, offset=beta, scale=gamma, epsilon=epsilon)


@pytest.mark.parametrize("axis, shape", [(-1, (8, 6, 6, 16)), (1, (8, 16, 6, 6)), (-1, (32, 24))])
def test_the_lean_gradient_is_keras_s_to_float_rounding_and_the_values_are_keras_s_to_the_bit(axis, shape):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(3.0, 2.0, shape), tf.float32)  # a mean away from 0, as a conv output has
    channels = shape[axis]
    gamma, beta = (tf.constant(rng.normal(size=channels), tf.float32) for _ in range(2))
    dy = tf.constant(rng.normal(size=shape), tf.float32)
    y, expected = gradients(keras_own, x, gamma, beta, axis, dy)
    lean_y, got = gradients(lean_batch_norm, x, gamma, beta, axis, dy)
    np.testing.assert_array_equal(lean_y.numpy(), y.numpy())
    for name, want, have in zip(("x", "gamma", "beta"), expected, got):
        error = np.abs(have.numpy() - want.numpy()).max() / np.abs(want.numpy()).max()
        assert error <= 1e-5, (name, error)


def fit(rows=56, **options):
    """The residual model with BatchNormalization and Dropout trained one epoch at batch 16 (56 rows: the last
    batch of 8 traced again); returns (per-step losses, weights, the callback or None)."""
    from tests.lms.tensorflow.real_models import StepRecord

    x, y = models.images(rows, 32)
    callback = LMS(device=DEVICES.accelerator, host_device=DEVICES.host, verbose=0, min_bytes=0,
                   **options) if options else None
    model = models.residual_bn_dropout()
    record = StepRecord()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False,
              callbacks=[record] + ([callback] if callback else []))
    return record.losses, model, callback


def test_lean_ops_train_as_keras_does_to_float_rounding_at_a_lower_peak(devices):
    plain_losses, plain_model, _ = fit()
    _, _, swaps = fit(n_tensors=-1)
    losses, model, lean = fit(n_tensors=-1, lean_ops=True)
    assert lean.stats.lean_layers == 3 and lean.stats.swapped_tensors > 0
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    for want, have in zip(plain_model.get_weights(), model.get_weights()):
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)
    names = [node.name for graph in lean.stats.partition_graphs for node in graph.node]
    assert any("lean_batch_norm" in name for name in names)
    # lower without swaps; with every candidate swapped, the peak of this small model is not at a normalization's
    # gradient, and the lean gradient's per-channel tensors (bytes) may be live there
    assert lean.stats.device_peak_bytes_without_lms < swaps.stats.device_peak_bytes_without_lms
    assert lean.stats.device_peak_bytes <= swaps.stats.device_peak_bytes * 1.001
    assert "lean BatchNormalization gradient in 3 layers" in lean.summary()
    assert not any("call" in vars(layer) for layer in model.layers)  # the model is plain again


def test_a_fit_that_fails_mid_way_leaves_the_layers_as_keras_made_them(devices):
    class Fails(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                raise RuntimeError("stop")

    x, y = models.images(48, 32)
    model = models.residual_bn_dropout()
    callback = LMS(device=DEVICES.accelerator, host_device=DEVICES.host, verbose=0, lean_ops=True)
    with pytest.raises(RuntimeError, match="stop"):
        model.fit(x, y, batch_size=16, verbose=0, callbacks=[callback, Fails()])
    assert callback.stats.lean_layers == 3
    assert not any("call" in vars(layer) for layer in model.layers)


def test_a_model_without_batch_normalization_says_so(devices):
    x, y = models.images(32, 32)
    callback = LMS(device=DEVICES.accelerator, host_device=DEVICES.host, verbose=0, lean_ops=True)
    models.reference_cnn_small().fit(x, y, batch_size=16, verbose=0, callbacks=[callback])
    assert callback.stats.lean_layers == 0 and any("no Keras BatchNormalization" in n for n in callback.stats.notes)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_lean_ops_takes_true_or_false(value):
    from lms_magic.lms.options import OptionError

    with pytest.raises(OptionError, match=r"lean_ops=.* takes True .* or False"):
        LMS(lean_ops=value)


@pytest.mark.release
@pytest.mark.parametrize("name", ["ResNet50", "DenseNet121", "EfficientNetB0"])
def test_lean_ops_on_whole_applications_models(name, devices):
    """64x64, batch 8, every candidate swapped: the first loss identical, the weights after one step within 1e-6
    of the plain fit's. At this size weights and optimizer state make the peak: where a normalization's gradient
    makes the peak without swaps it is lower, and the same with them (the lean gradient's per-channel tensors
    within 0.1%). EfficientNetB0's peaks are elsewhere (the forward pass with swaps): its per-channel tensors may
    raise them by up to 0.2%."""
    from tests.lms.tensorflow.real_models import Case, application

    case = Case(application(name, 64), "sgd", batch=8, steps=2)
    _, plain_losses, (plain_first, _) = case.fit()
    options = dict(device=DEVICES.accelerator, host_device=DEVICES.host, verbose=0, n_tensors=-1)
    swaps, lean = LMS(**options), LMS(lean_ops=True, **options)
    case.fit(swaps)
    _, losses, (first, _) = case.fit(lean)
    assert losses[0] == plain_losses[0]
    assert np.linalg.norm(first - plain_first) / np.linalg.norm(plain_first) <= 1e-6
    if name == "EfficientNetB0":
        assert lean.stats.device_peak_bytes_without_lms <= swaps.stats.device_peak_bytes_without_lms * 1.002
        assert lean.stats.device_peak_bytes <= swaps.stats.device_peak_bytes * 1.002
    else:
        assert lean.stats.device_peak_bytes_without_lms < swaps.stats.device_peak_bytes_without_lms
        assert lean.stats.device_peak_bytes <= swaps.stats.device_peak_bytes * 1.001
