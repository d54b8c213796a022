"""Memory-lean operations on TensorFlow (``LMS(lean_ops=True)``): BatchNormalization's gradient in one piece.

Keras 3 computes ``BatchNormalization`` unfused on TensorFlow (``ops.moments`` and
``ops.batch_normalization``), so its gradient is TensorFlow's automatic one through each of those
ops: several full-size intermediates per layer, held side by side where a residual block's two
branches are differentiated together (ResNet50's backward-pass peak: docs/lms.md). Here the
forward pass is Keras's own, op for op, and the gradient is the closed form

    dx = gamma * rstd * (dy - mean(dy) - xc * rstd**2 * mean(dy * xc)),   xc = x - mean

which makes two full-size intermediates (``xc``, ``dy * xc``) where the automatic one makes four
and more. It is the same function, computed in another order: the gradients differ from Keras's
at float rounding (measured in docs/lms.md), so it is off unless asked for. ``xc`` is computed
after the upstream gradient has arrived (its mean plus ``sum(dy) - sum(dy)``), so that neither
TensorFlow's executor nor the swap planner runs it in the forward pass.

The layers are changed for the duration of each LMS step only (their ``call``, as an instance
attribute) and are exactly as before after it, however it ends. It pays where a normalization's
gradient makes the peak (ResNet50 224x224: docs/lms.md); where the peak is elsewhere, the lean
gradient's per-channel tensors can be live there and raise it by a few hundred bytes.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import keras
import tensorflow as tf

from ... import compat
from .graph import replica_prefix


def lean_batch_norm(x, mean, variance, gamma, beta, axis: int, epsilon: float):
    """Keras's training-mode normalization of ``x`` by its batch ``mean`` and ``variance`` (per channel of
    ``axis``), with the lean gradient: ``ops.batch_normalization``'s value, to the bit.

    The gradient reaches ``x``, ``gamma`` and ``beta`` (``mean`` and ``variance`` are ``x``'s own
    statistics: their part of it is in the closed form), never the statistics' own ops.

    Example:
        >>> import tensorflow as tf, keras
        >>> x = tf.random.stateless_normal((8, 4, 4, 3), seed=(1, 2))
        >>> mean, variance = keras.ops.moments(x, axes=[0, 1, 2])
        >>> plain = keras.ops.batch_normalization(x, mean, variance, -1, epsilon=1e-3)
        >>> bool(tf.reduce_all(lean_batch_norm(x, mean, variance, None, None, -1, 1e-3) == plain))
        True
    """
    rank = len(x.shape)
    axis = axis % rank
    axes = [a for a in range(rank) if a != axis]
    broadcast = [1] * rank
    broadcast[axis] = -1
    given = {name: value for name, value in (("gamma", gamma), ("beta", beta)) if value is not None}
    scope = tf.compat.v1.get_default_graph().get_name_scope() if not tf.executing_eagerly() else ""
    mean, variance = tf.stop_gradient(mean), tf.stop_gradient(variance)

    @tf.custom_gradient
    def normalized(x, *params):
        by_name = dict(zip(given, params))  # the tensors the gradient is taken for, by name
        y = keras.ops.batch_normalization(x, mean, variance, axis, offset=by_name.get("beta"),
                                          scale=by_name.get("gamma"), epsilon=epsilon)

        def gradient(dy):
            prefix = replica_prefix(scope)
            with (tf.name_scope(f"{prefix}gradient_tape/{scope[len(prefix):]}/lean_batch_norm/") if scope
                  else contextlib.nullcontext()):
                count = tf.cast(tf.size(x, out_type=tf.int64) // tf.size(mean, out_type=tf.int64), x.dtype)
                rstd = tf.reshape(tf.math.rsqrt(variance + epsilon), broadcast)
                sum_dy = tf.reduce_sum(dy, axes, keepdims=True)
                # the mean waits for the gradient (plus sum(dy) - sum(dy), a zero Grappler does not fold away, as it
                # bypasses an IdentityN): x - mean runs in the backward pass, not as soon as x exists
                gated_mean = tf.reshape(mean, broadcast) + (sum_dy - sum_dy)
                centred = x - gated_mean
                sum_dy_centred = tf.reduce_sum(dy * centred, axes, keepdims=True)
                scale = rstd if "gamma" not in by_name else rstd * tf.reshape(by_name["gamma"], broadcast)
                dx = (dy - sum_dy / count - centred * (rstd * rstd * sum_dy_centred / count)) * scale
                grads = {"gamma": tf.reshape(sum_dy_centred * rstd, [-1]), "beta": tf.reshape(sum_dy, [-1])}
                return (dx, *[grads[name] for name in by_name])

        return y, gradient

    return normalized(x, *given.values())


def _lean_call(layer):
    """``layer.call`` (a Keras ``BatchNormalization``) with the lean gradient in training; Keras's own call
    where it does something else (inference, a mask, renorm, synchronized statistics, not trainable, eager)."""
    plain = type(layer).call.__get__(layer)

    def call(inputs, training=None, mask=None):
        if not (training and layer.trainable) or mask is not None or getattr(layer, "renorm", False) \
                or getattr(layer, "synchronized", False) or tf.executing_eagerly():
            return plain(inputs, training=training, mask=mask)
        ops = keras.ops
        inputs = ops.cast(inputs, keras.backend.result_type(inputs.dtype, "float32"))
        axes = [a for a in range(len(inputs.shape)) if a != layer.axis % len(inputs.shape)]
        mean, variance = ops.moments(inputs, axes=axes)  # Keras's call: ops.moments(inputs, axes=...)
        layer.moving_mean.assign(ops.cast(layer.moving_mean, inputs.dtype) * layer.momentum
                                 + mean * (1.0 - layer.momentum))
        layer.moving_variance.assign(ops.cast(layer.moving_variance, inputs.dtype) * layer.momentum
                                     + variance * (1.0 - layer.momentum))
        gamma = ops.cast(layer.gamma, inputs.dtype) if layer.scale else None
        beta = ops.cast(layer.beta, inputs.dtype) if layer.center else None
        outputs = lean_batch_norm(inputs, mean, variance, gamma, beta, layer.axis, layer.epsilon)
        return ops.cast(outputs, layer.compute_dtype)

    return call


def lean_layers(model) -> list:
    """The layers of ``model`` (nested ones too) whose gradient ``lean_ops`` changes: Keras's own
    ``BatchNormalization`` (a subclass that overrides ``call`` keeps it)."""
    base = keras.layers.BatchNormalization
    return [layer for layer in compat.layers_of(model) if isinstance(layer, base) and type(layer).call is base.call]


class LeanOps:
    """The lean operations of one fit: applied to ``model``'s layers for the duration of a block.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization()])
        >>> lean = LeanOps(model)
        >>> with lean.applied():
        ...     changed = "call" in vars(model.layers[0])
        >>> len(lean.layers), changed, "call" in vars(model.layers[0])
        (1, True, False)
    """

    def __init__(self, model):
        self.layers = lean_layers(model)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Inside the block the layers compute the lean gradient when traced in training; after it, each is
        exactly as before, however the block ends."""
        saved = [layer.__dict__.get("call", _MISSING) for layer in self.layers]
        try:
            for layer in self.layers:
                object.__setattr__(layer, "call", _lean_call(layer))
            yield
        finally:
            for layer, call in zip(self.layers, saved):
                if call is _MISSING:
                    layer.__dict__.pop("call", None)
                else:
                    object.__setattr__(layer, "call", call)


_MISSING = object()
