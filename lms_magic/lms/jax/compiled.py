"""XLA's own figure for a train step's memory: the loss and gradient compiled for JAX's device, its
``memory_analysis()``. The replay (``traced.py``) keeps every equation's output until its last reader; XLA fuses
element-wise chains away, far more on a GPU than on a CPU, and on a GPU it rematerializes values to fit the limit
of JAX's memory pool (docs/explain.md#where-it-runs): where the two differ, this is the figure that fits or not."""

from __future__ import annotations

from .residuals import shape_specs


def places_apart() -> bool:
    """Whether XLA keeps JAX's default device's memory apart from the host's: on a GPU or TPU, not on a CPU
    (there one memory holds both, and a compiled step's figures count an offloaded value where it was).

    Example:
        >>> import jax
        >>> places_apart() == (jax.devices()[0].platform != "cpu")
        True
    """
    import jax

    return jax.devices()[0].platform != "cpu"


def compiled_bytes(inner, args, policy=None) -> int | None:
    """XLA's own figure for ``inner``'s value and gradient at ``args``' shapes (the step :func:`trace_step`
    replays), compiled for JAX's default device: ``memory_analysis()``'s arguments + outputs + temporaries -
    aliased, on the device (what XLA keeps in host memory is not counted). None where the backend gives none.
    XLA fuses element-wise chains the replay keeps apart, on a GPU far more than on a CPU, and there it
    rematerializes what does not fit its pool's limit (docs/explain.md#where-it-runs). With ``policy`` (LMS's
    ``jax.checkpoint`` policy, ``residuals.residual_policy``): the step LMS runs, with its offloads or recomputes.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> def inner(w, x):
        ...     return jnp.sum(jnp.tanh(x @ w)), ()
        >>> compiled_bytes(inner, (jnp.ones((64, 64)), jnp.ones((256, 64)))) >= (64 * 64 * 2 + 256 * 64) * 4
        True
    """
    import jax

    # inner's own value and gradient, not the replay's function under its jax.checkpoint: XLA sizes that one
    # for a step the replay does not run (on a GPU, far more than the step needed: docs/measurements_gpu.md)
    function = jax.value_and_grad(inner if policy is None else jax.checkpoint(inner, policy=policy), has_aux=True)
    try:
        analysis = jax.jit(function).lower(*shape_specs(args)).compile().memory_analysis()
    except Exception:  # a backend without it
        return None
    if analysis is None:
        return None
    return int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
               - analysis.alias_size_in_bytes)


def compiled_step_bytes(inner, args, persistent, policy=None) -> int | None:
    """:func:`compiled_bytes` and the optimizer's state among ``persistent`` (``persistent.persistent_tensors``):
    the loss and gradient do not read it, the train step holds it. None where XLA gives no figure."""
    compiled = compiled_bytes(inner, args, policy)
    if compiled is None:
        return None
    return compiled + sum(tensor.nbytes for tensor in persistent if tensor.kind == "optimizer_state")
