"""Memory-lean operations on TensorFlow (``LMS(lean_ops=True)``, lms/lean.py): BatchNormalization's gradient in
one piece.

Keras 3 computes ``BatchNormalization`` unfused on TensorFlow (``ops.moments`` and
``ops.batch_normalization``), so its gradient is TensorFlow's automatic one through each of those
ops: several full-size intermediates per layer, held side by side where a residual block's two
branches are differentiated together (ResNet50's backward-pass peak: docs/lms_internals.md). Here the
forward pass is Keras's own, op for op, and the gradient is the closed form

    dx = gamma * rstd * (dy - mean(dy) - xc * rstd**2 * mean(dy * xc)),   xc = x - mean

which makes two full-size intermediates (``xc``, ``dy * xc``) where the automatic one makes four
and more. It is the same function, computed in another order: the gradients differ from Keras's
at float rounding (measured in docs/measurements.md), so it is off unless asked for. ``xc`` is computed
after the upstream gradient has arrived (its mean plus ``sum(dy) - sum(dy)``), so that neither
TensorFlow's executor nor the swap planner runs it in the forward pass.

The layers are changed for the duration of each LMS step only (their ``call``, as an instance
attribute) and are exactly as before after it, however it ends. It pays where a normalization's
gradient makes the peak (ResNet50 224x224: docs/lms_internals.md); where the peak is elsewhere, the lean
gradient's per-channel tensors can be live there and raise it by a few hundred bytes.
"""

from __future__ import annotations

import contextlib

import keras
import tensorflow as tf

from .. import lean as _lean
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


class LeanOps(_lean.LeanOps):
    """The lean operations of one fit on TensorFlow (lms/lean.py): ``lean_batch_norm`` in each trace.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization()])
        >>> len(LeanOps(model).layers)
        1
    """

    def __init__(self, model):
        super().__init__(model, lean_batch_norm, traced=lambda: not tf.executing_eagerly())
