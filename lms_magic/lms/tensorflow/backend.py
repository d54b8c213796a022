"""LMS on TensorFlow: the per-fit engine behind the ``LMS`` callback.

Each trace of the train step is rewritten as it is traced: candidates found, a first plan made on the
traced graph (``core.plan.plan_swaps``), swap ops inserted (rewrite.py). Where the plan is searched (the
default, a budget), the first step is a probe: it swaps every eligible candidate, and its executed graphs
(collected for that step only) are the partition graphs TensorFlow ran, after Grappler and placement, in
which any subset of the swaps can be undone (``predict.ExecutedStep``): the plan is made on them. Where it
differs from the probe, the train function is made again with it (one retrace) and its own executed
graphs give the figures; where it moves nothing, LMS steps out and the model trains with its own train
function (XLA too, if it was compiled so). Where the device's capacity is known and the traced step fits
it, the first step swaps nothing and, if its executed graphs fit too, LMS steps out after it. The checked plan
is remembered (``lms/memo.py``): a later fit of the same model, options and batch moves its tensors from the first
step, with no probe, replay or retrace. Grappler
runs as it would without LMS (the swap ops are of types it leaves in place), so the kernels that run,
and the math, are those of a plain fit.
"""

from __future__ import annotations

import contextlib
import time

import tensorflow as tf

from ... import internals
from ..backend import Action
from ..core.plan import PLANNED, TRUSTED_FIT, BudgetError, Plan, Rule, plan_swaps
from ..core.stats import LmsStats
from ..core.summary import Words, summary_line
from ..memo import PLANS, RememberedPlan, options_key
from ..options import LmsOptions
from ..persistent import persistent_tensors
from .. import samples as _samples
from . import hybrid as _hybrid
from . import lean as _lean
from . import messages as _messages
from . import ordering as _ordering
from . import predict as _predict
from . import recompute as _recompute
from . import rewrite as _rewrite_ops
from .executed import ExecutedStepChecks
from .graph import replica_prefix


