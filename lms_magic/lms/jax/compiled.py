"""XLA's own figure for a train step's memory: Keras's train step compiled for JAX's device, its
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


def pool_grows() -> bool:
    """Whether JAX's GPU pool grows on demand (``XLA_PYTHON_CLIENT_PREALLOCATE=false`` with its BFC allocator), so
    that a step's temporaries hold a whole region (``core/bfc.py``); JAX takes its pool whole by default."""
    import os

    import jax

    allocator = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").lower()
    preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower()
    return (jax.devices()[0].platform == "gpu" and allocator in ("default", "bfc")
            and preallocate in ("false", "0"))


def step_bytes(model, inner, args, policy=None) -> int | None:
    """XLA's own figure for the train step ``fit`` runs (Keras's ``train_step`` with the state donated), the
    model's loss and gradient as ``inner`` computes them (under ``jax.checkpoint`` with ``policy``: LMS's
    offloads or recomputes), at ``args``' shapes (``inner``'s arguments: the variables, the batch, the optimizer
    state): ``memory_analysis()``'s arguments + outputs - aliased + temporaries, compiled for JAX's default
    device. XLA takes the temporaries as one allocation: on a pool that grows on demand, the region that holds
    them (``core/bfc.py``). What XLA keeps in host memory is not counted. None where the backend gives no figure.

    The loss and gradient alone would count the predictions they return (a causal LM's logits) and leave out
    the optimizer's and the metrics' work: the whole step is what the device holds (docs/measurements_gpu.md).

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256), keras.layers.Dense(1)])
        >>> model.compile("adam", "mse")
        >>> x, y = np.ones((512, 64), "float32"), np.ones((512, 1), "float32")
        >>> model.fit(x, y, epochs=1, verbose=0) and None
        >>> own = model.compute_loss_and_updates  # read before the step replaces it with ``inner``
        >>> def inner(trainable, non_trainable, metrics, x, y, sample_weight, optimizer_variables):
        ...     return own(trainable, non_trainable, metrics, x, y, sample_weight, training=True,
        ...                optimizer_variables=optimizer_variables)
        >>> state = [list(v) for v in (model.trainable_variables, model.non_trainable_variables,
        ...          model.metrics_variables)]
        >>> step_bytes(model, inner, (*state, x, y, None, list(model.optimizer.variables))) >= 512 * 256 * 4
        True
    """
    import jax

    from ... import internals
    from ..core.bfc import chunk_bytes

    trainable, non_trainable, metrics, x, y, sample_weight, optimizer = shape_specs(args)
    checkpointed = inner if policy is None else jax.checkpoint(inner, policy=policy)

    def compute(trainable, non_trainable, metrics, x, y, sample_weight, training=True, optimizer_variables=None):
        return checkpointed(trainable, non_trainable, metrics, x, y, sample_weight, optimizer_variables)

    train_step = type(model).train_step.__get__(model)  # the model's own, not a step LMS wraps it in
    try:
        with internals.instance_attribute_replaced(model, "compute_loss_and_updates", compute):
            lowered = jax.jit(train_step, donate_argnums=0).lower(
                (trainable, non_trainable, optimizer, metrics), (x, y, sample_weight))
        analysis = lowered.compile().memory_analysis()
    except Exception:  # a backend without it
        return None
    if analysis is None:
        return None
    temporaries = int(analysis.temp_size_in_bytes)
    if temporaries and pool_grows():
        temporaries = chunk_bytes(temporaries)
    return int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes - analysis.alias_size_in_bytes
               + temporaries)
