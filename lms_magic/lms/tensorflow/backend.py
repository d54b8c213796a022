"""LMS on TensorFlow: the per-fit engine behind the ``LMS`` callback.

Each trace of the train step is rewritten as it is traced: candidates found, a first plan made on the traced graph
(``planner.py``), swap ops inserted (``rewrite.py``). Where the plan is searched (the default, a budget), the first
step is a probe that swaps every eligible candidate; the graphs TensorFlow executed in it (``executed.py``), any
subset of the swaps undone, and its kernels' scratch (read off the allocator, off a GPU) are planned on. A plan that
differs is traced again (one retrace); one that moves nothing steps LMS out. Where the traced step fits the device,
the first step swaps nothing, and LMS steps out after it if its executed graphs fit too. The checked plan is
remembered (``lms/memo.py``). Grappler runs as without LMS, so the kernels that run, and the math, are a plain
fit's. On a GPU, the plan's first step is held to the allocator's peak (``TracePlanner.measured``).
"""

from __future__ import annotations

import contextlib
import time

import tensorflow as tf

from ... import internals
from ...units import format_size
from .. import samples as _samples
from ..backend import Action
from ..core.plan import BudgetError, Plan, Rule
from ..core.stats import LmsStats
from ..core.summary import Words, summary_line
from ..memo import PLANS, RememberedPlan, options_key
from ..options import LmsOptions
from ..persistent import persistent_tensors
from . import internals as tf_internals
from . import compute as _compute
from . import executed as _executed
from . import hybrid as _hybrid
from . import lean as _lean
from . import messages as _messages
from . import recompute as _recompute
from . import rewrite as _rewrite_ops
from .graph import replica_prefix
from .planner import TracePlanner
from .traced import TracedStep

RETRACES_PER_PLAN = 2  # the retraces a plan may take (as many more after a measured step re-plans)


