"""The plan made on each trace of one fit's train step, before it runs: the candidates found, the backward order
inserted where it lowers the peak, the candidates ``recompute="only"`` can recompute, and the one planning rule
(``core.plan.plan_swaps``) over them, replayed on the traced step; or, where the first step probes (every eligible
candidate swapped, to plan on the graphs TensorFlow executes), that probe as the plan.

The backend (``backend.py``) owns the fit; a :class:`TracePlanner` is its planner, made with the fit's options
and stats, and also searches the plan again on the executed graphs (``search``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import tensorflow as tf

from ...units import format_size
from ..core.replan import budget_after_measuring
from ..core.plan import PEAK_TOLERANCE, PLANNED, TRUSTED_FIT, BudgetError, Plan, Rule, plan_swaps, usable_bytes
from ..core.scratch import KernelScratch
from ..core.stats import LmsStats
from ..options import LmsOptions
from . import messages as _messages
from . import ordering as _ordering
from . import recompute as _recompute
from . import rewrite as _rewrite_ops
from .rescale import static_bytes
from .traced import TracedStep


@dataclass
class TracedPlan:
    """What planning one trace gives: its candidates (TensorCandidate), the notes for the user, the step planned on
    (ordered where that is lower), the step as Keras traced it, the batch's input bytes and the plan."""

    candidates: list
    notes: list[str]
    step: TracedStep
    plain: TracedStep
    input_bytes: list[int]
    plan: Plan

    def figures(self, moved_on: TracedStep, moved: list, with_lms, without_lms, persistent: list, layer_of,
                optimizer_scope: str | None) -> tuple[dict, list[str]]:
        """The fit's stats from the replays of this trace (``with_lms``: of ``moved_on`` with ``moved`` swapped;
        ``without_lms``: of the step as Keras traced it), explained, and the notes to add."""
        persistent_bytes = sum(tensor.nbytes for tensor in persistent)
        peaks = (persistent_bytes + with_lms.peak_bytes, persistent_bytes + without_lms.peak_bytes)
        context = persistent, layer_of, optimizer_scope
        notes = list(self.notes)
        if self.plan.rule is Rule.LOWEST_PEAK and self.candidates and not self.plan.moved:
            notes.append(_messages.nothing_helps(without_lms.peak_after or "?", self.plan.peak_bytes, optimizer_scope))
        return {"active": True, "backend": "tensorflow", "candidates": len(self.candidates),
                "persistent_bytes": persistent_bytes, "device_peak_bytes": peaks[0],
                "device_peak_bytes_without_lms": peaks[1], "prediction_source": "traced graph",
                "peak_source": "predicted", "traced_device_peaks": peaks,
                "peak": moved_on.explain(moved, *context, with_lms),
                "peak_without_lms": self.plain.explain([], *context, without_lms)}, notes