class TensorFlowBackend(ExecutedStepChecks):
    """One fit's LMS on TensorFlow, filling in the fit's stats as the step is traced and run.

    Args:
        model: the compiled Keras model.
        options: the LMS options, with ``device`` and ``host_device`` resolved.
        stats: the fit's stats (``capacity_bytes`` and ``batch_size`` found by the callback).
    """

    jit_note = "XLA (jit_compile) is off while LMS trains: XLA ignores the swap ordering"

    def __init__(self, model, options: LmsOptions, stats: LmsStats):
        if model.run_eagerly:
            raise ValueError("LMS rewrites the compiled train step; compile without run_eagerly=True")
        self.model, self.selection, self.lb, self.budget_bytes = model, options.selection, options.lb, options.budget_bytes
        self.device, self.host_device, self.stats = options.device, options.host_device, stats
        # under a distribution strategy every replica's device is relieved with the plan made for the first
        # (``self.device``); the replay of the traced step counts the first's ops only
        self._elsewhere = (self.host_device, *(d for d in stats.devices if d != self.device))
        self.recompute = options.recompute
        self.order_backward = options.order_backward and self.recompute is False
        if options.order_backward and not self.order_backward:
            stats.notes.append(f"order_backward is for swaps alone: with recompute={self.recompute!r} the backward "
                               "pass keeps TensorFlow's order (ordered, recompute='only' measured a higher peak)")
        self._ordered: dict[int | None, bool] = {}  # batch size -> its backward order kept (its retraces: so too)
        self._lean = _lean.LeanOps(model) if options.lean_ops else None
        if self._lean is not None:
            stats.lean_layers = len(self._lean.layers)
            if not self._lean.layers:
                stats.notes.append("lean_ops: the model has no Keras BatchNormalization layer: nothing to lean")
        self._hybrid = _hybrid.HybridPlan(options.selection, options.host_device) if self.recompute is True else None
        self._hint = options.batch_size
        self.step = None  # the traced step's TracedStep, after the first trace (for inspection)
        self.executed = None  # the probe's ExecutedStep, where the plan was made on one (for inspection)
        self._traces: dict = {}
        self._chosen: dict[int | None, list[str]] = {}  # batch size -> the tensors the plan swaps
        self.candidates: list = []  # the first trace's candidates (TensorCandidate): what the plans choose from
        self._plan: Plan | None = None
        self._layer_of = _rewrite_ops.layer_resolver(model)
        self._budget_checked = False
        self._run_metadata: list = []
        self._probing = False  # the step being checked swaps every eligible candidate, to plan on its graphs
        self._retraces = 0
        self._persistent_tensors = None
        self._cost = None  # the step's StepCost, made after the first step (never while a trace runs)
        self._own_function = model.train_function  # the model's own: a new one (compile()) forgets its plans
        self._memo_key = None  # what this fit's plan is remembered under (memo.py)
        self._remembered: RememberedPlan | None = None  # the plan of an earlier fit, where this fit reuses it
        self._options_key = options_key(options)  # what of the options the remembered plan depends on
        self._found = None  # the first trace's candidates and notes, kept by _reuse for _traced_plan
        self.batch_shapes = None  # the batch's (shape, dtype) leaves, as the first trace saw them
        self._state_built = False  # the model's state built before the first trace (train_function)

    def train_function(self, function):
        """``function`` (Keras's train function over the LMS step) with the model's metrics, loss and optimizer
        state built before its first call (``internals.build_before_trace``): Keras would build them inside the
        first trace, and TensorFlow would then trace the step, and LMS rewrite it, a second time."""

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
            if not self._run_metadata:  # TensorFlow instantiates the function in this step
                stack.enter_context(internals.collected_function_graphs(self._run_metadata))
            if self._lean is not None:
                stack.enter_context(self._lean.applied())
            yield

    def train_step(self, original):
        """``original`` with the swaps inserted into each trace of it."""
        replicas = self.model.distribute_strategy.num_replicas_in_sync

        def lms_train_step(data):
            if not internals.in_function_graph():
                return original(data)
            graph = tf.compat.v1.get_default_graph()
            if self.batch_shapes is None:  # what an out-of-memory error is explained on (callback.py)
                self.batch_shapes = _samples.batch_shapes(data)
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
            self._traced_plan(probe.get_operations(), data, graph=probe)
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

    def _search(self, candidates, transient_peak, budget: bool = True) -> Plan:
        """The one planning rule over ``candidates`` (TensorCandidate) with a predictor of their transient peak."""
        by_tensor = {item.candidate.tensor: item for item in candidates}
        selection = self.selection
        if self.stats.batch_size is None and selection.n_tensors is PLANNED:  # nothing to size a plan with
            return plan_swaps(selection, [item.candidate for item in candidates], None)
        return plan_swaps(selection, [item.candidate for item in candidates],
                          lambda cands: transient_peak([by_tensor[c.tensor] for c in cands]),
                          self._persistent_bytes(), self.budget_bytes if budget else None, self.stats.capacity_bytes,
                          self._cost)

    def _traced_plan(self, ops, data, graph=None, budget_fallback: bool = False):
        """Finds the candidates of a traced step (ops of ``graph`` from ``ops[0]`` on: its backward pass ordered
        where that lowers the predicted peak) and makes the first plan, on the traced graph (``budget_fallback``:
        where the budget is out of reach, the lowest peak with a note). Returns the candidates, notes, the step
        planned on, its input bytes, the plan and the step as Keras traced it."""
        batch = self._batch_size(data)
        found, self._found = self._found, None  # the first trace's candidates, found once (_reuse)
        candidates, notes = found[1] if found is not None and found[0] == (ops[0].name, len(ops), batch) else \
            _rewrite_ops.find_candidates(ops, self._layer_of, self.lb, batch)
        notes = list(notes)
        input_bytes = [_rewrite_ops.static_bytes(t, batch) or 0 for t in tf.nest.flatten(data) if isinstance(t, tf.Tensor)]
        step = plain = _predict.TracedStep(ops, batch, self._elsewhere, input_bytes)
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
                self._search(candidates, step.predicted_transient_peak)
        except BudgetError:  # the probe found it feasible; a retrace with other shapes may not be
            if not budget_fallback:
                raise
            plan = self._search(candidates, step.predicted_transient_peak, budget=False)
            notes.append("the budget is not reachable for one batch shape: the plan with the lowest "
                         "predicted peak is used there")
        self.stats.update(planning_s=time.perf_counter() - started)
        return candidates, notes, step, input_bytes, plan, plain

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
        step.nodes()  # read before the order changes the ops' control inputs
        attempt = _ordering.ordered_step(graph, len(graph.get_operations()) - len(ops), step, self._layer_of,
                                         self.lb, self._elsewhere)
        ordered = attempt is not None and _ordering.lowers_the_peak(self.selection, (step, candidates), attempt)
        self._ordered[step.batch_size] = ordered
        if self.stats.records is None:  # the stats are the first trace's
            self.stats.ordered_layers = len(attempt.ordered.groups) if ordered else 0
        if not ordered:
            if attempt is not None:
                attempt.remove()
            return step, candidates
        return attempt.step, attempt.candidates

    def _persistent(self):
        if self._persistent_tensors is None:
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
        candidates, notes, step, input_bytes, plan, plain = self._traced_plan(ops, data, graph=graph,
                                                                              budget_fallback=True)
        ops = step.ops  # with the backward order's joins, where it is ordered
        by_tensor = {item.candidate.tensor: item for item in candidates}
        chosen_items = [by_tensor[c.tensor] for c in plan.moved]
        if self.stats.records is None and self._trusted_fit(plan, step.batch_size):
            internals.graph_collection_stopped()  # the executed graphs are not needed: none is kept
        if self.stats.records is None and self._searched(plan) and (plan.moved or plan.budget_bytes is None):
            # the first step probes (where the plan has a budget or capacity to fit, only if the traced step does not)
            chosen_items = [by_tensor[c.tensor] for c in self.selection.eligible(item.candidate for item in candidates)]
            self._probing = True
        if self.stats.records is not None:
            self._insert(graph, ops, chosen_items, candidates)  # a retrace: same rule, stats from the first
            return
        batch = step.batch_size
        persistent = self._persistent_bytes()
        without = plain.replay([], explain=True)  # (its nodes are read before the rewrite changes the ops' inputs)
        with_swaps = None if self.recompute == "only" else step.replay(chosen_items, explain=True)
        records = self._insert(graph, ops, chosen_items, candidates)
        self._chosen[batch] = [item.candidate.tensor for item in chosen_items]
        self.candidates, self._plan = candidates, plan
        self.step = _predict.TracedStep(graph.get_operations()[start:], batch, self._elsewhere, input_bytes,
                                        step.ordered)
        # with LMS: the swaps replayed on the traced step, or the step with the clones in it, replayed as it is
        traced, swaps, with_lms = ((step, chosen_items, with_swaps) if with_swaps is not None else
                                   (self.step, [], self.step.replay([], explain=True)))
        traced_peaks = (persistent + with_lms.peak_bytes, persistent + without.peak_bytes)
        self._record(records)
        self.stats.update({
            "active": True, "backend": "tensorflow", "candidates": len(candidates), "persistent_bytes": persistent,
            "device_peak_bytes": traced_peaks[0], "device_peak_bytes_without_lms": traced_peaks[1],
            "prediction_source": "traced graph", "peak_source": "predicted", "traced_device_peaks": traced_peaks,
        })
        self.stats.record_plan(plan)
        context = self._persistent(), self._layer_of, self._optimizer_scope()
        self.stats.update(peak=traced.explain(swaps, *context, with_lms),
                          peak_without_lms=plain.explain([], *context, without))
        if plan.rule is Rule.LOWEST_PEAK and candidates and not plan.moved:
            notes.append(_messages.nothing_helps(without.peak_after or "?", plan.peak_bytes, self._optimizer_scope()))
        self.stats.notes += notes
        self.stats.rewrite_s = time.perf_counter() - started

    def _reuse(self, graph, ops, data) -> bool:
        """The first trace of a fit: where an earlier fit of this model checked a plan for the same candidates,
        options and capacity, its tensors are moved as it moved them, and its stats taken over, with nothing
        planned, probed or replayed again. Plans checked over several steps (the hybrid plan, the backward
        order) are made afresh."""
        if self.stats.records is not None or self._hybrid is not None or self.order_backward:
            return False
        batch = self._batch_size(data)
        candidates, notes = _rewrite_ops.find_candidates(ops, self._layer_of, self.lb, batch)
        self._found = ((ops[0].name, len(ops), batch), (candidates, notes)) if ops else None
        self._memo_key = (batch, tuple((item.candidate.tensor, item.candidate.shape) for item in candidates),
                          self._options_key, self.stats.capacity_bytes)
        remembered = PLANS.recall(self.model, self._own_function, self._memo_key)
        by_tensor = {item.candidate.tensor: item for item in candidates}
        if remembered is None or not all(name in by_tensor for name in remembered.moved):
            return False
        internals.graph_collection_stopped()
        self._run_metadata = [None]  # no executed graph is read
        records = self._insert(graph, ops, [by_tensor[name] for name in remembered.moved], candidates)
        self._chosen[batch], self.candidates, self._remembered = list(remembered.moved), candidates, remembered
        remembered.taken_over(self.stats, "at this batch: nothing planned, probed or replayed again",
                              records=records, planning_s=0.0, plans_tried=0)
        return True

    def first_step_done(self) -> Action:
        """After the first LMS step (and the first after a retrace): the plan checked (``_check_first_step``) and,
        once it stands, remembered for later fits; where this fit reuses a plan, what that fit ended with."""
        if self._remembered is not None:
            remembered, self._remembered = self._remembered, None
            return Action.STEP_OUT if remembered.stepped_out else Action.KEEP
        action = self._check_first_step()
        if action is not Action.RETRACE and self._memo_key is not None and self._retraces < 2:
            moved = () if action is Action.STEP_OUT else self._chosen.get(self.stats.batch_size, ())
            PLANS.remember(self.model, self._own_function, self._memo_key,
                           RememberedPlan(tuple(moved), self.stats, action is Action.STEP_OUT))
            self._memo_key = None
        return action

    def _trusted_fit(self, plan: Plan | None, batch: int | None) -> bool:
        """Whether the traced step fits the device with room (``TRUSTED_FIT`` of the usable capacity), nothing
        moves, and the traced step is the model's own (no lean gradient, recompute or backward order in it)."""
        return (plan is not None and self._searched(plan) and plan.rule is Rule.FITS_DEVICE and not plan.moved
                and plan.peak_bytes is not None and plan.budget_bytes is not None
                and plan.peak_bytes <= TRUSTED_FIT * plan.budget_bytes
                and self._lean is None and self.recompute is False and not self._ordered.get(batch))

    def _searched(self, plan: Plan) -> bool:
        """Whether the plan is searched (and so made on the executed graphs), not given by a count. With
        recompute="only" it is made on the traced graph: a probe would swap."""
        return self.selection.n_tensors is PLANNED and self.stats.batch_size is not None and \
            plan.rule in (Rule.LOWEST_PEAK, Rule.BUDGET, Rule.FITS_DEVICE) and self.recompute != "only"

    def _insert(self, graph, ops, items, candidates) -> list:
        """Moves ``items`` off the device in the traced step ``ops`` of ``graph`` (``candidates``: all of its
        candidates): swapped, recomputed (recompute="only": those that can be), or as the hybrid plan says; under
        a distribution strategy, on every replica (each item's mirrors too: the hybrid plan's recomputes are
        chosen on the first replica's graphs, and the other replicas swap those tensors)."""
        items = _rewrite_ops.with_mirrors(items)
        if self.recompute == "only":
            chains = _recompute.plan_recomputes(items, ops)
            return _recompute.insert_recomputes(graph, [chains[item.tensor.name] for item in items
                                                        if item.tensor.name in chains])
        if self._hybrid is not None:
            return self._hybrid.insert(graph, ops, items, candidates, self._probing)
        return _rewrite_ops.insert_swaps(graph, items, self.host_device)

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
        batch = self._batch_size(data)
        if batch not in self._chosen:
            return False
        ops = graph.get_operations()[start:]
        attempt = _ordering.ordered_step(graph, start, _predict.TracedStep(ops, batch, self._elsewhere),
                                         self._layer_of, self.lb, self._elsewhere) if self._ordered.get(batch) else None
        if attempt is not None:  # ordered as the first trace was
            ops, candidates = attempt.ops, attempt.candidates
        else:
            candidates, _ = _rewrite_ops.find_candidates(ops, self._layer_of, self.lb, batch)
        by_tensor = {item.candidate.tensor: item for item in candidates}
        if not all(name in by_tensor for name in self._chosen[batch]):
            if attempt is not None:
                attempt.remove()
            return False
        records = self._insert(graph, ops, [by_tensor[name] for name in self._chosen[batch]], candidates)
        if self._retraces:
            self._record(records)
        if not self._run_metadata and self.step is not None:  # the executed graphs to read are this trace's
            self.step = _predict.TracedStep(graph.get_operations()[start:], batch, self._elsewhere,
                                            self.step.input_bytes, attempt.ordered if attempt is not None else None)
        return True

    def summary_line(self) -> str:
        return summary_line(self.stats, Words("LMS", "tensors", "swapping", self.host_device, self.device,
                                              lb=f"lb={self.lb}"))

    def close(self) -> None:
        """Nothing to release: the swaps live in the LMS train function, which the callback drops."""
