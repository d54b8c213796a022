"""LMS on TensorFlow: the per-fit engine behind the ``LMS`` callback.

Each trace of the train step is rewritten as it is traced: candidates found, a first plan made on the traced graph
(``planner.py``), swap ops inserted (``rewrite.py``). Where the plan is searched (the default, a budget), the first
step is a probe that swaps every eligible candidate; the graphs TensorFlow executed in it (``executed.py``), any
subset of the swaps undone, and its kernels' scratch (read off the allocator, off a GPU) are planned on. A plan that
differs is traced again (one retrace), unless the probe's extra copies over the fit's steps left cost less than a
retrace (then its swaps stand); one that moves nothing steps LMS out (``first_step.py`` decides). Where the traced
step fits the device, the first step swaps nothing, and LMS steps out after it if its executed graphs fit too. The checked plan is
remembered (``lms/memo.py``). Grappler runs as without LMS, so the kernels that run, and the math, are a plain
fit's. On a GPU, the plan's first step is held to the allocator's peak (``TracePlanner.measured``).
"""

from __future__ import annotations

import contextlib
import time

import tensorflow as tf

from ... import internals
from .. import samples as _samples
from ..core import device_model
from ..core.plan import Plan
from ..core.scratch import kernel_scratch
from ..core.simulate import collector_paused
from ..core.stats import LmsStats
from ..core.summary import Words, summary_line
from ..memo import PLANS, options_key
from ..options import LmsOptions
from ..persistent import persistent_tensors
from . import internals as tf_internals
from . import executed as _executed
from . import hybrid as _hybrid
from . import lean as _lean
from . import recompute as _recompute
from . import rewrite as _rewrite_ops
from .first_step import CheckState, FirstStepChecks, Phase
from .graph import op_name_in_step, replica_prefix
from .planner import TracePlanner
from .traced import TracedStep

