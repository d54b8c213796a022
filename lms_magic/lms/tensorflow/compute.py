"""A train step's compute time, estimated where none was measured: its matrix FLOPs at the device's rate.

The convolutions and matrix products of a traced step (forward and backward) are counted from their
shapes; element-wise work is left out (it is bound by memory, and small beside them). The rate is
TensorFlow's own on the device, timed once per process on a float32 matrix product. Convolutions run
below a matrix product's rate, so the estimate is a lower bound on the step's compute, and a step-time
ratio made with it an upper bound.
"""

from __future__ import annotations

import functools
import math
import time

import tensorflow as tf

# 2-D convolutions: where the filter's shape is (an input, or the output for a filter gradient) and the tensor
# of the forward pass's output side (the output, or the gradient flowing back), whose every element costs
# kh * kw * (input channels, or 1 for a depthwise one) multiply-adds
_CONVOLUTIONS = {"Conv2D": ("input", 1), "_FusedConv2D": ("input", 1), "Conv2DBackpropInput": ("input", 1),
                 "Conv2DBackpropFilter": ("output", 0), "DepthwiseConv2dNative": ("input", 1),
                 "DepthwiseConv2dNativeBackpropInput": ("input", 1),
                 "DepthwiseConv2dNativeBackpropFilter": ("output", 0)}
_PRODUCTS = frozenset({"MatMul", "_FusedMatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"})


def _shape(tensor, batch_size) -> tuple[int, ...] | None:
    from .rescale import sized_dims

    if tensor.shape.rank is None:
        return None
    dims = sized_dims(tensor, batch_size)
    return None if any(dim is None for dim in dims) else tuple(dims)


def op_flops(op, batch_size: int | None) -> int:
    """The multiply-adds (times two) of a convolution or matrix product op; 0 for any other op or unknown shapes.

    A convolution's work is its larger activation (output, or the input of a backprop) times the filter's
    spatial size and input channels; a product's, its output times the contracted size (for an einsum, the
    size that makes the operands' and output's element counts consistent).
    """
    if op.type not in _CONVOLUTIONS and op.type not in _PRODUCTS:
        return 0
    try:
        shapes = [_shape(tensor, batch_size) for tensor in list(op.inputs) + list(op.outputs)]
    except (ValueError, TypeError):
        return 0
    if any(shape is None for shape in shapes) or not op.outputs:
        return 0
    if op.type in _CONVOLUTIONS:
        side, position = _CONVOLUTIONS[op.type]
        inputs, outputs = shapes[:len(op.inputs)], shapes[len(op.inputs):]
        filters = (inputs if side == "input" else outputs)[position]
        activation = outputs[0] if op.type in ("Conv2D", "_FusedConv2D", "DepthwiseConv2dNative") else inputs[2]
        if len(filters) != 4:
            return 0
        per_output = filters[0] * filters[1] * (1 if "Depthwise" in op.type else filters[2])
        return 2 * math.prod(activation) * per_output
    if op.type in _PRODUCTS and len(op.inputs) >= 2:
        first, second, out = math.prod(shapes[0]), math.prod(shapes[1]), math.prod(shapes[len(op.inputs)])
        contracted = math.sqrt(first * second / out) if out else 0
        return int(2 * out * contracted)
    return 0


def step_flops(ops, batch_size: int | None) -> int:
    """The convolution and matrix FLOPs of a traced step's ops (forward, backward and optimizer)."""
    return sum(op_flops(op, batch_size) for op in ops)


def flop_ops(ops) -> list:
    """The convolutions and matrix products among ``ops``: the only ones :func:`step_flops` counts."""
    return [op for op in ops if op.type in _CONVOLUTIONS or op.type in _PRODUCTS]


@functools.cache
def device_flops_per_s(device: str, size: int = 1024, repeats: int = 3) -> float:
    """TensorFlow's float32 matrix-product rate on ``device`` (FLOP/s), timed once per process: the median of
    ``repeats`` products of two ``size`` x ``size`` matrices, after one warm-up."""
    with tf.device(device):
        a = tf.random.stateless_uniform((size, size), seed=(1, 2))
        b = tf.random.stateless_uniform((size, size), seed=(3, 4))
        tf.linalg.matmul(a, b).numpy()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            tf.linalg.matmul(a, b)[0, 0].numpy()
            times.append(time.perf_counter() - started)
    return 2 * size**3 / sorted(times)[len(times) // 2]


def step_cost(ops, batch_size: int | None, device: str):
    """A step's :class:`~lms_magic.lms.core.costs.StepCost`: its compute estimated from the matrix FLOPs of its
    ``ops`` (a lower bound, so the ratio is an upper one) and the host link's bandwidth (measured where a GPU
    is, else a stated default); None where the step has no matrix FLOPs."""
    from ...memory.bandwidth import host_link_bandwidth
    from ..core.costs import StepCost

    flops, rate = step_flops(ops, batch_size), device_flops_per_s(device)
    link = host_link_bandwidth()
    if not flops:
        return None
    return StepCost.estimated(flops / rate, f"the step's {flops / 1e9:.1f} GFLOP of convolutions and matrix products "
                                            f"at the device's matrix-product rate ({rate / 1e9:.0f} GFLOP/s)", link)
