"""Instant predictions for any LMS setting: trace the train step once per batch size, replay on demand.

The train step is traced once per batch size (seconds for ResNet-50 on 2 cores;
a trace with an unknown batch dimension would be cheaper, but its other unknown
dimensions would be sized as the batch, which over-predicts large batches
several-fold), with its replay nodes built once; each (``lb``, batch size) gets
its candidates once, and every prediction after that is one liveness replay
(about 50 ms for ResNet-50's 9,000 ops), memoised. This is what the tuning
sliders call, and what ``predict_step`` and the budget search use. With
``rescale_batches`` (``explain_fit``'s searches over batch sizes, the tuner's
batch slider), one trace serves every batch size: it is made at a prime batch size
that divides none of the model's dimensions, the batch asked for is sized from it by
TensorFlow's shape inference (``rescale.dims_at``; where that is refused, traced), and
each tensor dimension that differs between those two grows linearly with the batch
(``rewrite.Rescaled``), which predicts what a trace at another batch does, to the
byte on the tested models. Where every tensor's bytes are then a line in the batch,
a prediction at a batch read off the two needs no replay of its own: one walk at
the first batch size, with the second's sizes too, gives the live bytes at every
step as lines (``core/batch_lines.py``).
"""

from __future__ import annotations

import contextlib
import functools
import time

import tensorflow as tf

from ... import internals
from ..core.batch_lines import lines_hold, resized_lines
from ..core.plan import Selection
from ..core.prediction import Prediction, PrefixPredictions
from ..options import compiled_model, whole_number
from . import ordering
from .lean import LeanOps
from ..persistent import persistent_tensors
from .rescale import Rescaled, described_by_keras, dims_at, dims_scaled, fixed_dims, prime_batch, suits, unseen_dims
from .traced import TracedStep
from .recompute import plan_recomputes
from .rewrite import find_candidates, layer_resolver, resized


def _specs(sample, batch_size: int):
    """TensorSpecs of a batch of ``batch_size`` samples shaped like ``sample``'s."""
    def spec(value):
        tensor = tf.convert_to_tensor(value)
        return tf.TensorSpec([batch_size] + tensor.shape.as_list()[1:], tensor.dtype)

    return tf.nest.map_structure(spec, tuple(sample))


def _input_bytes(specs) -> list[int]:
    """The bytes of each tensor of a batch of ``specs``, as the iterator yields them."""
    return [spec.shape.num_elements() * spec.dtype.size for spec in tf.nest.flatten(specs)]


