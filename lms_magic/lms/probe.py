"""Predictions without running a step: trace the train step once and replay it.

Used by the benchmarks (ResNet-50 at batch 64 on a 2-core machine) and by
tuning, where a slider move must not train anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import tensorflow as tf

from .plan import Selection
from .predict import TracedStep, variables_bytes
from .tensorflow import find_candidates, layer_resolver


@dataclass
class StepPrediction:
    """Predicted device memory of one train step at one batch size (bytes)."""

    batch_size: int
    peak_bytes_without_lms: int
    peak_bytes_with_lms: int
    swapped_tensors: int
    swapped_bytes_per_step: int
    candidates: int
    trace_s: float
    plan_s: float


def _with_batch(spec, batch_size: int):
    return tf.TensorSpec([batch_size] + list(spec.shape[1:]), spec.dtype)


def predict_step(model, sample, batch_size: int, n_tensors: int = -1, lb: int = 1, min_bytes: int = 0,
                 host_device: str = "/CPU:0") -> StepPrediction:
    """Predicts the device peak of ``model``'s train step with and without LMS.

    Args:
        model: a compiled Keras model (TensorFlow backend).
        sample: one batch ``(x, y)`` of any size: it gives the shapes and dtypes.
        batch_size: the batch size to predict for.
        n_tensors, lb, min_bytes, host_device: as for :class:`lms_magic.LMS`.

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
        ...                           keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> small = predict_step(model, (np.ones((2, 64), "float32"), np.ones((2, 1), "float32")), 1024)
        >>> small.peak_bytes_with_lms <= small.peak_bytes_without_lms
        True
    """
    if not model.compiled:
        raise ValueError("predict_step needs a compiled model: call model.compile(...) first")
    specs = tf.nest.map_structure(lambda t: _with_batch(tf.TensorSpec.from_tensor(tf.convert_to_tensor(t)),
                                                        batch_size), tuple(sample))
    started = time.perf_counter()
    graph = tf.function(model.train_step, autograph=False).get_concrete_function(specs).graph
    traced = time.perf_counter()
    ops = graph.get_operations()
    candidates, _ = find_candidates(ops, layer_resolver(model), lb, batch_size)
    chosen = Selection(n_tensors=n_tensors, min_bytes=min_bytes).select([c.candidate for c in candidates])
    by_tensor = {c.candidate.tensor: c for c in candidates}
    input_bytes = [int(s.shape.num_elements()) * s.dtype.size for s in tf.nest.flatten(specs)]
    step = TracedStep(ops, batch_size, host_device, input_bytes)
    persistent = variables_bytes(model)
    with_lms = persistent + step.predicted_transient_peak([by_tensor[c.tensor] for c in chosen])
    without = persistent + step.predicted_transient_peak([])
    return StepPrediction(batch_size, without, with_lms, len(chosen), sum(c.nbytes for c in chosen),
                          len(candidates), traced - started, time.perf_counter() - traced)


def largest_batch(model, sample, memory_bytes: int, with_lms: bool, start: int = 8, limit: int = 4096,
                  **options) -> int:
    """The largest batch whose predicted peak fits ``memory_bytes`` (doubling, then bisection)."""
    def fits(batch: int) -> bool:
        prediction = predict_step(model, sample, batch, **options)
        peak = prediction.peak_bytes_with_lms if with_lms else prediction.peak_bytes_without_lms
        return peak <= memory_bytes

    if not fits(1):
        return 0
    low, high = 1, start
    while high <= limit and fits(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