class TracePlanner:
    """Plans the traces of one fit's train step (and searches again on its executed graphs).

    Args:
        options: the fit's LMS options (``device`` and ``host_device`` resolved).
        stats: the fit's stats: it reads the batch size and capacity the callback found, and records the batch
            size planned for, the planning time and the layers ordered.
        layer_of: the model's op name -> (layer, layer type) resolver (``rewrite.layer_resolver``).
        elsewhere: the host device, and the devices of the other replicas (their buffers are not counted).
        persistent_bytes: the weights and optimizer state's bytes, read when a plan is made.
        measured_device: what the process measured of this model on this device with these data
            (``core.device_model.MeasuredDevice``, or None), read when the first plan is made.

    Its state (16 attributes) is its arguments (the options it plans by, the stats it writes, the layer lookup,
    the devices it may not place on, the persistent bytes and the measured device) and what one trace's plan
    leaves for the next (the budget allowed, the step-cost model, the candidates found and known, the hint).
    """

    def __init__(self, options: LmsOptions, stats: LmsStats, layer_of, elsewhere: tuple,
                 persistent_bytes: Callable[[], int], measured_device: Callable[[], object] = lambda: None):
        self.selection, self.lb, self.budget_bytes = options.selection, options.lb, options.budget_bytes
        # what the device may hold, where the plans' budget is in the replay's bytes for it (use_device_model)
        self.allowed_bytes: int | None = None
        self._measured_device: Callable[[], object] | None = measured_device
        self.recompute = options.recompute
        self.order_backward = options.order_backward and options.recompute is False
        if options.order_backward and not self.order_backward:
            stats.notes.append(f"order_backward is for swaps alone: with recompute={self.recompute!r} the backward "
                               "pass keeps TensorFlow's order (ordered, recompute='only' measured a higher peak)")
        self.stats, self._layer_of, self._elsewhere = stats, layer_of, elsewhere
        self._persistent_bytes, self._hint = persistent_bytes, options.batch_size
        self.ordered: dict[int | None, bool] = {}  # batch size -> its backward order kept (its retraces: so too)
        self.cost = None  # the step's StepCost, set after the first step (never while a trace runs)
        self._found: tuple | None = None  # the last ops and batch find_candidates was asked, and its answer
        self._known: tuple | None = None  # the last ops and batch known_dims was asked, and its answer

    def candidates(self, ops, batch: int | None) -> tuple[list, list[str]]:
        """``find_candidates``' candidates and notes of the traced ``ops`` at ``batch`` (the last asked kept: the
        backend asks them of the first trace to recall a plan, then plans on them), sized as the step is."""
        key = (ops[0].graph, ops[0].name, len(ops), batch) if ops else None
        if self._found is None or self._found[0] != key:
            found = _rewrite_ops.find_candidates(ops, self._layer_of, self.lb, batch,
                                                 known_dims=self.known_dims(ops, batch))
            self._found = (key, found)
        return self._found[1]

    def known_dims(self, ops, batch: int | None) -> dict:
        """``TracedStep.known_dims`` of the traced ``ops`` at ``batch`` (the last asked kept): a trace at an
        unknown batch sized by TensorFlow's shape inference."""
        key = (ops[0].graph, ops[0].name, len(ops), batch) if ops else None
        if self._known is None or self._known[0] != key:
            self._known = (key, TracedStep(ops, batch, self._elsewhere).known_dims() if ops else {})
        return self._known[1]

    def batch_size(self, data) -> int | None:
        """The batch the plan is sized for: the traced one, else the user's hint, else the fit's (which the
        callback found: ``stats.batch_size``); ``stats`` say which."""
        first = next((leaf for leaf in tf.nest.flatten(data) if getattr(leaf, "shape", None) is not None), None)
        traced = first.shape[0] if first is not None and first.shape.rank else None  # an optional input may be None
        if traced:
            self.stats.update(batch_size=traced, batch_size_source="the traced batch")
        elif self._hint() is not None:
            self.stats.update(batch_size=self._hint(), batch_size_source="batch_size_hint")
        return self.stats.batch_size

    def search(self, candidates, transient_peak, budget: bool = True) -> Plan:
        """The one planning rule over ``candidates`` (TensorCandidate) with a predictor of their transient peak."""
        by_tensor = {item.candidate.tensor: item for item in candidates}
        selection = self.selection
        if self.stats.batch_size is None and selection.n_tensors is PLANNED:  # nothing to size a plan with
            return plan_swaps(selection, [item.candidate for item in candidates], None)
        return plan_swaps(selection, [item.candidate for item in candidates],
                          lambda cands: transient_peak([by_tensor[c.tensor] for c in cands]),
                          self._persistent_bytes(), self.budget_bytes if budget else None, self.stats.capacity_bytes,
                          self.cost, 0.0 if self.recompute is True else PEAK_TOLERANCE)

    def record_measured(self, step_bytes: int, source: str | None = None) -> tuple[int, int]:
        """The plan's first step as measured (``step_bytes`` over what the device held before it; ``source``: how,
        where not the device's allocator alone) and as predicted, in the stats; (persistent, predicted step) bytes."""
        stats = self.stats
        persistent = self._persistent_bytes()
        predicted = (stats.device_peak_bytes or persistent) - persistent
        stats.update(measured_step_peak_bytes=persistent + step_bytes, predicted_step_peak_bytes=persistent + predicted,
                     measured_source=source)
        return persistent, predicted

    def measured(self, step_bytes: int, plan: Plan | None, source: str | None = None) -> str | None:
        """The plan that ran (``plan``) against the allocator's ``step_bytes`` in its first step (``source``: how it
        was read, where not the allocator alone), in the stats: where the device held more than the plan was
        allowed and the plan is searched (and not made again already), the budget the device holds from now on
        (``core.replan``), and the note of the re-plan; else None."""
        stats = self.stats
        persistent, predicted = self.record_measured(step_bytes, source)
        allowed = self.allowed_bytes if self.allowed_bytes is not None else \
            plan.budget_bytes if plan is not None else None
        budget = budget_after_measuring(allowed, persistent, predicted, step_bytes)
        if budget is None or stats.replanned or not self.searched(plan):
            return None
        stats.replanned, self.budget_bytes = True, budget
        return (f"the device held {format_size(persistent + step_bytes)} in the plan's first step "
                f"({source or 'its allocator'}), "
                f"above the {format_size(allowed)} the plan was allowed ({format_size(persistent + predicted)} "
                f"predicted): planned again for {format_size(budget)} in the replay's bytes, from a step that swaps "
                "every eligible tensor")

    def check_budget(self, original, data) -> None:
        """Plans on a throwaway trace of ``original`` (the train step), so an impossible budget is refused before
        the real trace runs the train step (Keras's state does not survive a trace aborted after it).

        Raises:
            BudgetError: even moving every candidate does not fit the budget (the message says what to try).
        """
        specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype) if isinstance(t, tf.Tensor) else t,
                                      data)
        probe = tf.function(original, autograph=False).get_concrete_function(specs).graph
        try:
            self.plan(probe.get_operations(), data, graph=probe)
        except BudgetError as error:
            raise BudgetError(f"LMS: {error}") from None

    def use_device_model(self) -> None:
        """Where the process's model of the device holds plain steps measured on this model, device and data
        (``core.device_model``: ``explain_fit``'s) and they say the device holds more than the replay, the device's
        budget (the one asked for, else the usable share of its capacity) is planned for as the replay holds it,
        as ``explain_fit`` predicted it: every answer reads one model. Read once, before the first plan."""
        measured, self._measured_device = (self._measured_device or (lambda: None))(), None
        correction = getattr(measured, "correction", None)
        capacity = self.stats.capacity_bytes
        allowed = self.budget_bytes if self.budget_bytes is not None else usable_bytes(capacity) if capacity else None
        budget = None if correction is None or allowed is None else \
            correction.replay_budget(allowed, self._persistent_bytes())
        if budget is None:
            return
        self.allowed_bytes, self.budget_bytes = allowed, budget
        self.stats.notes.append(_messages.planned_as_measured(allowed, budget, self.stats.budget_bytes is None,
                                                              correction.source))

    def plan(self, ops, data, graph=None, budget_fallback: bool = False) -> TracedPlan:
        """Finds the candidates of a traced step (ops of ``graph`` from ``ops[0]`` on: its backward pass ordered
        where that lowers the predicted peak) and makes the first plan, on the traced graph (``budget_fallback``:
        where the budget is out of reach, the lowest peak with a note)."""
        if self._measured_device is not None:
            self.use_device_model()
        batch = self.batch_size(data)
        candidates, notes = self.candidates(ops, batch)
        notes = list(notes)
        input_bytes = [static_bytes(t, batch) or 0 for t in tf.nest.flatten(data) if isinstance(t, tf.Tensor)]
        step = plain = TracedStep(ops, batch, self._elsewhere, input_bytes, known_dims=self.known_dims(ops, batch))
        if graph is not None and batch is not None and self.order_backward:
            step, candidates = self._order_backward(graph, ops, step, candidates)
        if self.recompute == "only":
            recomputable = _recompute.plan_recomputes(candidates, step.ops)
            notes.append(f"recompute='only': {len(recomputable)} of {len(candidates)} candidates can be computed "
                         "again from tensors the backward pass holds; the others stay on the device")
            candidates = [item for item in candidates if item.tensor.name in recomputable]
        notes += _messages.batch_notes(batch, self.stats.batch_size_source)
        started = time.perf_counter()
        try:
            plan = self._probe_plan(candidates, step) if self._probes_first(graph) else \
                self.search(candidates, step.predicted_transient_peak)
        except BudgetError:  # the probe found it feasible; a retrace with other shapes may not be
            if not budget_fallback:
                raise
            plan = self.search(candidates, step.predicted_transient_peak, budget=False)
            notes.append("the budget is not reachable for one batch shape: the plan with the lowest "
                         "predicted peak is used there")
        self.stats.update(planning_s=time.perf_counter() - started)
        return TracedPlan(candidates, notes, step, plain, input_bytes, plan)

    def as_planned(self, graph, start: int, batch: int | None):
        """A retrace of a step already planned at ``batch``: its ops and candidates, with the backward order as the
        first trace's (``ordered``: the OrderedStep inserted, None where that trace was not ordered)."""
        ops = graph.get_operations()[start:]
        ordered = _ordering.ordered_step(graph, start, TracedStep(ops, batch, self._elsewhere), self._layer_of,
                                         self.lb, self._elsewhere) if self.ordered.get(batch) else None
        return (ops, self.candidates(ops, batch)[0], None) if ordered is None else \
            (ordered.ops, ordered.candidates, ordered)

    def searched(self, plan: Plan) -> bool:
        """Whether ``plan`` is searched (and so made on the executed graphs), not given by a count. With
        recompute="only" it is made on the traced graph: a probe would swap."""
        return self.selection.n_tensors is PLANNED and self.stats.batch_size is not None and \
            plan.rule in (Rule.LOWEST_PEAK, Rule.BUDGET, Rule.FITS_DEVICE) and self.recompute != "only"

    def trusted_fit(self, plan: Plan | None, batch: int | None, lean: bool, peak_bytes: int | None = None) -> bool:
        """Whether the traced step fits the device with room (``TRUSTED_FIT`` of the usable capacity), nothing
        moves, and the traced step is the model's own (no lean gradient, recompute or backward order in it);
        ``peak_bytes``: its peak replayed again (with its kernels' scratch), else the plan's."""
        peak_bytes = plan.peak_bytes if peak_bytes is None and plan is not None else peak_bytes
        return (plan is not None and self.searched(plan) and plan.rule is Rule.FITS_DEVICE and not plan.moved
                and peak_bytes is not None and plan.budget_bytes is not None
                and peak_bytes <= TRUSTED_FIT * plan.budget_bytes
                and not lean and self.recompute is False and not self.ordered.get(batch))

    def scratch_attached(self, step: TracedStep, read: list) -> bool:
        """After a first step that read its kernels' scratch (``read``: ``executed.kernel_scratch_recorded``'s,
        taken): the scratch held at each op of ``step``'s replays from now on (``TracedStep.with_scratch``); whether
        any was read (then ``unmoved_figures`` replays the step with it)."""
        batch = self.stats.batch_size or step.batch_size
        if not (read and read[-1] and isinstance(batch, int)):
            read.clear()
            return False
        step.with_scratch(KernelScratch({batch: read.pop()}))
        return True

    @staticmethod
    def unmoved_figures(step: TracedStep, persistent: list, layer_of, optimizer_scope: str | None) -> dict:
        """The stats of ``step`` with nothing moved, replayed again (after its kernels' scratch was read)."""
        peak = step.explain([], persistent, layer_of, optimizer_scope)
        return {"device_peak_bytes": peak["bytes"], "device_peak_bytes_without_lms": peak["bytes"], "peak": peak,
                "peak_without_lms": peak, "traced_device_peaks": (peak["bytes"], peak["bytes"])}

    def _probes_first(self, graph) -> bool:
        """Whether the first step will probe whatever a plan on the traced graph says: the lowest-peak rule (no
        budget, no capacity), planned on the executed graphs. Then the traced graph is not searched."""
        return (graph is not None and self.stats.records is None and self.budget_bytes is None
                and self.stats.capacity_bytes is None and self.selection.n_tensors is PLANNED
                and self.stats.batch_size is not None and self.recompute != "only")

    def _probe_plan(self, candidates, step) -> Plan:
        """The probe as a plan: every eligible candidate, its peak predicted on the traced graph (the lowest-peak
        rule's plan is made on the graphs the probe executes)."""
        eligible = tuple(self.selection.eligible(item.candidate for item in candidates))
        by_tensor = {item.candidate.tensor: item for item in candidates}
        persistent = self._persistent_bytes()
        return Plan(eligible, Rule.LOWEST_PEAK,
                    persistent + step.predicted_transient_peak([by_tensor[c.tensor] for c in eligible]),
                    persistent + step.predicted_transient_peak([]), plans_tried=2)

    def _order_backward(self, graph, ops, step, candidates):
        """The step and candidates with the backward pass one layer's gradient at a time (ordering.py), where
        that lowers the predicted peak with every eligible candidate swapped; else as they are."""
        ordered = _ordering.ordered_if_lower(graph, len(graph.get_operations()) - len(ops), step, candidates,
                                             self._layer_of, self.lb, self._elsewhere, self.selection)
        self.ordered[step.batch_size] = ordered is not None
        if self.stats.records is None:  # the stats are the first trace's
            self.stats.ordered_layers = len(ordered.ordered.groups) if ordered is not None else 0
        return (step, candidates) if ordered is None else (ordered.step, ordered.candidates)


__all__ = ["TracePlanner", "TracedPlan"]