class TensorFlowBackend:
    """One fit's LMS on TensorFlow, filling in the fit's stats as the step is traced and run.

    Args:
        model: the compiled Keras model.
        options: the LMS options, with ``device`` and ``host_device`` resolved.
        stats: the fit's stats (``capacity_bytes`` and ``batch_size`` found by the callback).
    """

    jit_note = "XLA (jit_compile) is off while LMS trains: XLA ignores the swap ordering"

    def __init__(self, model, options: LmsOptions, stats: LmsStats):
        self.model, self.selection, self.lb, self.budget_bytes = model, options.selection, options.lb, options.budget_bytes
        self.device, self.host_device, self.stats = options.device, options.host_device, stats
        # under a distribution strategy every replica's device is relieved with the first's plan (its ops counted)
        self._elsewhere = (self.host_device, *(d for d in stats.devices if d != self.device))
        self.recompute = options.recompute
        self._layer_of = _rewrite_ops.layer_resolver(model)
        self.planner = TracePlanner(options, stats, self._layer_of, self._elsewhere, self._persistent_bytes)
        self.order_backward = self.planner.order_backward
        self._lean = _lean.LeanOps(model) if options.lean_ops else None
        if self._lean is not None:
            stats.lean_layers = len(self._lean.layers)
            if not self._lean.layers:
                stats.notes.append("lean_ops: the model has no Keras BatchNormalization layer: nothing to lean")
        self._hybrid = _hybrid.HybridPlan(options.selection, options.host_device) if self.recompute is True else None
        self.step = self.executed = None  # the traced step's TracedStep, the probe's ExecutedStep (inspection)
        self._traces: dict = {}
        self._chosen: dict[int | None, list[str]] = {}  # batch size -> the tensors the plan swaps
        self.candidates: list = []  # the first trace's candidates (TensorCandidate): what the plans choose from
        self._plan: Plan | None = None
        self._budget_checked = False
        self._graphs = _executed.ExecutedGraphs()
        self._scratch_read: list = []  # the kernels' scratch the first step held, until read (_check_first_step)
        self._probing = False  # the step being checked swaps every eligible candidate, to plan on its graphs
        self._retraces, self._retrace_limit = 0, RETRACES_PER_PLAN  # the retraces so far, and how many a plan may take
        self._persistent_tensors = None
        self._own_function = model.train_function  # the model's own: a new one (compile()) forgets its plans
        self._memo_key = None  # what this fit's plan is remembered under (memo.py)
        self._remembered: RememberedPlan | None = None  # the plan of an earlier fit, where this fit reuses it
        self._options_key = options_key(options)  # what of the options the remembered plan depends on
        self.batch_shapes = None  # the batch's (shape, dtype) leaves, as the first trace saw them
        self._state_built = False  # the model's state built before the first trace (train_function)

    def train_function(self, function):
        """``function`` with the model's metrics, loss and optimizer state built before its first call
        (``internals.build_before_trace``): built inside the first trace, the step would be traced twice."""

        def call(iterator, *rest, **kwargs):
            if not self._state_built:
                self._state_built = True
                internals.build_before_trace(self.model, getattr(iterator, "element_spec", None))
            return function(iterator, *rest, **kwargs)

        return call

    @contextlib.contextmanager
    def step_scope(self):
        """The executed graphs collected while a step's plan is checked (the first step, and the step after a
        retrace); with ``lean_ops``, the model's BatchNormalization layers lean while the step runs (traces)."""
        with contextlib.ExitStack() as stack:
            if self._graphs.wanted:  # the graphs TensorFlow instantiates in this step; its kernels' scratch once
                if self._retraces == 0:
                    stack.enter_context(_executed.kernel_scratch_recorded(self._scratch_read.append, self.device))
                stack.enter_context(tf_internals.collected_function_graphs(self._graphs.collected))
            if self._lean is not None:
                stack.enter_context(self._lean.applied())
            yield

    def train_step(self, original):
        """``original`` with the swaps inserted into each trace of it."""
        replicas = self.model.distribute_strategy.num_replicas_in_sync

        def lms_train_step(data):
            if not tf_internals.in_function_graph():
                return original(data)
            graph = tf.compat.v1.get_default_graph()
            if self.batch_shapes is None:  # what an out-of-memory error is explained on (callback.py)
                self.batch_shapes = _samples.batch_shapes(data)
            if self.budget_bytes is not None and not self._budget_checked:
                self._budget_checked = True
                self.planner.check_budget(original, data)
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

    @property
    def trace_count(self) -> int:
        """How many graphs of the train step were traced and rewritten so far (the callback's note)."""
        return len(self._traces)

    def _persistent(self):
        """The weights, optimizer state and metrics' variables (read once, after the first trace built them)."""
        if self._persistent_tensors is None:
            with tf.init_scope():  # read inside the trace: an optimizer Keras has not built is sized eagerly
                self._persistent_tensors = persistent_tensors(self.model)
        return self._persistent_tensors

    def _persistent_bytes(self) -> int:
        return sum(tensor.nbytes for tensor in self._persistent())

    def _optimizer_scope(self) -> str | None:
        return getattr(getattr(self.model, "optimizer", None), "name", None)

    def _rewrite(self, graph, start: int, data) -> None:
        started = time.perf_counter()
        ops = graph.get_operations()[start:]
        if self._retrace_swapped(graph, start, data) or self._reuse(graph, ops, data):
            return
        traced = self.planner.plan(ops, data, graph, budget_fallback=True)
        candidates, step, plain, input_bytes, plan = traced.candidates, traced.step, traced.plain, traced.input_bytes, \
            traced.plan
        ops = step.ops  # with the backward order's joins, where it is ordered
        by_tensor = {item.candidate.tensor: item for item in candidates}
        chosen_items = [by_tensor[c.tensor] for c in plan.moved]
        if self.stats.records is None and self.planner.trusted_fit(plan, step.batch_size, self._lean is not None):
            tf_internals.graph_collection_stopped()  # the executed graphs are not needed: none is kept
        if self.stats.records is None and self.planner.searched(plan) and (plan.moved or plan.budget_bytes is None):
            # the first step probes (where the plan has a budget or capacity to fit, only if the traced step does not)
            chosen_items = [by_tensor[c.tensor] for c in self.selection.eligible(item.candidate for item in candidates)]
            self._probing = True
        if self.stats.records is not None:
            self._insert(graph, ops, chosen_items, candidates)  # a retrace: same rule, stats from the first
            return
        without = plain.replay([], explain=True)  # (its nodes are read before the rewrite changes the ops' inputs)
        with_swaps = None if self.recompute == "only" else step.replay(chosen_items, explain=True)
        records = self._insert(graph, ops, chosen_items, candidates)
        self._chosen[step.batch_size] = [item.candidate.tensor for item in chosen_items]
        self.candidates, self._plan = candidates, plan
        self.step = TracedStep(graph.get_operations()[start:], step.batch_size, self._elsewhere, input_bytes,
                               step.ordered, scratch=getattr(self.step, "scratch", None))
        # with LMS: the swaps replayed on the traced step, or the step with the clones in it, replayed as it is
        moved_on, moved, with_lms = ((step, chosen_items, with_swaps) if with_swaps is not None else
                                     (self.step, [], self.step.replay([], explain=True)))
        self._record(records)
        figures, notes = traced.figures(moved_on, moved, with_lms, without, self._persistent(), self._layer_of,
                                        self._optimizer_scope())
        self.stats.update(figures)
        self.stats.record_plan(plan)
        self.stats.notes += notes
        self.stats.rewrite_s = time.perf_counter() - started

    def _reuse(self, graph, ops, data) -> bool:
        """The first trace of a fit: where an earlier fit of this model checked a plan for the same candidates,
        options and capacity, its tensors are moved as it moved them, its stats taken over (not for the hybrid
        plan or the backward order, checked over several steps)."""
        if self.stats.records is not None or self._hybrid is not None or self.order_backward:
            return False
        batch = self.planner.batch_size(data)
        candidates, _ = self.planner.candidates(ops, batch)  # kept: the plan is made on them where none is recalled
        self._memo_key = (batch, tuple((item.candidate.tensor, item.candidate.shape) for item in candidates),
                          self._options_key, self.stats.capacity_bytes)
        remembered = PLANS.recall(self.model, self._own_function, self._memo_key)
        by_tensor = {item.candidate.tensor: item for item in candidates}
        if remembered is None or not all(name in by_tensor for name in remembered.moved):
            return False
        tf_internals.graph_collection_stopped()
        self._graphs.not_wanted()
        records = self._insert(graph, ops, [by_tensor[name] for name in remembered.moved], candidates)
        self._chosen[batch], self.candidates, self._remembered = list(remembered.moved), candidates, remembered
        remembered.taken_over(self.stats, "at this batch: nothing planned, probed or replayed again",
                              records=records, planning_s=0.0, plans_tried=0)
        return True

    def first_step_done(self, measured_step_bytes: int | None = None) -> Action:
        """After the first LMS step (and the first after a retrace): the plan checked (``_check_first_step``), then
        against the allocator's ``measured_step_bytes`` where the callback read them (``_check_measured``) and,
        once it stands, remembered for later fits; where this fit reuses a plan, what that fit ended with."""
        if self._remembered is not None:
            remembered, self._remembered = self._remembered, None
            return Action.STEP_OUT if remembered.stepped_out else Action.KEEP
        action = self._check_first_step()
        if action is Action.KEEP and measured_step_bytes is not None:
            action = self._check_measured(measured_step_bytes)
        if action is not Action.RETRACE and self._memo_key is not None and self._retraces < RETRACES_PER_PLAN:
            moved = () if action is Action.STEP_OUT else self._chosen.get(self.stats.batch_size, ())
            PLANS.remember(self.model, self._own_function, self._memo_key,
                           RememberedPlan(tuple(moved), self.stats, action is Action.STEP_OUT))
            self._memo_key = None
        return action

    def _check_measured(self, step_bytes: int) -> Action:
        """The plan that ran against what the device's allocator held in its step (``TracePlanner.measured``):
        where more than the plan was allowed, planned once more from a step that swaps every eligible tensor."""
        note = self.planner.measured(step_bytes, self._plan)
        if note is None:
            return Action.KEEP
        self._retrace_limit = self._retraces + RETRACES_PER_PLAN
        return self._retrace(self._eligible_names(), probing=True, note=note)

    def _eligible_names(self) -> list[str]:
        return [c.tensor for c in self.selection.eligible(item.candidate for item in self.candidates)]

    def _insert(self, graph, ops, items, candidates) -> list:
        """Moves ``items`` off the device in the traced step ``ops`` of ``graph`` (``recompute.move_off``)."""
        return _recompute.move_off(graph, ops, items, self.host_device, self.recompute, self._hybrid, candidates,
                                   self._probing)

    def _record(self, records) -> None:
        """The swaps and recomputes as inserted: stats' records (every replica's) and the counts and plan rows
        of one device (the first replica's, which every replica repeats)."""
        self.stats.update(_recompute.records_stats([r for r in records if not replica_prefix(r.candidate.tensor)]))
        self.stats.records = records

    def _retrace_swapped(self, graph, start: int, data) -> bool:
        """A retrace at a batch size already planned: the same tensors swapped, without searching again.

        Keras traces the train step twice when its first trace creates variables (an optimizer's slots,
        compiled metrics); the two traces name their activations alike, so the plan carries over by name. A
        retrace after the executed graphs changed the plan inserts the new plan's swaps so. Where the step
        about to run is the one whose executed graphs are read next, this trace becomes ``self.step``: the
        executed ops take their program order from it by name, and the first trace's optimizer ops (made
        while its variables were created) are named otherwise.
        """
        batch = self.planner.batch_size(data)
        if batch not in self._chosen:
            return False
        ops, candidates, attempt = self.planner.as_planned(graph, start, batch)
        by_tensor = {item.candidate.tensor: item for item in candidates}
        if not all(name in by_tensor for name in self._chosen[batch]):
            if attempt is not None:
                attempt.remove()
            return False
        records = self._insert(graph, ops, [by_tensor[name] for name in self._chosen[batch]], candidates)
        if self._retraces:
            self._record(records)
        if self._graphs.wanted and self.step is not None:  # the executed graphs to read are this trace's
            self.step = TracedStep(graph.get_operations()[start:], batch, self._elsewhere, self.step.input_bytes,
                                   attempt.ordered if attempt is not None else None, scratch=self.step.scratch)
        return True

    # -- after a step whose executed graphs were collected -----------------------------------------------
    def _check_first_step(self) -> Action:
        """After a step whose graphs were collected: the plan made again on the graphs TensorFlow executed
        (once), and the predicted peaks of the plan that runs."""
        metadata = self._graphs.take()
        again = self.planner.scratch_figures(self.step, self._scratch_read, self._persistent(), self._layer_of,
                                             self._optimizer_scope())  # with its kernels' scratch; fits with room: done
        if self._retraces == 0 and self.planner.trusted_fit(self._plan, self.stats.batch_size, self._lean is not None,
                                                            again and again["device_peak_bytes"]):
            self._graphs.not_wanted()
            self.stats.update(again or {})
            return self._fits_with_room_kept()
        partitions = _executed.train_partitions(metadata) if metadata is not None else []
        if not partitions or not self.stats.active:  # the traced figures, with the scratch where nothing moved
            self.stats.update(again if again and not self.stats.swapped_tensors + self.stats.recomputed_tensors else {})
            over = again and self.stats.active and self._over_budget(again["device_peak_bytes"], "the traced graph")
            return Action.RETRACE if over else Action.KEEP
        self.stats.partition_graphs = partitions
        if self.recompute == "only":  # the traced figures stand: closer to the measured (docs/measurements.md)
            if not self.stats.recomputed_tensors and self._plan is not None and self._plan.budget_bytes is not None:
                return self._step_out(_messages.why_nothing(self._plan))
            return Action.KEEP
        searching = self._plan is not None and self.planner.searched(self._plan) and self._retraces < self._retrace_limit
        # a probe's own figures are read only where its plan stands: not replayed before the search says so
        probe = searching and self._probing
        try:
            with_lms, without_lms, unknown = self._executed_peaks(partitions, with_lms=not probe)
        except Exception as error:  # a prediction must never stop training
            self.stats.notes.append(f"prediction from the traced graph only: the executed graph could not be "
                                    f"replayed ({type(error).__name__}: {error})")
            return Action.KEEP
        self.stats.update({"device_peak_bytes_without_lms": without_lms["bytes"], "peak_without_lms": without_lms,
                           "prediction_source": "executed partition graphs" + (
                               ", without XLA" if internals.jit_compile_requested(self.model) else ""),
                           "unknown_size_nodes": unknown})
        if with_lms is not None:
            self.stats.update(device_peak_bytes=with_lms["bytes"], peak=with_lms)
        if self.planner.cost is None:
            self.planner.cost = self._step_cost()
        action = Action.KEEP
        if searching:
            try:
                action = self._plan_on_executed(partitions, without_lms["bytes"])
            except Exception as error:  # a plan search that fails leaves the swaps that ran, said
                self.stats.notes.append(f"the plan was not made on the executed graphs ({type(error).__name__}: "
                                        f"{error}): the first step's swaps stand")
            if probe and action is Action.KEEP:  # the probe's swaps stand: its own figures
                with_lms, _, _ = self._executed_peaks(partitions, without_lms=False)
                self.stats.update(device_peak_bytes=with_lms["bytes"], peak=with_lms)
        elif self._hybrid is not None and self.stats.swapped_tensors + self.stats.recomputed_tensors and \
                self._retraces < self._retrace_limit:  # a plan given by a count: its first step swapped it
            action = self._hybrid_check(lambda: _executed.ExecutedStep(partitions, self.device, self.step),
                                        with_lms["bytes"])
        cost = self.planner.cost
        if action is not Action.RETRACE and cost is not None:
            self.stats.update(predicted_step_ratio=cost.ratio(self.stats.swapped_bytes_per_step),
                              compute_s=cost.compute_s, compute_source=cost.source)
        if action is Action.KEEP and len(self.stats.devices) > 1:  # each replica's device on its own graph
            self.stats.device_peaks, notes = _executed.peaks_by_device(
                partitions, self.stats.devices, self.step, self._persistent(), self._layer_of, self._optimizer_scope())
            self.stats.notes += notes
        return action

    def _executed_peaks(self, partitions, with_lms: bool = True, without_lms: bool = True):
        return _executed.executed_peaks(partitions, self.device, self.step, self._persistent(), self._layer_of,
                                       self._optimizer_scope(), with_lms, without_lms)

    def _step_cost(self):
        """The step's StepCost (compute.step_cost); None, with a note where it failed, where it cannot be made."""
        try:
            return _compute.step_cost(self.step.ops, self.stats.batch_size, self.device)
        except Exception as error:  # a prediction must never stop training
            self.stats.notes.append(f"no step-time prediction ({type(error).__name__}: {error})")
            return None

    def _plan_on_executed(self, partitions, plain_peak_bytes: int) -> Action:
        """After a probe (every eligible candidate swapped): the rule's plan, predicted on the executed graphs
        with the other swaps undone; a retrace where it differs, LMS out where it moves nothing. After a
        step that ran the plan (or nothing, where the traced step fit the device): the check."""
        plan = self._plan
        if not self._probing:
            if self._over_budget(plain_peak_bytes, "the executed graphs"):
                return Action.RETRACE
            moved = self.stats.swapped_tensors + self.stats.recomputed_tensors
            if not moved:
                return self._step_out(_messages.why_nothing(plan))
            if plan.rule is Rule.LOWEST_PEAK and self.stats.device_peak_bytes > plain_peak_bytes:
                return self._step_out(f"the executed graphs predict {format_size(self.stats.device_peak_bytes)} "
                                      f"with the planned {moved} tensors moved, above "
                                      f"{format_size(plain_peak_bytes)} without")
            return Action.KEEP if self._hybrid is None else self._hybrid_check(
                lambda: _executed.ExecutedStep(partitions, self.device, self.step), self.stats.device_peak_bytes)
        executed = self.executed = _executed.ExecutedStep(partitions, self.device, self.step)
        held = [item for item in self.candidates if executed.holds(item)]
        started = time.perf_counter()
        try:
            plan = self.planner.search(held, executed.transient_peak)
        except BudgetError:
            self._probing = False
            return Action.KEEP  # no plan fits the budget on these graphs: the probe's swaps stand
        self.stats.update(planning_s=(self.stats.planning_s or 0) + time.perf_counter() - started)
        self.stats.notes = [note for note in self.stats.notes if not note.startswith("no swap lowers the predicted peak")]
        self._plan = plan
        self.stats.record_plan(plan)
        names = [candidate.tensor for candidate in plan.moved]
        if not names:
            return self._step_out(_messages.why_nothing(plan))
        if self._hybrid is not None:
            self.stats.notes.append(self._hybrid.choose(executed, names, self.candidates, plan.peak_bytes))
        if names == self._chosen[self.stats.batch_size] and (self._hybrid is None or self._hybrid.state != "on"):
            self._probing = False
            return Action.KEEP
        return self._retrace(names, probing=False, note=(
            f"planned on the graphs TensorFlow executed in the first step, which swapped every eligible tensor: "
            f"{len(names)} of {len(held)} swapped from the second step, predicted {format_size(plan.peak_bytes)}"))

    def _over_budget(self, peak_bytes: int, where: str) -> bool:
        """Nothing moved and ``where`` predicts more than the budget: every eligible tensor swapped next (said)."""
        plan = self._plan
        if plan is None or plan.budget_bytes is None or plan.moved or peak_bytes <= plan.budget_bytes:
            return False
        self._retrace(self._eligible_names(), probing=True,
                      note=_messages.over_budget(where, peak_bytes, plan, self.step.scratch is not None))
        return True

    def _retrace(self, names: list[str], probing: bool, note: str) -> Action:
        """The train function made again (by the callback) with ``names`` swapped; its first step is checked."""
        self.stats.notes.append(note)
        self._chosen[self.stats.batch_size] = names
        self._probing, self._retraces = probing, self._retraces + 1
        self._graphs.want()
        return Action.RETRACE

    def _step_out(self, why: str) -> Action:
        """Nothing moves from the next step on: the model trains with its own train function."""
        stats = self.stats
        stats.notes = [note for note in stats.notes if note != self.jit_note] + [_messages.stepped_out(why)]
        stats.update(swapped_tensors=0, swapped_bytes_per_step=0, recomputed_tensors=0, recomputed_bytes_per_step=0,
                     lean_layers=0, ordered_layers=0, plan=[], records=[],
                     device_peak_bytes=stats.device_peak_bytes_without_lms, peak=stats.peak_without_lms)
        return Action.STEP_OUT

    def _fits_with_room_kept(self) -> Action:
        """The traced step fits the device with room: no probe, nothing moved (with XLA: the model's own step)."""
        why = _messages.fits_with_room(self._plan, self.step.scratch and self.stats.device_peak_bytes_without_lms)
        self.stats.update(predicted_step_ratio=1.0)  # nothing moves: the model's own step
        if internals.jit_compile_requested(self.model):
            return self._step_out(why)
        self.stats.notes.append(f"{why}: nothing moves, no step was probed, and the step runs as traced, the "
                                "model's own")
        return Action.KEEP

    def _hybrid_check(self, executed, peak_bytes: int) -> Action:
        """The hybrid plan after a step whose ExecutedStep (``executed`` makes it) predicts ``peak_bytes``."""
        names = self._chosen[self.stats.batch_size]
        notes, retrace = self._hybrid.after_step(executed, names, self.candidates, peak_bytes,
                                                 self.stats.recomputed_tensors)
        self.stats.notes += notes
        return Action.KEEP if retrace is None else self._retrace(names, probing=False, note=retrace)

    def summary_line(self) -> str:
        return summary_line(self.stats, Words("LMS", "tensors", "swapping", self.host_device, self.device,
                                              lb=f"lb={self.lb}"))

    def close(self) -> None:
        """Nothing to release: the swaps live in the LMS train function, which the callback drops."""