class TensorFlowStepPredictor(PrefixPredictions):
    """Predicts a model's train-step peak for any batch size, ``n_tensors`` and ``lb``.

    Args:
        model: a compiled Keras model (TensorFlow backend).
        sample: one batch ``(x, y)`` or ``(x, y, sample_weight)`` of any size
            (it gives the shapes and dtypes).
        selection: the static filters (``min_bytes``, layers); its
            ``n_tensors`` is ignored. Defaults to all sizes, all layers.
        host_device: where swapped tensors wait. Defaults to "/CPU:0".
        order_backward: the backward pass one layer at a time where that lowers the peak with every
            eligible candidate swapped, as ``LMS(order_backward=True)`` decides it (at lb=1). Defaults to False.
        lean_ops: the step traced with ``LMS(lean_ops=True)``'s BatchNormalization gradient. Defaults to False.
        recompute: "only" predicts ``LMS(recompute="only")``: the candidates are those that can be computed
            again from tensors the backward pass holds (``recompute.plan_recomputes``), the first
            ``n_tensors`` of them recomputed, nothing copied. Defaults to False (swaps).
        rescale_batches: every batch size read off one trace and the batch asked for first (see ``trace``), as
            ``explain_fit`` and the tuner's batch slider ask; else each batch size traced. Defaults to False.

    Raises:
        ValueError: the model is not compiled, or the sample has no batch.

    Its state is its arguments (7), the traces it keeps by batch size and their reading (the traced steps,
    the lines read off two of them, the kernels' scratch measured), and a cache of each prediction asked for:
    the sliders ask the same predictions again and again, each a replay.

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((64,))] + [keras.layers.Dense(256, activation="relu")
        ...                           for _ in range(6)] + [keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> predictor = TensorFlowStepPredictor(model, (np.ones((2, 64), "float32"), np.ones((2, 1), "float32")))
        >>> few, many = predictor.predict(0, batch_size=1024), predictor.predict(-1, batch_size=1024)
        >>> many.peak_bytes < few.peak_bytes == few.peak_bytes_without_lms
        True
    """

    compute_estimate = "the traced step's matrix FLOPs at the device's rate"  # what estimated_compute_s counts

    def __init__(self, model, sample, selection: Selection | None = None, host_device: str = "/CPU:0",
                 order_backward: bool = False, lean_ops: bool = False, recompute=False, rescale_batches: bool = False):
        compiled_model(model)
        self.rescale_batches = rescale_batches
        self.recompute = recompute
        self.selection = selection or Selection()
        self.host_device = host_device
        self.model, self.sample = model, sample
        self.trace_s: float | None = None  # the last trace's seconds
        self._fixed: set[int] | None = None  # the model's dimensions that are not the batch (_fixed_dims)
        self._importable = True  # whether a batch size may be sized by the import (False: the model's dims unknown)
        self._layer_of = layer_resolver(model)
        self.order_backward, self.lean_ops = order_backward, lean_ops
        self._steps: dict[int, TracedStep] = {}  # the step LMS plans on (ordered where that is lower)
        self._plain: dict[int, TracedStep] = {}  # the step as Keras traces it (the "without LMS" figures)
        self._orders: dict[int, tuple] = {}  # batch size -> find_candidates' order, where ordered
        self._candidates: dict[tuple[int, int], list] = {}
        self._flop_ops: dict = {}  # traced graph -> its convolutions and matrix products (compute.flop_ops)
        self._found_off_traces: dict[int, tuple] = {}  # lb -> the candidates read off two traces, resized's memo
        self._replays: dict[tuple[int, int, int], object] = {}  # explained replays, memoised
        self._traced: list[int] = []  # the batch sizes traced, in order (the first two give the others: trace)
        self._source = None  # what _rescale_source found (False: the two traces differ)
        self._without_lean: TensorFlowStepPredictor | None = None  # with lean_ops: the predictor without (sized_like)
        # where the peaks are read off lines (every tensor of the two traces grows linearly with the batch, and
        # in place as at both): the batch sizes the lines do not serve (core/batch_lines.py); else None
        self._coincidences: set[int] | None = None
        self._lines: dict[tuple, object] = {}  # (lb, the moved tensors' names) -> LiveLines (or None: not lines)
        self._found_at_batch: dict[tuple[int, int], list] = {}  # (lb, batch) -> every candidate, eligible or not
        self._by_name: dict[tuple[int, int], dict] = {}  # (lb, traced batch) -> its candidates by tensor name
        self.scratch = None  # each kernel's scratch as measured on the device (use_kernel_scratch), or None

    @functools.cached_property
    def _persistent(self) -> list:
        """The weights, optimizer state and metric variables (``persistent_tensors``), read at the first use: after
        the first trace has built the model's optimizer they are read off it, before that off a built copy."""
        return persistent_tensors(self.model)

    @functools.cached_property
    def persistent_bytes(self) -> int:
        """The bytes of the weights, optimizer state and metric variables."""
        return sum(tensor.nbytes for tensor in self._persistent)

    def layer_path(self, op_name: str) -> str:
        """The layers an op of the step was made in, outermost first ("model/block/attention")."""
        return self._layer_of.path(op_name)

    def use_kernel_scratch(self, scratch) -> None:
        """Each kernel's scratch as measured (``core.scratch.KernelScratch``) held at its op in every replay from
        now on (``TracedStep.with_scratch``); the replays made before are made again, and each batch size is
        replayed (not read off lines: a scratch sized by the caches is not a line in the batch)."""
        self.scratch = scratch
        for step in {id(step): step for step in (*self._steps.values(), *self._plain.values())}.values():
            step.with_scratch(scratch)
        self._replays.clear()
        self._lines.clear()
        if scratch is not None and scratch.ops:  # a kernel's scratch need not be a line in the batch: replays
            self._coincidences = None

    def trace(self, batch_size: int) -> TracedStep:
        """The train step at ``batch_size`` (once per batch size): traced, or with ``rescale_batches`` (and no
        ``order_backward``) read off two steps: the first traced at a prime near the batch asked for, the second
        sized by TensorFlow's shape inference where that holds (``rescale.dims_at``; else traced), every other batch
        size read off those two (``Rescaled``: each dimension that differs between them grows linearly with the
        batch) where their ops correspond by name."""
        if batch_size not in self._steps and self.rescale_batches and not self.order_backward:
            self._read_off_traces(batch_size)
        if batch_size not in self._steps:
            self._trace(batch_size)
        return self._steps[batch_size]

    @property
    def traced_batches(self) -> tuple[int, ...]:
        """The batch sizes traced, in order (every other one is read off the first two, or sized from the first)."""
        return tuple(batch for batch in self._traced if not isinstance(self._plain[batch].batch_size, Rescaled))

    def step_source(self, batch_size: int) -> str:
        """How the step at ``batch_size`` was made: "traced", "shape inference" (sized from the first trace by
        TensorFlow's, ``rescale.dims_at``) or "two traces" (read off the first two steps, ``Rescaled``)."""
        sized = self.trace(batch_size).batch_size
        if not isinstance(sized, Rescaled):
            return "traced"
        return "shape inference" if sized.to == sized.other else "two traces"

    def reads_lines(self, lb: int, batch_size: int, count: int) -> bool:
        """Whether the peak with the first ``count`` candidates moved at ``batch_size`` is read off the two steps'
        live bytes as lines in the batch (``core/batch_lines.py``), with no replay of its own."""
        return self._live_lines(lb, batch_size, count) is not None

    def _read_off_traces(self, batch_size: int) -> None:
        """Makes the step at ``batch_size`` without tracing it where it can: the first one traced at a prime from
        ``batch_size`` up that divides none of the model's dimensions, the second imported from it, the others
        read off those two."""
        if not self._traced:
            self._trace(prime_batch(batch_size, self._fixed_dims()))
            if batch_size in self._steps:
                return
        if len(self._traced) == 1:
            first = self._plain[self._traced[0]]
            if suits(first.batch_size, self._fixed_dims()) and self._importable:
                dims = self._scaled_as_without_lean(first, batch_size) or \
                    dims_at(first.ops[0].graph, first.batch_size, batch_size)
                if dims is not None:  # the first trace's ops, sized at this batch by shape inference
                    self._steps[batch_size] = self._plain[batch_size] = first.at(
                        Rescaled(first.batch_size, batch_size, batch_size, dims),
                        _input_bytes(_specs(self.sample, batch_size)))
                    self._traced.append(batch_size)
            return
        source = self._rescale_source()
        if source is not None:
            (first, step), (other, other_dims) = source
            self._steps[batch_size] = self._plain[batch_size] = step.at(
                Rescaled(first, batch_size, other, other_dims), _input_bytes(_specs(self.sample, batch_size)))

    def share(self, made) -> None:
        """From the predictors of the same model and sample made before it (``made``, keyed ``(lean_ops,
        order_backward, recompute)``): with ``recompute``, the steps of the one that differs only in what it moves
        (made and to be made); with ``lean_ops``, the one without, whose sizing rule it follows where that step
        was imported at the same prime and batch (``_scaled_as_without_lean``)."""
        traced = made.get((self.lean_ops, self.order_backward, False)) if self.recompute else None
        if traced is not None:  # the same step, moved otherwise
            self._steps, self._plain, self._orders, self._traced = \
                traced._steps, traced._plain, traced._orders, traced._traced
        if self.lean_ops:
            self._without_lean = made.get((False, self.order_backward, self.recompute))
        known = next((other for other in made.values() if other._fixed is not None), None)
        if known is not None:  # the same model's dimensions: its forward traced once
            self._fixed, self._importable = known._fixed, known._importable

    def _scaled_as_without_lean(self, first: TracedStep, batch_size: int) -> dict | None:
        """The dimensions at ``batch_size`` by ``rescale.scaled`` alone, where the step without ``lean_ops``,
        traced at the same prime, was sized at this batch by the import (every one of its dimensions so): this
        step is that one with ``lean_batch_norm``'s gradient, whose tensors are the input's shape or a channel's
        (``tensorflow/lean.py``). None otherwise."""
        plain = self._without_lean
        if not self.lean_ops or plain is None or plain._traced[:2] != [first.batch_size, batch_size] or \
                not isinstance(plain._plain[batch_size].batch_size, Rescaled):
            return None
        return dims_scaled(first.ops[0].graph, first.batch_size, batch_size)

    def _fixed_dims(self) -> set[int]:
        """The model's dimensions that are not the batch (``rescale.fixed_dims``), with, where its code is not all
        Keras's own (``rescale.described_by_keras``), every dimension its forward pass fixes at an unknown batch
        (``rescale.unseen_dims``). Where that forward cannot be traced, its dimensions are unknown, and no batch
        size is imported (``_importable``): the second is traced."""
        if self._fixed is None:
            fixed = fixed_dims(self.model, [tf.convert_to_tensor(value).shape.as_list()[1:]
                                            for value in tf.nest.flatten(tuple(self.sample))])
            unseen = set() if described_by_keras(self.model) else unseen_dims(self.model, self.sample)
            self._fixed, self._importable = fixed | (unseen or set()), unseen is not None
        return self._fixed

    def _trace(self, batch_size: int) -> None:
        """Traces the train step at ``batch_size`` (with ``order_backward``, ordered where that lowers the peak)."""
        specs = _specs(self.sample, batch_size)
        started = time.perf_counter()
        internals.build_before_trace(self.model, specs)  # else the first trace is made twice (see internals)
        with LeanOps(self.model).applied() if self.lean_ops else contextlib.nullcontext():
            graph = tf.function(self.model.train_step, autograph=False).get_concrete_function(specs).graph
        self.trace_s = time.perf_counter() - started
        plain = self._steps[batch_size] = self._plain[batch_size] = TracedStep(graph.get_operations(), batch_size,
                                                                               self.host_device, _input_bytes(specs))
        plain.with_scratch(self.scratch)
        self._traced.append(batch_size)
        if self.order_backward:
            unordered, _ = find_candidates(plain.ops, self._layer_of, 1, batch_size)
            ordered = ordering.ordered_if_lower(graph, 0, plain, unordered, self._layer_of, 1, self.host_device,
                                                self.selection)
            if ordered is not None:
                self._steps[batch_size] = ordered.step
                ordered.step.with_scratch(self.scratch)
                self._orders[batch_size] = (ordering.rank_of(ordered.step), ordered.ordered)

    def _rescale_source(self):
        """The first two traces, as ``((batch, step), (other batch, its tensors' dimensions by name))``, where their
        ops correspond by name (the same code traced twice); None where fewer than two are made or they differ."""
        if len(self._traced) < 2:
            return None
        if self._source is None:
            (first, second) = (self._plain[batch] for batch in self._traced[:2])
            if isinstance(second.batch_size, Rescaled):  # imported: the first trace's ops, their shapes inferred
                same, dims = True, second.batch_size.other_dims
            else:
                same = [op.name for op in first.ops] == [op.name for op in second.ops]
                dims = {tensor.name: tensor.shape.as_list() for op in second.ops for tensor in op.outputs
                        if tensor.shape.rank is not None}
            self._source = ((first.batch_size, first), (self._traced[1], dims)) if same else False
            rescaled = Rescaled(first.batch_size, first.batch_size, *self._source[1]) if same else None
            if same and not (self.scratch and self.scratch.ops) and all(
                    rescaled.linear(name, dims) for _, outputs in first._output_table()
                    for name, dims, _ in outputs if dims is not None):
                # None where the two steps walk in other orders, or an in-place choice differed: then no lines
                self._coincidences = lines_hold(first.batch_size, first.indexed(), self._traced[1], second.indexed())
        return self._source or None

    def _live_lines(self, lb: int, batch_size: int, count: int):
        """The live bytes of the step with the first ``count`` candidates moved as lines in the batch size
        (``core/batch_lines.py``), where ``batch_size`` is read off the first two traces (or is one of them: the
        lines there are the walk's own bytes, and the second's from the same order, buffers and in-place choices)
        and every tensor grows linearly with the batch; else None (a replay). The lines are those of the tensors
        moved, by name: every batch size that moves the same ones shares them (a tensor below ``min_bytes`` at
        one batch size and eligible at another is moved in the traces' steps too)."""
        source = self._rescale_source() if self.rescale_batches and not self.order_backward else None
        if source is None or self._coincidences is None or batch_size in self._coincidences:
            return None
        (first, _), (second, _) = source
        names = tuple(item.candidate.tensor for item in self.candidates(lb, batch_size)[:count])
        key = (lb if count else 0, names)  # with nothing moved, lb changes nothing
        if key not in self._lines:
            moved = [self._moved(lb, batch, names) for batch in (first, second)]
            self._lines[key] = None if None in moved else resized_lines(first, self._plain[first].replay(
                moved[0], explain=True, resized=(self._plain[second], moved[1])), second)
        return self._lines[key]

    def _moved(self, lb: int, batch_size: int, names: tuple) -> list | None:
        """The candidates of these tensor names at ``batch_size``, eligible or not; None where one is not a
        candidate there."""
        key = (lb, batch_size)
        if key not in self._by_name:
            self._by_name[key] = {item.candidate.tensor: item for item in self._found_at(lb, batch_size)}
        by_name = self._by_name[key]
        return [by_name[name] for name in names] if all(name in by_name for name in names) else None

    def candidates(self, lb: int, batch_size: int) -> list:
        """The eligible candidates (TensorCandidate) at this ``lb`` and batch size, in forward order."""
        whole_number("lb", lb, 1)
        whole_number("batch_size", batch_size, 1)
        key = (lb, batch_size)
        if key not in self._candidates:
            found = self._found_at(lb, batch_size)
            by_tensor = {item.candidate.tensor: item for item in found}
            self._candidates[key] = [by_tensor[c.tensor] for c in self.selection.eligible(c.candidate for c in found)]
        return self._candidates[key]

    def _found_at(self, lb: int, batch_size: int) -> list:
        """Every candidate at this ``lb`` and batch size, the filters apart, in forward order (memoised)."""
        key = (lb, batch_size)
        if key not in self._found_at_batch:
            step = self.trace(batch_size)
            if not isinstance(step.batch_size, Rescaled):
                found = self._found(lb, step, self._orders.get(batch_size))
            else:  # the traced ops: the same tensors, consumers and triggers at every batch read off them
                if lb not in self._found_off_traces:
                    self._found_off_traces[lb] = (self._found(lb, step), {})
                traced, memo = self._found_off_traces[lb]
                found = resized(traced, step.batch_size, memo)
            self._found_at_batch[key] = found
        return self._found_at_batch[key]

    def _found(self, lb: int, step: TracedStep, order=None) -> list:
        """``find_candidates``' candidates of ``step`` (with ``recompute="only"``, as the backend plans it: the
        recomputable ones), in forward order."""
        found, _ = find_candidates(step.ops, self._layer_of, lb, step.batch_size, order=order)
        if self.recompute == "only":
            recomputable = plan_recomputes(found, step.ops)
            found = [item for item in found if item.tensor.name in recomputable]
        return found

    def _replay(self, lb: int, batch_size: int, count: int):
        """The explained replay with the first ``count`` candidates moved (memoised)."""
        key = (lb if count else 0, batch_size, count)  # with nothing swapped, lb changes nothing
        if key not in self._replays:
            step = self.trace(batch_size) if count else self._plain[batch_size]
            self._replays[key] = step.replay(self.candidates(lb, batch_size)[:count], explain=True)
        return self._replays[key]

    def eligible(self, lb: int, batch_size: int) -> list:
        return [item.candidate for item in self.candidates(lb, batch_size)]

    def transient_peak(self, lb: int, batch_size: int, count: int) -> int:
        lines = self._live_lines(lb, batch_size, count)
        return lines.peak_bytes(batch_size) if lines is not None else self._replay(lb, batch_size, count).peak_bytes

    def explain(self, n_tensors: int, lb: int = 1, batch_size: int = 32) -> dict:
        """``stats["peak"]`` (lms/peak.py) of the prediction with the first ``n_tensors`` candidates swapped
        (-1: all): the phase and op of the peak, its bytes by kind, and the 10 largest live tensors."""
        count = self._count(n_tensors, lb, batch_size)
        optimizer = getattr(self.model, "optimizer", None)
        return self.trace(batch_size).explain(self.candidates(lb, batch_size)[:count], self._persistent,
                                              self._layer_of, getattr(optimizer, "name", None),
                                              result=self._replay(lb, batch_size, count))

    def estimated_compute_s(self, batch_size: int, device: str | None = None) -> float:
        """The traced step's convolution and matrix-product FLOPs at ``device``'s matrix-product rate
        (``compute.py``): a lower bound on the step's compute time."""
        from .compute import device_flops_per_s, flop_ops, step_flops

        step = self.trace(batch_size)
        graph = step.ops[0].graph if step.ops else None  # the ops counted, once per trace (a batch read off shares)
        if graph not in self._flop_ops:
            self._flop_ops[graph] = flop_ops(step.ops)
        return step_flops(self._flop_ops[graph], step.batch_size) / device_flops_per_s(device)


__all__ = ["TensorFlowStepPredictor", "Prediction"]
