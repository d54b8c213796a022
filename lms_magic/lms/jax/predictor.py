"""Instant predictions for any LMS setting on JAX: the step's jaxpr traced once per batch size, replayed on demand.

What ``%lms_tune`` needs on Keras's JAX backend: the jaxpr of the loss's value and gradient, made as the
``LMS`` callback makes it while it plans (``residuals.trace_step``, every value named), its
candidates (each value the backward pass reads) and the replay's peak with any prefix of them
offloaded or recomputed, memoised. ``lb`` changes nothing here: XLA schedules the copies back.
"""

from __future__ import annotations

import dataclasses
import time

from ... import internals
from ..core.plan import Selection
from ..persistent import persistent_tensors
from ..core.prediction import Prediction, PrefixPredictions
from ..options import compiled_model, whole_number
from . import compiled as xla
from .traced import JaxStep
from .rescale import rescaled
from .residuals import differentiated, moved_policy, named_residuals, trace_step


class JaxStepPredictor(PrefixPredictions):
    """Predicts a model's train-step peak on JAX for any batch size and ``n_tensors``.

    Args:
        model: a compiled Keras model (JAX backend). Its layers, loss, metrics and optimizer are built
            from ``sample`` if they are not yet, as ``fit`` builds them.
        sample: one batch ``(x, y)`` or ``(x, y, sample_weight)`` of any size (it gives the shapes and dtypes).
        selection: the static filters (``min_bytes``, layers); its ``n_tensors`` is ignored.
        recompute: "only" predicts ``LMS(recompute="only")`` (the candidates recomputed, nothing copied);
            False (the default) offloads them.

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((64,))] + [keras.layers.Dense(256, activation="relu")
        ...                           for _ in range(6)] + [keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> predictor = JaxStepPredictor(model, (np.ones((2, 64), "float32"), np.ones((2, 1), "float32")))
        >>> few, many = predictor.predict(0, batch_size=1024), predictor.predict(-1, batch_size=1024)
        >>> many.peak_bytes < few.peak_bytes == few.peak_bytes_without_lms
        True
    """

    compute_estimate = "XLA's FLOP count of the loss's value and gradient at the device's matrix-product rate"
    caveat = ("JAX: without LMS, the peak is XLA's compiled figure for this device; with LMS, on a CPU a replay of "
              "the step's operations, on a GPU or TPU XLA's step compiled with the plan's offloads (nothing moved "
              "where that holds more: docs/jax.md#how-it-plans); there the largest batches with LMS are unchecked")
    plain_peak_source = "XLA's compiled figure"

    def __init__(self, model, sample, selection: Selection | None = None, recompute=False):
        compiled_model(model)
        internals.build_for_training(model, tuple(sample))
        self.model, self.sample = model, tuple(sample)
        self.selection = selection or Selection()
        self.recompute = recompute
        self.trace_s: float | None = None
        self._layer_types = internals.layer_types(model)
        self._persistent = persistent_tensors(model)  # as the LMS callback counts them
        self.persistent_bytes = sum(tensor.nbytes for tensor in self._persistent)
        self._steps: dict[int, JaxStep] = {}
        self._traced: list[int] = []  # the batch sizes traced, in order (the others are rescaled from two)
        self._eligible: dict[int, list] = {}
        self._compiled: dict[int, int] = {}
        self._compiled_moved: dict[tuple[int, int], int | None] = {}  # (batch size, count) -> XLA's figure

    def step_function(self, batch_size: int):
        """``(inner, args)``: Keras's ``compute_loss_and_updates`` as LMS's step differentiates it, and the shapes of
        its arguments at ``batch_size`` (the variables', the sample's batched): what :meth:`trace` traces and XLA
        compiles."""
        import jax

        model = self.model
        compute = type(model).compute_loss_and_updates.__get__(model)  # the model's own, whatever wraps it later

        def inner(trainable, non_trainable, metrics, x, y, sample_weight, optimizer_variables):
            return compute(trainable, non_trainable, metrics, x, y, sample_weight, training=True,
                           optimizer_variables=optimizer_variables)

        def batch_of(array):
            return jax.ShapeDtypeStruct((batch_size,) + tuple(array.shape[1:]), array.dtype)

        x, y, sample_weight = (jax.tree_util.tree_map(batch_of, part) if part is not None else None
                               for part in self.sample + (None,) * (3 - len(self.sample)))
        optimizer = model.optimizer.variables if model.optimizer is not None else []
        # the variables' shapes only (tracing needs no values): after a JAX fit that raised, Keras leaves them
        # without values until the next fit, and an out-of-memory error is explained just then
        state = [[jax.ShapeDtypeStruct(tuple(v.shape), v.dtype) for v in variables]
                 for variables in (model.trainable_variables,
                                                                 model.non_trainable_variables,
                                                                 model.metrics_variables, optimizer)]
        return inner, (state[0], state[1], state[2], x, y, sample_weight, state[3])

    @property
    def traced_batches(self) -> tuple[int, ...]:
        """The batch sizes traced, in order (every other one is rescaled from the first two)."""
        return tuple(self._traced)

    def trace(self, batch_size: int) -> JaxStep:
        """The step's jaxpr at ``batch_size``, as LMS plans on it: traced for the first two batch sizes asked
        for, and from those two for the others where every size is a line in the batch (``rescale.py``)."""
        whole_number("batch_size", batch_size, 1)
        if batch_size not in self._steps:
            step = None
            if len(self._traced) >= 2:
                (first, second), types = self._traced[:2], self._layer_types
                step = rescaled(self._steps[first], first, self._steps[second], second, batch_size, types)
            if step is None:
                started = time.perf_counter()
                inner, args = self.step_function(batch_size)
                step = trace_step(named_residuals(inner), args, self._layer_types)
                self.trace_s = time.perf_counter() - started
                self._traced.append(batch_size)
            self._steps[batch_size] = step
        return self._steps[batch_size]

    def traced_anew(self, batch_size: int) -> JaxStep:
        """The step traced at ``batch_size`` itself, never read off two traces: what :meth:`trace`'s rescaled
        steps are held to. Not kept."""
        inner, args = self.step_function(batch_size)
        return trace_step(named_residuals(inner), args, self._layer_types)

    def plain_peak_bytes(self, batch_size: int) -> int:
        """XLA's own figure for the step without LMS at ``batch_size``: Keras's train step compiled for JAX's
        default device (``compiled.step_bytes``: arguments + outputs - donated + temporaries, the temporaries'
        region where a GPU pool grows). XLA fuses element-wise chains the replay keeps apart, on a GPU far more
        than on a CPU (docs/explain.md#where-it-runs): this is the figure that fits or not. The replay's where the
        compiler gives none. Compiled once per batch size.

        Example:
            >>> import keras, numpy as np
            >>> model = keras.Sequential([keras.Input((64,))] + [keras.layers.Dense(256, activation="relu")
            ...                           for _ in range(4)] + [keras.layers.Dense(1)])
            >>> model.compile("sgd", "mse")
            >>> predictor = JaxStepPredictor(model, (np.ones((2, 64), "float32"), np.ones((2, 1), "float32")))
            >>> predictor.plain_peak_bytes(4096) > predictor.plain_peak_bytes(512) > predictor.persistent_bytes
            True
        """
        whole_number("batch_size", batch_size, 1)
        if batch_size not in self._compiled:
            self._compiled[batch_size] = self._compiled_bytes(batch_size)
        return self._compiled[batch_size]

    def _compiled_bytes(self, batch_size: int) -> int:
        inner, args = self.step_function(batch_size)
        compiled = xla.step_bytes(self.model, inner, args)
        replayed = PrefixPredictions.predict  # where XLA gives no figure (not this class's, which reads this one)
        return replayed(self, 0, 1, batch_size).peak_bytes if compiled is None else compiled

    def predict(self, n_tensors: int | None = -1, lb: int = 1, batch_size: int = 32) -> Prediction:
        """The replay's prediction (``PrefixPredictions.predict``); on a GPU or TPU, held to XLA as LMS holds its
        plan (``backend.JaxBackend``): the step with the first ``n_tensors`` candidates offloaded (or recomputed)
        compiled, against the model's own (:meth:`plain_peak_bytes`, also the figure with nothing moved); where it
        holds as much or more on the device, nothing moves. Compiled once per batch size and count."""
        prediction = super().predict(n_tensors, lb, batch_size)
        if n_tensors is None or not xla.places_apart():
            return prediction
        own = self.plain_peak_bytes(batch_size)
        if not prediction.n_tensors:
            return dataclasses.replace(prediction, peak_bytes=own, peak_bytes_without_lms=own)
        key = (batch_size, prediction.n_tensors)
        if key not in self._compiled_moved:
            self._compiled_moved[key] = self._compiled_moved_bytes(batch_size, prediction.n_tensors)
        moved = self._compiled_moved[key]
        if moved is None:
            return prediction
        if moved >= own:
            return Prediction(batch_size, 0, lb, own, own, 0, prediction.candidates, self.persistent_bytes)
        return dataclasses.replace(prediction, peak_bytes=moved, peak_bytes_without_lms=own)

    def _compiled_moved_bytes(self, batch_size: int, count: int) -> int | None:
        from .backend import host_memory_kind

        names = frozenset(c.tensor for c in self.eligible(1, batch_size)[:count])
        inner, args = self.step_function(batch_size)
        policy = moved_policy(names, self.recompute, host_memory_kind())
        return xla.step_bytes(self.model, named_residuals(inner), args, policy)

    def eligible(self, lb: int, batch_size: int) -> list:
        whole_number("lb", lb, 1)
        if batch_size not in self._eligible:
            self._eligible[batch_size] = self.selection.eligible(self.trace(batch_size).candidates)
        return self._eligible[batch_size]

    def transient_peak(self, lb: int, batch_size: int, count: int) -> int:
        return self.trace(batch_size).transient_peak(self.eligible(lb, batch_size)[:count])

    def explain(self, n_tensors: int, lb: int = 1, batch_size: int = 32) -> dict:
        """``stats["peak"]`` (``core/peak.py``) with the first ``n_tensors`` candidates moved (-1: all): the
        phase and equation of the peak, its bytes by kind, the 10 largest live tensors, the timeline."""
        count = self._count(n_tensors, lb, batch_size)
        return self.trace(batch_size).explain(self.eligible(lb, batch_size)[:count], self._persistent)

    def estimated_compute_s(self, batch_size: int, device: str | None = None) -> float:
        """XLA's FLOP count of the loss's value and gradient at ``batch_size``, at JAX's matrix-product rate on
        its default device (``compute.py``): a lower bound on the step's compute time. ``device`` is unused."""
        from .compute import device_flops_per_s, step_flops

        return step_flops(*differentiated(*self.step_function(batch_size))) / device_flops_per_s()
