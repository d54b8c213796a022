"""One train step's predicted device peak at one batch size, with and without LMS: ``predict_step``.

The step's predictor as ``explain_fit`` makes it (``Framework.predictor``: TensorFlow's traced graph, JAX's jaxpr,
PyTorch's step run at two batch sizes), asked once. Nothing is trained.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class StepPrediction:
    """Predicted device memory of one train step at one batch size (bytes)."""

    batch_size: int
    peak_bytes_without_lms: int
    peak_bytes_with_lms: int
    swapped_tensors: int
    swapped_bytes_per_step: int
    candidates: int
    trace_s: float  # making the predictor, the step at this batch (a trace on TensorFlow and JAX) and its candidates
    plan_s: float  # the prediction with LMS after it


def predict_step(model, sample, batch_size: int, n_tensors: int = -1, lb: int = 1, min_bytes: int = 0,
                 host_device: str | None = None) -> StepPrediction:
    """Predicts the device peak of ``model``'s train step with and without LMS.

    Args:
        model: a compiled Keras model.
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
    from ..framework import framework
    from ..options import LmsOptions

    started = time.perf_counter()
    predictor = framework().predictor(model, tuple(sample), LmsOptions(min_bytes=min_bytes, host_device=host_device),
                                      False, False, False)
    predictor.eligible(lb, batch_size)  # the step at this batch made (traced, or run), its candidates found
    traced = time.perf_counter()
    prediction = predictor.predict(n_tensors, lb, batch_size)
    return StepPrediction(batch_size, prediction.peak_bytes_without_lms, prediction.peak_bytes, prediction.n_tensors,
                          prediction.swapped_bytes_per_step, prediction.candidates, traced - started,
                          time.perf_counter() - traced)


__all__ = ["StepPrediction", "predict_step"]
