"""Memory-lean operations on PyTorch (``LMS(lean_ops=True)``, lms/lean.py): BatchNormalization in one kernel.

Keras 3's PyTorch backend normalizes as ``x.subtract(mean).mul_(rsqrt(variance + epsilon) * gamma)
.add_(beta)`` with the statistics of ``ops.moments``, so autograd keeps the centred input (a full-size
copy: the in-place product needs its original value for ``gamma``'s gradient) besides the input the
statistics read, and differentiates each op on its own. Here a layer in training normalizes with
``torch.nn.functional.batch_norm`` in training mode (its own batch statistics: the same function, in
ATen's or cuDNN's fused kernel), which keeps the input and per-channel statistics only and computes
its gradient in one kernel. Keras's ``ops.moments`` still feed the moving averages, without a
gradient, so those are exactly Keras's; the outputs and gradients differ at float rounding.
"""

from __future__ import annotations

import torch

from .. import lean as _lean


def lean_batch_norm(x, mean, variance, gamma, beta, axis: int, epsilon: float):
    """``x`` normalized by its own batch statistics per channel of ``axis`` (``mean`` and ``variance``,
    Keras's, are for the moving averages only), scaled by ``gamma`` and shifted by ``beta`` (None: not).

    Example:
        >>> import torch
        >>> x = torch.randn(8, 4, 4, 3, generator=torch.Generator().manual_seed(0)) * 2 + 3
        >>> y = lean_batch_norm(x, None, None, None, None, -1, 1e-3)  # channels last: 3 channels
        >>> bool(torch.allclose(y.mean(dim=(0, 1, 2)), torch.zeros(3), atol=1e-5)), tuple(y.shape)
        (True, (8, 4, 4, 3))
    """
    axis = axis % x.ndim
    moved = x.movedim(axis, 1) if axis != 1 else x
    y = torch.nn.functional.batch_norm(moved, None, None, gamma, beta, training=True, momentum=0.0, eps=epsilon)
    return y.movedim(1, axis) if axis != 1 else y


class LeanOps(_lean.LeanOps):
    """The lean operations of one fit on PyTorch: ``lean_batch_norm`` in each LMS step, Keras's statistics
    for the moving averages computed without a gradient.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization()])
        >>> len(LeanOps(model).layers)
        1
    """

    def __init__(self, model):
        super().__init__(model, lean_batch_norm, statistics=torch.no_grad)
