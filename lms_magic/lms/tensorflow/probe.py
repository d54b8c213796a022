"""Predictions without running a step: trace the train step once and replay it.

Used by the benchmarks (ResNet-50 at batch 64 on a 2-core machine) and by
tuning, where a slider move must not train anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..core.plan import Selection
from .predictor import StepPredictor


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
    predictor = StepPredictor(model, sample, Selection(min_bytes=min_bytes), host_device)
    predictor.trace(batch_size)
    started = time.perf_counter()
    prediction = predictor.predict(n_tensors, lb, batch_size)
    return StepPrediction(batch_size, prediction.peak_bytes_without_lms, prediction.peak_bytes,
                          prediction.n_tensors, prediction.swapped_bytes_per_step, prediction.candidates,
                          predictor.trace_s, time.perf_counter() - started)


def largest_batch(model, sample, memory_bytes: int, with_lms: bool, start: int = 8, limit: int = 4096,
                  **options) -> int:
    """The largest batch whose predicted peak fits ``memory_bytes`` (doubling, then bisection)."""
    predictor = StepPredictor(model, sample, Selection(min_bytes=options.pop("min_bytes", 0)),
                              options.pop("host_device", "/CPU:0"))

    def fits(batch: int) -> bool:
        prediction = predictor.predict(batch_size=batch, **options)
        peak = prediction.peak_bytes if with_lms else prediction.peak_bytes_without_lms
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
