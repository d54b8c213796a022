"""The PyTorch backend of the ``LMS`` callback: one fit's offloading (offload.py), planned like TensorFlow's.

The first step is a probe where the plan is searched (the default, a budget): it offloads every eligible
saved activation, and the order in which they were saved and read back (predict.SavedTensorStep) predicts
the peak of any set offloaded. The plan is the one rule (``core.plan.plan_swaps``: the capacity of the
device where known, else the lowest predicted peak; a budget; or a count); later steps offload the plan's
tensors only, and where it moves nothing the model trains with its own train function.

With ``recompute`` (torch/recompute.py), the first step also notes what each cheap layer's call read, and
watches the activations it does not offload; the plan recomputes the layers that keep fewer bytes for the
backward pass at no higher predicted peak (``predict.choose_recomputes``), then offloads (``True``) or not
(``"only"``: nothing is copied, in the first step either) on the step they make.

The checked plan is remembered (``lms/memo.py``): a later fit of the same model, options and batch shapes offloads
the plan's activations from its first step, without the probe, or, where nothing moved, trains with no hook at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

from ... import internals
from ...units import format_size
from ..backend import Action
from ..core.plan import PLANNED, BudgetError, Plan, Rule, plan_swaps
from ..core.stats import LmsStats
from ..core.summary import Words, summary_line
from ..memo import PLANS, RememberedPlan, options_key
from ..persistent import persistent_bytes
from ..samples import batch_shapes
from ..options import LmsOptions
from .offload import OffloadEvent, TorchOffloader
from .traced import RecomputeChoice, SavedTensorStep, choose_recomputes
from .recompute import InputRecorder, recomputable_layers, recomputed


class TorchBackend:
    """One fit's LMS on the PyTorch backend, for the ``LMS`` callback (the TensorFlowBackend's counterpart).

    Args:
        model: the model being trained.
        options: the LMS options (``device`` None: the device the model trains on).
        stats: the fit's stats (``capacity_bytes`` found by the callback), filled in after the first step.
        observer: handed to the :class:`TorchOffloader` (its events, for watching). Defaults to None.

    Its state (17 attributes) is its arguments, the offloader, and what one fit carries from its first step to the
    next (the backward reads, the graph release plan, the model's own train function, the memo key and what it
    remembered, the lean ops, the batch's shapes, the recomputed tensors, the recorder of the checked step).
    """

    jit_note = ("torch.compile (jit_compile) is off while LMS trains: it traces its own graph around autograd's "
                "saved-tensor hooks")

    def __init__(self, model, options: LmsOptions, stats: LmsStats, observer=None):
        self.offloader = TorchOffloader(options.selection, options.lb, options.budget_bytes, options.device,
                                        self._watch)
        self.model, self.options, self.stats, self._observer = model, options, stats, observer
        self.device, self.lb = str(self.offloader.device), options.lb
        self._reads: list = []  # the first step's backward reads, in order
        self._release_plan = internals.graph_release_plan(model)
        self._own_function = model.train_function  # the model's own: a new one (compile()) forgets its plans
        self._memo_key = None  # what this fit's plan is remembered under (memo.py), from the first batch's shapes
        self._remembered: RememberedPlan | None = None  # an earlier fit's plan, where this fit reuses it
        self._lean = None
        self.batch_shapes = None  # the batch's (shape, dtype) leaves, as the first step saw them
        self._recorder, self._recomputed = None, []
        if options.recompute:
            self._recorder = InputRecorder(recomputable_layers(model, options.selection), options.selection)
            self.offloader.watch_all = True
            if options.recompute == "only":
                self.offloader.n_tensors = 0  # nothing crosses the host link, in the first step either
        if options.lean_ops:
            from .lean import LeanOps

            self._lean = LeanOps(model)
            stats.lean_layers = len(self._lean.layers)
            if not self._lean.layers:
                stats.notes.append("lean_ops: the model has no Keras BatchNormalization layer: nothing to lean")

    def _watch(self, event: OffloadEvent) -> None:
        if event.kind == "read" and self.offloader.steps == 0:
            self._reads.append(event.candidate)
        if self._recorder is not None and self.offloader.steps == 0:
            self._recorder.observe(event)
        if self._observer is not None:
            self._observer(event)

    def train_step(self, original):
        def lms_train_step(data):
            if self._memo_key is None:
                self._recall(data)
                self.batch_shapes = batch_shapes(data)  # what an out-of-memory error is explained on (callback.py)
            if self._remembered is not None and self._remembered.stepped_out:
                return original(data)  # nothing moves: no hook
            return self.offloader.run(original, data)

        return lms_train_step

    def _recall(self, data) -> None:
        """At the first step: the plan an earlier fit of this model checked for these options and batch shapes,
        if any (not with ``recompute`` or ``lean_ops``, whose plans need the first step's records)."""
        import keras

        shapes = tuple(tuple(getattr(leaf, "shape", ())) for leaf in keras.tree.flatten(data))
        self._memo_key = (shapes, options_key(self.options), self.stats.capacity_bytes)
        if self.options.recompute or self._lean is not None:
            return
        self._remembered = PLANS.recall(self.model, self._own_function, self._memo_key)
        if self._remembered is not None:  # the plan's activations from the first step: no probe
            self.offloader.n_tensors = len(self._remembered.moved)

    @contextlib.contextmanager
    def step_scope(self):
        """The model's graph lets go of each activation once its last reader has run, so an offloaded one's
        device memory is free before the forward pass ends (Keras would hold all of them to its end); with
        ``lean_ops``, its BatchNormalization layers lean while the step runs."""
        first = self.offloader.steps == 0
        with internals.graph_intermediates_released(self._release_plan), \
                (self._lean.applied() if self._lean is not None else contextlib.nullcontext()), \
                (self._recorder.recording() if first and self._recorder is not None else
                 recomputed(self._recomputed) if self._recomputed else contextlib.nullcontext()):
            yield

    def first_step_done(self, measured_step_bytes: int | None = None) -> Action:
        """After the first step: the plan made on its saved activations (or an earlier fit's taken over), and
        remembered for later fits."""
        if self._remembered is not None:
            return self._reused()
        action = self._plan_first_step()
        if action is Action.KEEP and self.stats.active and not self.options.recompute:
            self._predict_step_time()
        if self._memo_key is not None and self.stats.active and not self.options.recompute and self._lean is None \
                and self.offloader.n_tensors != -1:  # (-1: the budget was out of reach, the probe's swaps stand)
            moved = tuple(row["tensor"] for row in self.stats.plan if row["action"] == "swap")
            PLANS.remember(self.model, self._own_function, self._memo_key,
                           RememberedPlan(moved, self.stats, action is Action.STEP_OUT))
        return action

    def _predict_step_time(self) -> None:
        """The plan's predicted step time (``predicted_step_ratio``): the step's matrix FLOPs at the fit's batch,
        read off the explain predictor's two small runs (forward and backward at batch 2 and 3 on zeros shaped as
        the batch, outside the fit's steps; nothing updated, the model's state and PyTorch's random numbers as
        they were: ``predictor.py``), at the device's matrix-product rate, and the host link."""
        from ...memory.bandwidth import host_link_bandwidth
        from ..core.costs import StepCost
        from ..samples import zeros_like_batch
        from .predictor import TorchStepPredictor

        try:
            compute_s = TorchStepPredictor(self.model, zeros_like_batch(self.batch_shapes)).estimated_compute_s(
                self.stats.batch_size)
        except Exception as error:  # a prediction must never stop training
            self.stats.notes.append(f"no step-time prediction ({type(error).__name__}: {error})")
            return
        if compute_s <= 0:
            return
        cost = StepCost.estimated(compute_s, TorchStepPredictor.compute_estimate + ", read off two small runs",
                                  host_link_bandwidth())
        self.stats.update(predicted_step_ratio=cost.ratio(self.stats.swapped_bytes_per_step),
                          compute_s=cost.compute_s, compute_source=cost.source)

    def _reused(self) -> Action:
        """An earlier fit's plan taken over: its figures, with this fit's own pinned memory where it offloads."""
        remembered, figures = self._remembered, {}
        if not remembered.stepped_out:
            found = self.offloader.stats()
            figures = {name: found[name] for name in ("pinned", "pinned_pool_bytes", "pinned_allocations")}
        remembered.taken_over(self.stats, "for these batch shapes: no activation was probed"
                              + (", and no hook was installed" if remembered.stepped_out else ""), **figures)
        return Action.STEP_OUT if remembered.stepped_out else Action.KEEP

    def _plan_first_step(self) -> Action:
        found = self.offloader.stats()
        found["notes"] = self.stats.notes + found["notes"]
        self.stats.update(found)
        self.offloader.watch_all = False
        eligible = self.offloader.selection.eligible(self.offloader.candidates)
        if not eligible:
            return Action.KEEP
        try:
            plan, choice = self._plan(eligible)
        except BudgetError as error:  # measured only now: the probe's swaps stand, said
            self.stats.notes.append(f"the budget: {error}; every eligible activation stays offloaded")
            self.offloader.n_tensors = -1
            return Action.KEEP
        self._recomputed = [layer for layer in self._recorder.layers if layer.name in choice.layers] \
            if choice is not None else []
        self.offloader.n_tensors = len(plan.moved)
        moved = list(plan.moved)
        recomputed = choice.step.recomputed if self._recomputed else []
        rows = [("swap", c) for c in moved] + [("recompute", c) for c in recomputed]
        self.stats.update(swapped_tensors=len(moved), swapped_bytes_per_step=plan.moved_bytes,
                          recomputed_tensors=len(recomputed),
                          recomputed_bytes_per_step=sum(c.nbytes for c in recomputed),
                          device_peak_bytes=plan.peak_bytes, device_peak_bytes_without_lms=plan.peak_bytes_without_lms,
                          peak_source="predicted", prediction_source=self._source)
        self.stats.record_plan(plan, rows)
        if not moved and not recomputed and self.options.n_tensors is PLANNED:
            why = ("the step fits the device" if plan.rule is Rule.FITS_DEVICE else
                   "the step fits the budget" if plan.rule is Rule.BUDGET else
                   "no offload or recompute lowers the predicted peak")
            self.stats.notes.append(f"{why} ({format_size(plan.peak_bytes)} predicted): nothing moves from the second "
                                    "step on, and the model trains with its own train function")
            self.stats.lean_layers = 0  # the model's own train function: Keras's BatchNormalization
            return Action.STEP_OUT
        return Action.KEEP

    def _plan(self, eligible) -> tuple[Plan, RecomputeChoice | None]:
        """The one rule on the first step's saved activations, their peak predicted by replaying them; with
        ``recompute``, on the step its chosen layers make (swaps alone where that is predicted lower)."""
        step = SavedTensorStep(eligible, self._reads, self.lb)
        persistent = persistent_bytes(self.model)
        offset, self._source = 0, "saved activations of the first step, replayed"
        measured = self.offloader.peak_bytes
        if measured is not None:  # CUDA: what the replay leaves out, from the probe's measured peak
            probe = persistent + step.transient_peak(eligible if self.offloader.n_tensors == -1 else
                                                     eligible[:self.offloader.n_tensors])
            offset = max(0, measured - probe)
            self._source += f", plus {format_size(offset)} the allocator's first-step peak shows beyond them"
        selection, recompute = self.offloader.selection, self.options.recompute
        budget, capacity = self.options.budget_bytes, self.stats.capacity_bytes
        if recompute == "only":  # nothing is offloaded: the plan is the recomputes
            selection, budget, capacity = dataclasses.replace(selection, n_tensors=0), None, None
            if self.options.budget_bytes is not None:
                self.stats.notes.append("recompute='only' on PyTorch recomputes what lowers the peak whatever the "
                                        "budget; recompute=True offloads the rest to meet it")
        plan_on = functools.partial(plan_swaps, selection, persistent_bytes=persistent + offset,
                                    budget_bytes=budget, capacity_bytes=capacity)
        if not recompute:
            return plan_on(eligible, step.transient_peak), None
        choice = choose_recomputes(eligible, self._reads, self._recorder.layer_inputs(), self.lb,
                                   self.offloader.shared)
        self.stats.notes.append(f"recompute={recompute!r}: {len(choice.layers)} of {len(self._recorder.layers)} "
                                "cheap layers (normalizations, activations, dropout) recomputed, those that keep "
                                "fewer bytes for the backward pass at no higher predicted peak")
        try:
            plan = plan_on(choice.saved, choice.step.transient_peak)
        except BudgetError:
            if recompute == "only":
                raise
            plan = None
        if recompute is True and choice.layers:
            swaps_alone = plan_on(eligible, step.transient_peak)
            if plan is None or not _hybrid_kept(plan, swaps_alone):
                self.stats.notes.append("the recomputes' plan " + (
                    f"({format_size(plan.peak_bytes)} predicted) is above swaps alone "
                    f"({format_size(swaps_alone.peak_bytes)})" if plan is not None else "does not fit the budget")
                    + ": swaps alone")
                return swaps_alone, None
        plan = dataclasses.replace(plan, peak_bytes_without_lms=persistent + offset + step.transient_peak([]))
        return plan, choice

    def summary_line(self) -> str:
        return summary_line(self.stats, Words(
            "LMS (PyTorch)", "saved activations", "offloading",
            f"{'pinned ' if self.stats.pinned else ''}host memory", self.device, lb=f"lb={self.lb} layers",
            lean="BatchNormalization", recomputed_layers=len(self._recomputed) if self.stats.recomputed_tensors else None))

    def close(self) -> None:
        self.offloader.close()


def _hybrid_kept(hybrid: Plan, swaps_alone: Plan) -> bool:
    """Whether the hybrid plan stands against swaps alone: a peak no higher, or, where a budget or the device's
    capacity is the target, fitting it with fewer bytes over the host link."""
    return hybrid.peak_bytes <= swaps_alone.peak_bytes or (
        bool(hybrid.fits) and hybrid.moved_bytes < swaps_alone.moved_bytes)

