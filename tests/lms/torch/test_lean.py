"""lean_ops=True on Keras's PyTorch backend: BatchNormalization in PyTorch's fused kernel (lms/torch/lean.py)."""

import keras
import numpy as np
import pytest
import torch

from lms_magic import LMS
from lms_magic.lms.torch.lean import lean_batch_norm

from tests.models import small_residual_bn_dropout as residual_bn_dropout, train


def keras_own(x, mean, variance, gamma, beta, axis, epsilon):
    return keras.ops.batch_normalization(x, mean, variance, axis, offset=beta, scale=gamma, epsilon=epsilon)


def normalized(normalize, x, gamma, beta, axis, dy):
    """The normalization of ``x`` by its batch statistics (Keras's moments), and its gradients to x, gamma, beta."""
    x, gamma, beta = (t.clone().requires_grad_(True) for t in (x, gamma, beta))
    axes = [a for a in range(x.ndim) if a != axis % x.ndim]
    mean, variance = keras.ops.moments(x, axes)
    y = normalize(x, mean, variance, gamma, beta, axis, 1e-3)
    y.backward(dy)
    return y.detach(), (x.grad, gamma.grad, beta.grad)


@pytest.mark.parametrize("axis, shape", [(-1, (8, 6, 6, 16)), (1, (8, 16, 6, 6)), (-1, (32, 24))])
def test_the_fused_normalization_is_keras_s_to_float_rounding(axis, shape):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator) * 2 + 3  # a mean away from 0, as a conv output has
    channels = shape[axis]
    gamma, beta = torch.randn(channels, generator=generator), torch.randn(channels, generator=generator)
    dy = torch.randn(shape, generator=generator)
    y, expected = normalized(keras_own, x, gamma, beta, axis, dy)
    lean_y, got = normalized(lean_batch_norm, x, gamma, beta, axis, dy)
    assert (lean_y - y).abs().max() / y.abs().max() <= 1e-5
    for name, want, have in zip(("x", "gamma", "beta"), expected, got):
        error = float((have - want).abs().max() / want.abs().max())
        assert error <= 1e-5, (name, error)


def test_a_fit_keeps_fewer_bytes_for_the_backward_pass_and_trains_as_keras_to_rounding(data):
    plain, plain_history = train(residual_bn_dropout, data)
    every = dict(n_tensors=-1, min_bytes=0, verbose=0)  # every saved activation offloaded: all of them counted
    keras_bn, lean = LMS(order_backward=True, **every), LMS(lean_ops=True, **every)
    _, keras_history = train(residual_bn_dropout, data, keras_bn)
    model, lean_history = train(residual_bn_dropout, data, lean)
    assert lean.stats.lean_layers == 3 and keras_bn.stats.lean_layers == 0
    assert any(note.startswith("order_backward is not available on PyTorch") for note in keras_bn.stats.notes)
    assert "lean BatchNormalization in 3 layers" in lean.summary()
    # autograd keeps the input and per-channel statistics, not Keras's centred copy
    assert lean.stats.swapped_bytes_per_step < keras_bn.stats.swapped_bytes_per_step
    assert lean.stats.device_peak_bytes_without_lms < keras_bn.stats.device_peak_bytes_without_lms
    assert keras_history == plain_history
    np.testing.assert_allclose(lean_history["loss"], plain_history["loss"], rtol=1e-4)
    assert not any("call" in vars(layer) for layer in model.layers)  # the layers are Keras's again


def test_the_layers_are_restored_when_a_step_fails(data):
    class Fails(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("a callback failed mid-fit")

    model = residual_bn_dropout()
    with pytest.raises(RuntimeError, match="mid-fit"):
        model.fit(*data, batch_size=16, epochs=1, verbose=0,
                  callbacks=[LMS(lean_ops=True, min_bytes=0, verbose=0), Fails()])
    assert not any("call" in vars(layer) for layer in model.layers)
