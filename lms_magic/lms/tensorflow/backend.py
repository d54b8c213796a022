"""LMS on TensorFlow: the per-fit engine behind the ``LMS`` callback.

Each trace of the train step is rewritten as it is traced: candidates found,
the swaps planned (plan.plan_swaps), swap ops inserted (rewrite.py).
After the first step, the partition graphs TensorFlow executed are replayed
for the predicted peaks. The first step's executed graphs are collected,
and collection is put back when that step ends. Grappler runs as it would
without LMS (the swap ops are of types it leaves in place), so the kernels
that run, and the math, are those of a plain fit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import tensorflow as tf

from ... import compat
from ...units import MIB, format_mib
from ..core.plan import PLANNED, BudgetError, plan_swaps
from ..core.stats import LmsStats
from ..options import LmsOptions
from . import predict as _predict
from . import rewrite as _rewrite_ops
from .graph import phase_of


class TensorFlowBackend:
    """One fit's LMS on TensorFlow; ``stats`` is the callback's dict, filled in as the step is traced and run.

    Args:
        model: the compiled Keras model.
        options: the LMS options, with ``device`` and ``host_device`` resolved.
        stats: the fit's stats, filled in as the step is traced and run.
    """

    jit_note = "XLA (jit_compile) is off while LMS trains: XLA ignores the swap ordering"

    def __init__(self, model, options: LmsOptions, stats: LmsStats):
        if model.run_eagerly:
            raise ValueError("LMS rewrites the compiled train step; compile without run_eagerly=True")
        self.model, self.selection, self.lb, self.budget_bytes = model, options.selection, options.lb, options.budget_bytes
        self.device, self.host_device, self.stats = options.device, options.host_device, stats
        self._hint = options.batch_size
        self.step = None  # the rewritten step's TracedStep, after the first trace
        self._traces: dict = {}
        self._chosen: dict[int | None, list[str]] = {}  # batch size -> the tensors the plan swaps
        self._layer_of = _rewrite_ops.layer_resolver(model)
        self._budget_checked = False
        self._run_metadata: list = []
        self._planned: dict = {}
        self._persistent_tensors = None

    @contextlib.contextmanager
    def step_scope(self):
        """The first step's executed graphs collected."""
        with contextlib.ExitStack() as stack:
            if not self._run_metadata:  # the first step: TensorFlow instantiates the function
                stack.enter_context(compat.collected_function_graphs(self._run_metadata))
            yield

    def train_step(self, original):
        """``original`` with the swaps inserted into each trace of it."""
        replicas = self.model.distribute_strategy.num_replicas_in_sync

        def lms_train_step(data):
            if not compat.in_function_graph():
                return original(data)
            graph = tf.compat.v1.get_default_graph()
            if self.budget_bytes is not None and not self._budget_checked:
                self._check_budget(original, data)
            state = self._traces.setdefault(id(graph), {"start": len(graph.get_operations()), "open": 0, "done": 0})
            state["open"] += 1
            try:
                logs = original(data)
            finally:
                state["open"] -= 1
                state["done"] += 1
            if state["open"] == 0 and state["done"] == replicas:
                self._rewrite(graph, state["start"], data)
            return logs

        return lms_train_step

    def _check_budget(self, original, data) -> None:
        """Plans on a throwaway trace, so an impossible budget is refused before the real
        trace runs the train step (Keras's state does not survive a trace aborted after it)."""
        self._budget_checked = True
        specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype) if isinstance(t, tf.Tensor) else t,
                                      data)
        probe = tf.function(original, autograph=False).get_concrete_function(specs).graph
        try:
            self._plan(probe.get_operations(), data)
        except BudgetError as error:
            raise BudgetError(f"LMS: {error}") from None

    def _batch_size(self, data) -> int | None:
        """The batch the plan is sized for: the traced one, else the user's hint, else the fit's (which the
        callback found: ``stats.batch_size``); ``stats`` say which."""
        first = tf.nest.flatten(data)[0]
        traced = first.shape[0] if first.shape.rank else None
        if traced:
            self.stats.update(batch_size=traced, batch_size_source="the traced batch")
        elif self._hint() is not None:
            self.stats.update(batch_size=self._hint(), batch_size_source="batch_size_hint")
        return self.stats.batch_size

    def _plan(self, ops, data, budget: bool = True):
        """Finds the candidates of a traced step and chooses the ones to swap."""
        batch = self._batch_size(data)
        candidates, notes = _rewrite_ops.find_candidates(ops, self._layer_of, self.lb, batch)
        if batch is None:
            notes.append("the batch size is unknown when TensorFlow traces this data and LMS found none in the fit "
                         "call, so tensor sizes are unknown and nothing is swapped; pass batch_size_hint=...")
        elif self.stats.batch_size_source != "the traced batch":
            notes.append(f"TensorFlow traces this data with an unknown batch size (a last batch smaller than the "
                         f"others, a generator, tf.data without drop_remainder): LMS planned for batches of {batch} "
                         f"({self.stats.batch_size_source})")
        by_tensor = {item.candidate.tensor: item for item in candidates}
        input_bytes = [_rewrite_ops.static_bytes(t, batch) or 0 for t in tf.nest.flatten(data) if isinstance(t, tf.Tensor)]
        step = _predict.TracedStep(ops, batch, self.host_device, input_bytes)
        persistent = sum(tensor.nbytes for tensor in self._persistent())
        started = time.perf_counter()
        selection = self.selection
        if batch is None and selection.n_tensors is PLANNED:  # nothing to size a plan with: TFLMS's rule, all
            selection = dataclasses.replace(selection, n_tensors=-1)
        search = plan_swaps(selection, [item.candidate for item in candidates],
                            self.budget_bytes if budget else None, persistent,
                            lambda cands: step.predicted_transient_peak([by_tensor[c.tensor] for c in cands]))
        self._planned = {"plan_rule": selection.rule(budget and self.budget_bytes is not None),
                         "plans_tried": search.plans_tried,
                         "planning_s": time.perf_counter() - started}
        if self._planned["plan_rule"] == "lowest predicted peak" and candidates and not search.chosen:
            notes.append(self._nothing_helps(step, search.peak_bytes))
        return candidates, notes, step, persistent, input_bytes, [by_tensor[c.tensor] for c in search.chosen]

    def _persistent(self):
        if self._persistent_tensors is None:
            self._persistent_tensors = _predict.persistent_tensors(self.model)
        return self._persistent_tensors

    def _optimizer_scope(self) -> str | None:
        return getattr(getattr(self.model, "optimizer", None), "name", None)

    def _nothing_helps(self, step, peak_bytes: int | None) -> str:
        """The note when no plan predicts a lower peak than swapping nothing: where the peak is, and why."""
        op = step.replay([]).peak_after or "?"
        phase = phase_of(op, self._optimizer_scope())
        why = {"forward": "the forward pass has not yet produced the tensors a swap would free",
               "backward": "the tensors live there are read by the backward pass at that point or just after",
               "optimizer": "the optimizer update holds the gradients and its state while the activations are gone"}
        return (f"no swap lowers the predicted peak ({format_mib(peak_bytes) if peak_bytes else '?'}, after {op} "
                f"in the {phase} pass: {why[phase]}): nothing is swapped")

    def _rewrite(self, graph, start: int, data) -> None:
        started = time.perf_counter()
        ops = graph.get_operations()[start:]
        if self._retrace_swapped(graph, ops, data):
            return
        try:
            candidates, notes, step, persistent, input_bytes, chosen_items = self._plan(ops, data)
        except BudgetError:  # the probe found it feasible; a retrace with other shapes may not be
            candidates, notes, step, persistent, input_bytes, chosen_items = self._plan(ops, data, budget=False)
            notes.append("the budget is not reachable for one batch shape: the plan with the lowest "
                         "predicted peak is used there")
        if self.stats.records is not None:
            _rewrite_ops.insert_swaps(graph, chosen_items, self.host_device)  # a retrace: same rule, stats from the first
            return
        batch = step.batch_size
        replays = step.replay(chosen_items, explain=True), step.replay([], explain=True)
        traced_peaks = (persistent + replays[0].peak_bytes, persistent + replays[1].peak_bytes)
        records = _rewrite_ops.insert_swaps(graph, chosen_items, self.host_device)
        self._chosen[batch] = [item.candidate.tensor for item in chosen_items]
        self.step = _predict.TracedStep(graph.get_operations()[start:], batch, self.host_device, input_bytes)
        self.stats.update({
            "active": True, "backend": "tensorflow", "records": records, "candidates": len(candidates), "persistent_bytes": persistent,
            "swapped_tensors": len(records), "swapped_bytes_per_step": sum(r.candidate.nbytes for r in records),
            "device_peak_bytes": traced_peaks[0], "device_peak_bytes_without_lms": traced_peaks[1],
            "prediction_source": "traced graph", "peak_source": "predicted", "traced_device_peaks": traced_peaks,
            "plan": [{"tensor": r.candidate.tensor, "layer": r.candidate.layer, "layer_type": r.candidate.layer_type,
                      "shape": r.candidate.shape, "bytes": r.candidate.nbytes, "lb": r.hops, "trigger": r.trigger}
                     for r in records],
        })
        self.stats.update(self._planned)
        self.stats.update({name: step.explain(swaps, self._persistent(), self._layer_of, self._optimizer_scope(), result)
                           for name, swaps, result in (("peak", chosen_items, replays[0]),
                                                       ("peak_without_lms", [], replays[1]))})
        self.stats.notes += notes
        self.stats.rewrite_s = time.perf_counter() - started

    def _retrace_swapped(self, graph, ops, data) -> bool:
        """A retrace at a batch size already planned: the same tensors swapped, without searching again.

        Keras traces the train step twice when its first trace creates variables (an optimizer's slots,
        compiled metrics); the two traces name their ops alike, so the plan carries over by name.
        """
        batch = self._batch_size(data)
        if batch not in self._chosen:
            return False
        candidates, _ = _rewrite_ops.find_candidates(ops, self._layer_of, self.lb, batch)
        by_tensor = {item.candidate.tensor: item for item in candidates}
        if not all(name in by_tensor for name in self._chosen[batch]):
            return False
        _rewrite_ops.insert_swaps(graph, [by_tensor[name] for name in self._chosen[batch]], self.host_device)
        return True

    def first_step_done(self) -> None:
        """Replays the partition graphs that the first step executed: the predicted peaks."""
        partitions = _predict.train_partitions(self._run_metadata[0]) if self._run_metadata else []
        self._run_metadata = [None]  # read once; the protos are released
        if not partitions or not self.stats.active:
            return
        self.stats.partition_graphs = partitions
        try:
            with_lms, without_lms, unknown = _predict.executed_peaks(partitions, self.device, self.step,
                                                                     self._persistent(), self._layer_of,
                                                                     self._optimizer_scope())
        except Exception as error:  # a prediction must never stop training
            self.stats.notes.append(f"prediction from the traced graph only: the executed graph could not be "
                                       f"replayed ({error})")
            return
        self.stats.update({"device_peak_bytes": with_lms["bytes"], "device_peak_bytes_without_lms": without_lms["bytes"],
                           "peak": with_lms, "peak_without_lms": without_lms,
                           "prediction_source": "executed partition graphs", "unknown_size_nodes": unknown})

    def summary_line(self) -> str:
        stats = self.stats
        return (f"LMS: swapping {stats.swapped_tensors} of {stats.candidates} tensors "
                f"({stats.swapped_bytes_per_step / MIB:.1f} MiB per step, lb={self.lb}; plan: {stats.plan_rule}) "
                f"to {self.host_device}; "
                f"predicted {self.device} peak {stats.device_peak_bytes / MIB:.1f} MiB with LMS, "
                f"{stats.device_peak_bytes_without_lms / MIB:.1f} MiB without ({stats.prediction_source})")

    def close(self) -> None:
        """Nothing to release: the swaps live in the LMS train function, which the callback drops."""
