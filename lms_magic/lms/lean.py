"""Memory-lean operations (``LMS(lean_ops=True)``), the part no framework owns: which layers change, and
their ``call`` swapped for the duration of an LMS step.

Keras 3 computes ``BatchNormalization`` unfused on TensorFlow and on PyTorch, so its gradient is the
framework's automatic one through each of its ops: several full-size intermediates per layer. Each
framework's module gives the normalization with a lean gradient (``tensorflow/lean.py``: a closed form
in TensorFlow ops; ``torch/lean.py``: PyTorch's fused kernel); here a layer in training calls it with
Keras's own statistics for the moving averages. Results differ from Keras's at float rounding
(docs/lms_modes.md), so it is off unless asked for.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Iterator

import keras

from .. import internals


def lean_layers(model) -> list:
    """The layers of ``model`` (nested ones too) whose gradient ``lean_ops`` changes: Keras's own
    ``BatchNormalization`` (a subclass that overrides ``call`` keeps it)."""
    base = keras.layers.BatchNormalization
    return [layer for layer in internals.layers_of(model) if isinstance(layer, base) and type(layer).call is base.call]


def lean_call(layer, normalize: Callable, traced: Callable[[], bool] = lambda: True,
              statistics: Callable[[], ContextManager] = contextlib.nullcontext):
    """``layer.call`` (a Keras ``BatchNormalization``) normalizing with ``normalize(x, mean, variance, gamma,
    beta, axis, epsilon)`` in training, Keras's statistics computed inside ``statistics()``; Keras's own call
    where it does something else (inference, a mask, renorm, synchronized statistics, not trainable, or
    ``traced()`` false)."""
    plain = type(layer).call.__get__(layer)

    def call(inputs, training=None, mask=None):
        if not (training and layer.trainable) or mask is not None or getattr(layer, "renorm", False) \
                or getattr(layer, "synchronized", False) or not traced():
            return plain(inputs, training=training, mask=mask)
        ops = keras.ops
        inputs = ops.cast(inputs, keras.backend.result_type(inputs.dtype, "float32"))
        axes = [a for a in range(len(inputs.shape)) if a != layer.axis % len(inputs.shape)]
        with statistics():
            mean, variance = ops.moments(inputs, axes=axes)  # Keras's call: ops.moments(inputs, axes=...)
        layer.moving_mean.assign(ops.cast(layer.moving_mean, inputs.dtype) * layer.momentum
                                 + mean * (1.0 - layer.momentum))
        layer.moving_variance.assign(ops.cast(layer.moving_variance, inputs.dtype) * layer.momentum
                                     + variance * (1.0 - layer.momentum))
        gamma = ops.cast(layer.gamma, inputs.dtype) if layer.scale else None
        beta = ops.cast(layer.beta, inputs.dtype) if layer.center else None
        outputs = normalize(inputs, mean, variance, gamma, beta, layer.axis, layer.epsilon)
        return ops.cast(outputs, layer.compute_dtype)

    return call


class LeanOps:
    """The lean operations of one fit: applied to ``model``'s layers for the duration of a block.

    Args:
        model: the Keras model.
        normalize: the framework's normalization with a lean gradient (see ``lean_call``).
        traced: whether the layer's call runs in the step LMS changes (TensorFlow: inside a trace).
            Defaults to always.
        statistics: a context for Keras's batch statistics, which feed the moving averages (PyTorch:
            ``torch.no_grad``, so autograd keeps nothing for them). Defaults to none.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization()])
        >>> lean = LeanOps(model, normalize=None)
        >>> with lean.applied():
        ...     changed = "call" in vars(model.layers[0])
        >>> len(lean.layers), changed, "call" in vars(model.layers[0])
        (1, True, False)
    """

    def __init__(self, model, normalize: Callable, traced: Callable[[], bool] = lambda: True,
                 statistics: Callable[[], ContextManager] = contextlib.nullcontext):
        self.layers = lean_layers(model)
        self._normalize, self._traced, self._statistics = normalize, traced, statistics

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Inside the block the layers compute the lean gradient in training; after it, each is exactly as
        before, however the block ends."""
        with internals.layer_calls_replaced(self.layers, lambda layer, call: lean_call(
                layer, self._normalize, self._traced, self._statistics)):
            yield
