"""What LMS decides on TensorFlow after a step whose plan is checked (the first, and the first after a retrace):
keep the plan, trace the step again with another, or step out.

The first step's executed graphs (``executed.py``) and its kernels' scratch are read; after a probe (every eligible
candidate swapped) the plan is searched on them, and either traced again or, where a retrace would cost more
than the probe's extra copies over the fit's steps left, the probe's swaps stand. On a GPU the plan is held to
the allocator's measured peak. :class:`FirstStepChecks` is the part of ``backend.TensorFlowBackend`` that does
this; it reads the backend's plan, stats and traced step.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import time

from ... import internals
from ...units import format_size
from ..backend import Action
from ..core import device_model
from ..core.costs import extra_copies_s, probe_stands
from ..core.plan import BudgetError, Plan, Rule
from ..core.scratch import chunk_excess
from ..core.simulate import collector_paused
from ..memo import PLANS, RememberedPlan
from . import compute as _compute
from . import executed as _executed
from . import messages as _messages
from .graph import op_name_in_step

RETRACES_PER_PLAN = 2  # the retraces a plan may take (as many more after a measured step re-plans)


class Phase(enum.Enum):
    """What the step being checked runs (the first step of a fit, and the first after each retrace)."""

    PLANNED = "the plan"  # the traced plan (or nothing moved), checked on its executed graphs
    PROBE = "the probe"  # every eligible candidate swapped, so the plan is made on the graphs TensorFlow executed
    REUSED = "an earlier fit's plan"  # taken over (memo.py): this fit ends as that one did, nothing checked


@dataclasses.dataclass
class CheckState:
    """Where the first step's checks stand on TensorFlow: the phase, the retraces so far and how many the plan
    may take, the probe's figures once read, and what the plan is remembered under for later fits.

    Example:
        >>> state = CheckState()
        >>> state.retraced(probing=True); state.phase, state.may_retrace()
        (<Phase.PROBE: 'the probe'>, True)
        >>> state.retraced(probing=False); state.may_retrace()
        False
    """

    phase: Phase = Phase.PLANNED
    retraces: int = 0
    retrace_limit: int = RETRACES_PER_PLAN
    probe_peak: dict | None = None  # the executed graphs' figures with the probe's swaps, where they were read
    memo_key: tuple | None = None  # what this fit's plan is remembered under (memo.py)
    remembered: RememberedPlan | None = None  # with Phase.REUSED: the earlier fit's plan

    def may_retrace(self) -> bool:
        return self.retraces < self.retrace_limit

    def retraced(self, probing: bool) -> None:
        """The train function is made again; its first step runs the probe or a plan."""
        self.phase, self.retraces, self.probe_peak = Phase.PROBE if probing else Phase.PLANNED, self.retraces + 1, None

    def replanning(self) -> None:
        """A measured step re-plans: as many retraces again."""
        self.retrace_limit = self.retraces + RETRACES_PER_PLAN


class FirstStepChecks:
    """The decisions after a checked step, for ``TensorFlowBackend`` (which holds the state they read: ``_plan``,
    ``stats``, ``step``, ``planner``, ``_graphs``, ``_profiled``, ``_chosen`` and ``check``, a :class:`CheckState`)."""

    def first_step_done(self, measured_step_bytes: int | None = None) -> Action:
        """After the first LMS step (and the first after a retrace): the plan checked (``_check_first_step``), then
        against the allocator's ``measured_step_bytes`` where the callback read them (``_check_measured``) and,
        once it stands, remembered for later fits; where this fit reuses a plan, what that fit ended with."""
        with collector_paused():  # the executed graphs read into many small objects (core.simulate)
            return self._first_step_done(measured_step_bytes)

    def _first_step_done(self, measured_step_bytes: int | None) -> Action:
        check = self.check
        if check.phase is Phase.REUSED:
            check.phase = Phase.PLANNED
            return Action.STEP_OUT if check.remembered.stepped_out else Action.KEEP
        action = self._check_first_step()
        if action is Action.KEEP and measured_step_bytes is None:
            action = self._measured_here()
        elif action is Action.KEEP:
            action = self._check_measured(measured_step_bytes)
        self._profiled = []  # the step's profile, read once
        if action is not Action.RETRACE and check.memo_key is not None and check.retraces < RETRACES_PER_PLAN:
            moved = () if action is Action.STEP_OUT else self._chosen.get(self.stats.batch_size, ())
            PLANS.remember(self.model, self._own_function, check.memo_key,
                           RememberedPlan(tuple(moved), self.stats, action is Action.STEP_OUT))
            check.memo_key = None
        return action

    def _measured_here(self) -> Action:
        """Off a GPU, where the checked step moved tensors and was profiled: what the simulated device itself held
        in it (the allocator, shared with the host, less what the host held along each swap's route:
        ``shared_host.py``), checked as a GPU's allocator reading is (``_check_measured``); nothing where the
        step was not profiled or the profile missed a swap."""
        profiles = self._profiled
        partitions = self.stats.partition_graphs
        if not profiles or not partitions or not self.stats.swapped_tensors + self.stats.recomputed_tensors:
            return Action.KEEP
        from . import shared_host
        from .partitions import swap_routes
        from .traced import device_suffix

        try:
            routes = swap_routes(partitions, device_suffix(self.device))
            before, peak, unseen = shared_host.lms_step_held(profiles[-1], routes, self.step.size_of)
        except Exception as error:  # a measurement must never stop training
            self.stats.notes.append(f"the step was not measured ({type(error).__name__}: {error})")
            return Action.KEEP
        if unseen or peak <= 0:
            return Action.KEEP
        return self._check_measured(max(0, peak - before),
                                    "its allocator less what the host held there, on the simulated device")

    def _check_measured(self, step_bytes: int, source: str | None = None) -> Action:
        """The plan that ran against what the device's allocator held in its step (``TracePlanner.measured``;
        ``source``: how it was read, where not the allocator alone): where more than the plan was allowed,
        planned once more from a step that swaps every eligible tensor."""
        note = self.planner.measured(step_bytes, self._plan, source)
        stats = self.stats
        if self._ran_own_step():  # the device's own reading of the step without LMS, at this batch
            stats.update(device_peak_bytes_without_lms=stats.measured_step_peak_bytes, without_lms_measured=True,
                         without_lms_source="its allocator, in a step that moved nothing")
            if note is None:
                stats.update(device_peak_bytes=stats.measured_step_peak_bytes, peak_source="measured")
        if note is None:
            return Action.KEEP
        self.check.replanning()
        return self._retrace(self._eligible_names(), probing=True, note=note)

    def _ran_own_step(self) -> bool:
        """Whether the step that ran is the model's own: nothing swapped or recomputed, no gradient made lean or
        ordered one layer at a time."""
        stats = self.stats
        return not (stats.swapped_tensors or stats.recomputed_tensors or stats.lean_layers or stats.ordered_layers)

    def _eligible_names(self) -> list[str]:
        return [c.tensor for c in self.selection.eligible(item.candidate for item in self.candidates)]

    def _check_first_step(self) -> Action:
        """After a step whose graphs were collected: the plan made again on the graphs TensorFlow executed
        (once), and the predicted peaks of the plan that runs."""
        metadata = self._graphs.take()
        scratch = self.planner.scratch_attached(self.step, self._scratch_read)  # the traced figures again with it:
        again = functools.cache(lambda: self.planner.unmoved_figures(  # replayed only where read
            self.step, self._persistent(), self._layer_of, self._optimizer_scope()) if scratch else None)
        plan = self._plan
        if self.check.retraces == 0 and plan is not None and not plan.moved and self.planner.trusted_fit(
                plan, self.stats.batch_size, self._lean is not None, again() and again()["device_peak_bytes"]):
            self._graphs.not_wanted()
            self.stats.update(again() or {})
            return self._fits_with_room_kept()
        partitions = _executed.train_partitions(metadata) if metadata is not None else []
        if not partitions or not self.stats.active:  # the traced figures, with the scratch where nothing moved
            unmoved = again() if not self.stats.swapped_tensors + self.stats.recomputed_tensors else None
            self.stats.update(unmoved or {})
            over = unmoved and self.stats.active and self._over_budget(unmoved["device_peak_bytes"], "the traced graph")
            return Action.RETRACE if over else Action.KEEP
        self.stats.partition_graphs = partitions
        if self._profiled:  # off a GPU: each output held at the allocator's chunk as this step's profile read it
            self.step.with_chunks(chunk_excess(self._profiled[-1].events, op_name_in_step))
        if self.recompute == "only":  # the traced figures stand: closer to the measured (docs/measurements.md)
            if not self.stats.recomputed_tensors and self._plan is not None and self._plan.budget_bytes is not None:
                return self._step_out(_messages.why_nothing(self._plan))
            return Action.KEEP
        searching = self._plan is not None and self.planner.searched(self._plan) and self.check.may_retrace()
        # a probe's own figures are read only where its plan stands: not replayed before the search says so
        probe = searching and self.check.phase is Phase.PROBE
        try:
            with_lms, without_lms, unknown = self._executed_peaks(partitions, with_lms=not probe)
        except Exception as error:  # a prediction must never stop training
            self.stats.notes.append(f"prediction from the traced graph only: the executed graph could not be "
                                    f"replayed ({type(error).__name__}: {error})")
            return Action.KEEP
        if not self.stats.without_lms_measured:  # a plain step measured at this batch stands over any replay
            self._figure_without_lms(without_lms["bytes"])
        self.stats.update({"peak_without_lms": without_lms,
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
                with_lms = self.check.probe_peak or self._executed_peaks(partitions, without_lms=False)[0]
                self.stats.update(device_peak_bytes=with_lms["bytes"], peak=with_lms)
        elif self._hybrid is not None and self.stats.swapped_tensors + self.stats.recomputed_tensors and \
                self.check.may_retrace():  # a plan given by a count: its first step swapped it
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

    def _figure_without_lms(self, replayed_bytes: int) -> None:
        """The step's figure without LMS as the process's model of the device has it (``core.device_model``: the
        plain steps ``explain_fit`` measured on this device, model and data), so that LMS, the dashboard and
        ``explain_fit`` say one figure: the plain step measured at this batch, else the replay as those steps correct
        it, else the replay (``replayed_bytes``)."""
        stats = self.stats
        kept = self._measured_device()
        step = None if kept is None else kept.steps.get(device_model.PLAIN, {}).get(stats.batch_size)
        correction = None if kept is None else kept.correction
        if step is not None and step.step_bytes is not None:
            stats.update(device_peak_bytes_without_lms=self._persistent_bytes() + step.step_bytes, without_lms_measured=True,
                         without_lms_source=f"a plain step explain_fit measured at this batch, in "
                                            f"{correction.source if correction is not None else 'its allocator'}")
        elif correction is not None and correction.measured_bytes is not None:
            stats.update(device_peak_bytes_without_lms=correction.applied(replayed_bytes, self._persistent_bytes()),
                         without_lms_source=f"the replay's {format_size(replayed_bytes)} as explain_fit's measured "
                                            "plain steps correct it")
        else:
            stats.update(device_peak_bytes_without_lms=replayed_bytes)

    def _executed_peaks(self, partitions, with_lms: bool = True, without_lms: bool = True):
        """``executed.executed_peaks`` of ``partitions``, reading the probe's ExecutedStep where it holds them."""
        executed = self.executed if self.executed is not None and self.executed.partitions is partitions else None
        return _executed.executed_peaks(partitions, self.device, self.step, self._persistent(), self._layer_of,
                                       self._optimizer_scope(), with_lms, without_lms, executed)

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
        if self.check.phase is not Phase.PROBE:
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
            self.check.phase = Phase.PLANNED
            return Action.KEEP  # no plan fits the budget on these graphs: the probe's swaps stand
        self.stats.update(planning_s=(self.stats.planning_s or 0) + time.perf_counter() - started)
        self.stats.notes = [note for note in self.stats.notes if not note.startswith("no swap lowers the predicted peak")]
        names = [candidate.tensor for candidate in plan.moved]
        # the probe's swaps may stand for a plan that moves fewer, or none (the way out is Keras's step traced anew)
        kept = self._probe_kept(plan, partitions) if names != self._chosen[self.stats.batch_size] else None
        if kept is not None:
            self.check.phase = Phase.PLANNED
            self.stats.notes.append(kept)
            return Action.KEEP
        self._plan = plan
        self.stats.record_plan(plan)
        if not names:
            return self._step_out(_messages.why_nothing(plan))
        if self._hybrid is not None:
            self.stats.notes.append(self._hybrid.choose(executed, names, self.candidates, plan.peak_bytes))
        if names == self._chosen[self.stats.batch_size] and (self._hybrid is None or self._hybrid.state != "on"):
            self.check.phase = Phase.PLANNED
            return Action.KEEP
        return self._retrace(names, probing=False, note=(
            f"planned on the graphs TensorFlow executed in the first step, which swapped every eligible tensor: "
            f"{len(names)} of {len(held)} swapped from the second step, predicted {format_size(plan.peak_bytes)}"))

    def _probe_kept(self, plan: Plan, partitions) -> str | None:
        """Why the probe's swaps (every eligible candidate) stand instead of a retrace for ``plan``, or None: where
        its step fits what the plan had to (its budget, else its peak) and its extra copies over the fit's steps
        left take less than a retrace (about the checked step's own time); in a fit of unknown length, where they
        cost nothing more (``costs.probe_stands``)."""
        cost, left, retrace_s = self.planner.cost, self.stats.steps_left, self.stats.checked_step_s
        if cost is None or retrace_s is None or self._hybrid is not None or \
                not probe_stands(cost, self.stats.swapped_bytes_per_step, plan.moved_bytes, left, retrace_s):
            return None
        extra_s = 0.0 if left is None else extra_copies_s(cost, self.stats.swapped_bytes_per_step, plan.moved_bytes,
                                                          left)
        self.check.probe_peak = self._executed_peaks(partitions, without_lms=False)[0]
        if self.check.probe_peak["bytes"] > (plan.budget_bytes if plan.budget_bytes is not None else plan.peak_bytes):
            return None
        if extra_s > 0:  # they stand for this fit's length: not remembered, a later, longer fit decides for its own
            self.check.memo_key = None
        return _messages.probe_kept(self.stats.swapped_tensors, len(plan.moved), extra_s, left, retrace_s)

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
        self.check.retraced(probing)
        self._graphs.want()
        return Action.RETRACE

    def _step_out(self, why: str) -> Action:
        """Nothing moves from the next step on: the model trains with its own train function; or, where the step
        that ran moved and changed nothing (nor was XLA turned off for it), that step runs on: it is the model's
        own, and Keras's function would be traced again (a large step's first-step time once more)."""
        stats = self.stats
        own = (not stats.swapped_tensors + stats.recomputed_tensors and self._lean is None
               and not self.planner.ordered.get(stats.batch_size) and not internals.jit_compile_requested(self.model))
        note = _messages.kept_own(why) if own else _messages.stepped_out(why)
        stats.notes = [n for n in stats.notes if n != self.jit_note] + [note]
        stats.update(swapped_tensors=0, swapped_bytes_per_step=0, recomputed_tensors=0, recomputed_bytes_per_step=0,
                     lean_layers=0, ordered_layers=0, plan=[], records=[],
                     device_peak_bytes=stats.device_peak_bytes_without_lms, peak=stats.peak_without_lms,
                     peak_source="measured" if stats.without_lms_measured else stats.peak_source)
        return Action.KEEP if own else Action.STEP_OUT

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
