"""LMS on TensorFlow after a step has run: the plan checked, and made again, on the graphs TensorFlow executed.

The part of ``TensorFlowBackend`` (``backend.py``) that runs after its first step (and after the first step
of a retrace): the executed partition graphs replayed for the peaks with and without LMS, the plan searched
again on them after a probe, the hybrid plan's recomputes chosen or dropped, a retrace where the plan
changed, and LMS stepping out where nothing moves. A mixin: it reads and sets the backend's own state.
"""

from __future__ import annotations

import time

from ... import internals
from ...units import format_size
from ..backend import Action
from ..core.plan import TRUSTED_FIT, BudgetError, Rule
from . import compute as _compute
from . import messages as _messages
from . import predict as _predict


class ExecutedStepChecks:
    """``_check_first_step`` and what it calls, for :class:`~lms_magic.lms.tensorflow.backend.TensorFlowBackend`."""

    def _check_first_step(self) -> Action:
        """After a step whose graphs were collected: the plan made again on the graphs TensorFlow executed
        (once), and the predicted peaks of the plan that runs."""
        if self._retraces == 0 and self._trusted_fit(self._plan, self.stats.batch_size):  # no graph was collected
            self._run_metadata = [None]
            return self._fits_with_room_kept()
        partitions = _predict.train_partitions(self._run_metadata[0]) if self._run_metadata else []
        self._run_metadata = [None]  # read once; the protos are released
        if not partitions or not self.stats.active:
            return Action.KEEP
        self.stats.partition_graphs = partitions
        if self.recompute == "only":  # the traced figures stand: closer to the measured (docs/measurements.md)
            if not self.stats.recomputed_tensors and self._plan is not None and self._plan.budget_bytes is not None:
                return self._step_out(_messages.why_nothing(self._plan))
            return Action.KEEP
        searching = self._plan is not None and self._searched(self._plan) and self._retraces < 2
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
        if self._cost is None:
            self._cost = self._step_cost()
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
                self._retraces < 2:  # a plan given by a count: its first step swapped it
            action = self._hybrid_check(lambda: _predict.ExecutedStep(partitions, self.device, self.step),
                                        with_lms["bytes"])
        if action is not Action.RETRACE and self._cost is not None:
            self.stats.update(predicted_step_ratio=self._cost.ratio(self.stats.swapped_bytes_per_step),
                              compute_s=self._cost.compute_s, compute_source=self._cost.source)
        if action is Action.KEEP and len(self.stats.devices) > 1:
            self._peaks_by_device(partitions)
        return action

    def _peaks_by_device(self, partitions) -> None:
        """Under a distribution strategy: each replica's device replayed on its own executed graph, with LMS and
        without (``stats.device_peaks``; the plan was made on the first's)."""
        peaks = {}
        for device in self.stats.devices:
            try:
                with_lms, without_lms, _ = _predict.executed_peaks(partitions, device, self.step, self._persistent(),
                                                                   self._layer_of, self._optimizer_scope())
            except Exception as error:  # a prediction must never stop training
                self.stats.notes.append(f"{device}'s peaks not predicted ({type(error).__name__}: {error})")
                continue
            peaks[device] = {"with_lms": with_lms["bytes"], "without_lms": without_lms["bytes"]}
        self.stats.device_peaks = peaks

    def _executed_peaks(self, partitions, with_lms: bool = True, without_lms: bool = True):
        return _predict.executed_peaks(partitions, self.device, self.step, self._persistent(), self._layer_of,
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
            if plan.budget_bytes is not None and not plan.moved and plain_peak_bytes > plan.budget_bytes:
                return self._retrace(self._eligible_names(), probing=True, note=(
                    f"the executed graphs predict {format_size(plain_peak_bytes)}, above the "
                    f"{format_size(plan.budget_bytes)} the traced step fit: every eligible tensor swapped in the next "
                    "step, to plan on its graphs"))
            moved = self.stats.swapped_tensors + self.stats.recomputed_tensors
            if not moved:
                return self._step_out(_messages.why_nothing(plan))
            if plan.rule is Rule.LOWEST_PEAK and self.stats.device_peak_bytes > plain_peak_bytes:
                return self._step_out(f"the executed graphs predict {format_size(self.stats.device_peak_bytes)} "
                                      f"with the planned {moved} tensors moved, above "
                                      f"{format_size(plain_peak_bytes)} without")
            return Action.KEEP if self._hybrid is None else self._hybrid_check(
                lambda: _predict.ExecutedStep(partitions, self.device, self.step), self.stats.device_peak_bytes)
        executed = self.executed = _predict.ExecutedStep(partitions, self.device, self.step)
        held = [item for item in self.candidates if executed.holds(item)]
        started = time.perf_counter()
        try:
            plan = self._search(held, executed.transient_peak)
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

    def _eligible_names(self) -> list[str]:
        return [c.tensor for c in self.selection.eligible(item.candidate for item in self.candidates)]

    def _retrace(self, names: list[str], probing: bool, note: str) -> Action:
        """The train function made again (by the callback) with ``names`` swapped; its first step is checked."""
        self.stats.notes.append(note)
        self._chosen[self.stats.batch_size] = names
        self._probing, self._retraces = probing, self._retraces + 1
        self._run_metadata = []  # the next step's executed graphs give the figures
        return Action.RETRACE

    def _step_out(self, why: str) -> Action:
        """Nothing moves from the next step on: the model trains with its own train function."""
        stats = self.stats
        stats.notes = [note for note in stats.notes if note != self.jit_note]
        stats.notes.append(f"{why}: nothing moves from the second step on, and the model trains with its own train "
                           "function (with XLA where it was compiled so)")
        stats.update(swapped_tensors=0, swapped_bytes_per_step=0, recomputed_tensors=0, recomputed_bytes_per_step=0,
                     lean_layers=0, ordered_layers=0, plan=[], records=[],
                     device_peak_bytes=stats.device_peak_bytes_without_lms, peak=stats.peak_without_lms)
        return Action.STEP_OUT

    def _fits_with_room_kept(self) -> Action:
        """The traced step fits the device with room: no probe, no executed graphs. The LMS train function holds
        the model's own step (nothing inserted), so it goes on, and nothing is traced again; where the model asks
        for XLA, the model's own train function takes over from the next step, with XLA."""
        plan = self._plan
        why = (f"the step fits the device with room ({format_size(plan.peak_bytes)} predicted on the traced graph, "
               f"within {TRUSTED_FIT:.0%} of the {format_size(plan.budget_bytes)} LMS plans to fill)")
        if internals.jit_compile_requested(self.model):
            return self._step_out(why)
        self.stats.notes.append(f"{why}: nothing moves, no step was probed, and the step runs as traced, the "
                                "model's own")
        return Action.KEEP

    def _hybrid_check(self, executed, peak_bytes: int) -> Action:
        """The hybrid plan after a step whose executed graphs (``executed``: a function making their
        ExecutedStep) predict ``peak_bytes``: after one that swapped the plan's tensors, its recomputes chosen
        on them and run from the next step; after one that ran them, swaps alone from the next step where
        they raised the predicted peak."""
        hybrid, names = self._hybrid, self._chosen[self.stats.batch_size]
        if hybrid.state == "swaps first":
            self.stats.notes.append(hybrid.choose(executed(), names, self.candidates, peak_bytes))
            return self._retrace(names, probing=False, note="the hybrid plan's recomputes run from the next step") \
                if hybrid.state == "on" else Action.KEEP
        if hybrid.raised_the_peak(peak_bytes, self.stats.recomputed_tensors):
            return self._retrace(names, probing=False, note=(
                f"the executed graphs predict {format_size(peak_bytes)} with the hybrid plan's "
                f"{self.stats.recomputed_tensors} recomputes, above the {format_size(hybrid.swap_only_peak_bytes)} "
                "of swaps alone: swaps alone from the next step"))
        return Action.KEEP
