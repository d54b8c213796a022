"""A JAX step's compute time, estimated where none was measured: XLA's FLOP count at the device's rate.

The FLOPs are XLA's own cost analysis of the lowered loss-and-gradient function (forward and backward;
the optimizer's update is not in it, nor is it large beside them); the rate is a float32 matrix product's
on JAX's default device, timed once per process. Most of a step runs below a matrix product's rate, so
the estimate is a lower bound on the step's compute, and a step-time ratio made with it an upper bound.
"""

from __future__ import annotations

import functools
import time


def step_flops(function, specs) -> float:
    """XLA's FLOP count of ``function`` at ``specs`` (``jax.ShapeDtypeStruct``s), or 0 where it gives none.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> step_flops(lambda a, b: a @ b, (jax.ShapeDtypeStruct((64, 32), "float32"),
        ...                                  jax.ShapeDtypeStruct((32, 16), "float32")))
        65536.0
    """
    import jax

    analysis = jax.jit(function).lower(*specs).cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per computation
        analysis = analysis[0] if analysis else {}
    return float((analysis or {}).get("flops", 0.0))


@functools.cache
def device_flops_per_s(size: int = 1024, repeats: int = 3) -> float:
    """JAX's float32 matrix-product rate on its default device (FLOP/s), timed once per process: the median of
    ``repeats`` products of two ``size`` x ``size`` matrices, after one compiled warm-up."""
    import jax
    import jax.numpy as jnp

    a = jax.random.uniform(jax.random.key(1), (size, size))
    b = jax.random.uniform(jax.random.key(2), (size, size))
    product = jax.jit(jnp.matmul)
    product(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        product(a, b).block_until_ready()
        times.append(time.perf_counter() - started)
    return 2 * size**3 / sorted(times)[len(times) // 2]


def step_cost(function, specs, batch_shards: int = 1):
    """The :class:`~lms_magic.lms.core.costs.StepCost` of ``function`` (a step's loss and gradient, as
    ``residuals.differentiated`` makes it) at ``specs`` (one device's share of the batch where it is split
    ``batch_shards`` ways): XLA's FLOP count at the device's
    matrix-product rate (a lower bound on the compute, so the step ratio made with it is an upper one) and the
    host link's bandwidth (measured where a GPU is, else a stated default); None where XLA counts no FLOPs. Made
    outside any trace (it times a product on the device)."""
    from ...memory.bandwidth import host_link_bandwidth
    from ..core.costs import StepCost
    from .residuals import per_device_specs

    flops, rate = step_flops(function, per_device_specs(specs, batch_shards)), device_flops_per_s()
    if not flops:
        return None
    link = host_link_bandwidth()
    return StepCost.estimated(flops / rate, f"XLA's {flops / 1e9:.1f} GFLOP for the loss and gradient at the device's "
                                            f"matrix-product rate ({rate / 1e9:.0f} GFLOP/s)", link)