class TensorFlowBackend(FirstStepChecks):
    """One fit's LMS on TensorFlow, filling in the fit's stats as the step is traced and run.

    Args:
        model: the compiled Keras model.
        options: the LMS options, with ``device`` and ``host_device`` resolved.
        stats: the fit's stats (``capacity_bytes`` and ``batch_size`` found by the callback).

    Its state, by part: what it was given (the model, options, stats), the planner and the optional parts
    (lean ops, the hybrid plan), the traces' (the step traced, its candidates, the plan and the tensors it swaps
    by batch size, the executed graphs and scratch wanted), the first step's checks (``check``: a
    ``first_step.CheckState``) and the memo's (the model's own function, the options' key). The parts that
    decide are in ``planner.py`` and ``first_step.py``; what stays here is read by both.
    """

    jit_note = "XLA (jit_compile) is off while LMS trains: XLA ignores the swap ordering"

    def __init__(self, model, options: LmsOptions, stats: LmsStats):
        self.model, self.options, self.stats = model, options, stats
        self._layer_of = _rewrite_ops.layer_resolver(model)
        self.planner = TracePlanner(options, stats, self._layer_of, self._elsewhere, self._persistent_bytes,
                                    self._measured_device)
        self._model_flags = device_model.model_flags(model)  # before the steps set XLA off while traced
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
        self._profiled: list = []  # the checked step's profile off a GPU (core.scratch.StepProfile), until read
        self.check = CheckState()  # the first step's checks: phase, retraces, the probe's figures, the memo's key
        self._persistent_tensors = None
        self._own_function = model.train_function  # the model's own: a new one (compile()) forgets its plans
        self._options_key = options_key(options)  # what of the options the remembered plan depends on
        self.batch_shapes = None  # the batch's (shape, dtype) leaves, as the first trace saw them
        self._state_built = False  # the model's state built before the first trace (train_function)
        self._start_profile = None  # starts the checked step's profile: once traced, or before a call that runs

    # what the options say, read where the rewrite and the checks need them
    selection = property(lambda self: self.options.selection)
    lb = property(lambda self: self.options.lb)
    budget_bytes = property(lambda self: self.options.budget_bytes)
    device = property(lambda self: self.options.device)
    host_device = property(lambda self: self.options.host_device)
    recompute = property(lambda self: self.options.recompute)
    order_backward = property(lambda self: self.planner.order_backward)

    @property
    def _elsewhere(self) -> tuple:
        """The devices LMS does not relieve: the host and, under a distribution strategy, every replica's device
        but the first's (relieved with the first's plan, its ops counted)."""
        return (self.host_device, *(d for d in self.stats.devices if d != self.device))

    def train_function(self, function):
        """``function`` with the model's metrics, loss and optimizer state built before its first call
        (``internals.build_before_trace``): built inside the first trace, the step would be traced twice."""

        called = False

        def call(iterator, *rest, **kwargs):
            nonlocal called
            if not self._state_built:
                self._state_built = True
                internals.build_before_trace(self.model, getattr(iterator, "element_spec", None))
            if called and self._start_profile is not None:  # traced before: the profile takes the whole call
                self._start_profile()
            called = True
            return function(iterator, *rest, **kwargs)

        return call

    @contextlib.contextmanager
    def step_scope(self):
        """The executed graphs collected while a step's plan is checked (the first step, and the step after a
        retrace); with ``lean_ops``, the model's BatchNormalization layers lean while the step runs (traces)."""
        with contextlib.ExitStack() as stack:
            if self._graphs.wanted:  # the graphs TensorFlow instantiates in this step; off a GPU, its profile: the
                # kernels' scratch (once) and, on the simulated device, what LMS's step held there (_measured_here)
                self._profiled.clear()
                # started once the step is traced (lms_train_step): the trace's events are not the step's
                self._start_profile = stack.enter_context(
                    _executed.step_profile_recorded(self._step_profiled, self.device, deferred=True))
                stack.callback(setattr, self, "_start_profile", None)
                stack.enter_context(tf_internals.collected_function_graphs(self._graphs.collected))
            if self._lean is not None:
                stack.enter_context(self._lean.applied())
            yield

    def _step_profiled(self, profile) -> None:
        if self.check.retraces == 0:
            self._scratch_read.append(kernel_scratch(profile.events, op_name_in_step))
        self._profiled.append(profile)

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
                if self._start_profile is not None:  # what follows is the step itself (and the graph's optimizing)
                    self._start_profile()
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

    def _measured_device(self):
        """What the process measured of this model on this device with these data (``core.device_model``: the
        plain steps ``explain_fit`` ran), read once the first trace saw the batch; None where nothing was."""
        return device_model.find(self.model, device_model.setup_key(
            self.model, self.device, device_model.sample_shapes(self.batch_shapes), self._model_flags))

    def _optimizer_scope(self) -> str | None:
        return getattr(getattr(self.model, "optimizer", None), "name", None)

    def _rewrite(self, graph, start: int, data) -> None:
        with collector_paused():  # the step's graph read into many small objects (core.simulate)
            self._rewrite_paused(graph, start, data)

    def _rewrite_paused(self, graph, start: int, data) -> None:
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
            self.check.phase = Phase.PROBE
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
        self.check.memo_key = (batch, tuple((item.candidate.tensor, item.candidate.shape) for item in candidates),
                          self._options_key, self.stats.capacity_bytes)
        remembered = PLANS.recall(self.model, self._own_function, self.check.memo_key)
        by_tensor = {item.candidate.tensor: item for item in candidates}
        if remembered is None or not all(name in by_tensor for name in remembered.moved):
            return False
        tf_internals.graph_collection_stopped()
        self._graphs.not_wanted()
        records = self._insert(graph, ops, [by_tensor[name] for name in remembered.moved], candidates)
        self._chosen[batch], self.candidates = list(remembered.moved), candidates
        self.check.phase, self.check.remembered = Phase.REUSED, remembered
        remembered.taken_over(self.stats, "at this batch: nothing planned, probed or replayed again",
                              records=records, planning_s=0.0, plans_tried=0)
        return True

    def _insert(self, graph, ops, items, candidates) -> list:
        """Moves ``items`` off the device in the traced step ``ops`` of ``graph`` (``recompute.move_off``)."""
        return _recompute.move_off(graph, ops, items, self.host_device, self.recompute, self._hybrid, candidates,
                                   self.check.phase is Phase.PROBE)

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
        if self.check.retraces:
            self._record(records)
        if self._graphs.wanted and self.step is not None:  # the executed graphs to read are this trace's
            self.step = TracedStep(graph.get_operations()[start:], batch, self._elsewhere, self.step.input_bytes,
                                   attempt.ordered if attempt is not None else None, scratch=self.step.scratch)
        return True

    # -- after a step whose executed graphs were collected -----------------------------------------------
    def summary_line(self) -> str:
        return summary_line(self.stats, Words("LMS", "tensors", "swapping", self.host_device, self.device,
                                              lb=f"lb={self.lb}"))

    def close(self) -> None:
        """Nothing to release: the swaps live in the LMS train function, which the callback drops."""
