"""The PyTorch backend of the ``LMS`` callback: one fit's offloading (offload.py), planned like TensorFlow's.

The first step is a probe where the plan is searched (the default, a budget): it offloads every eligible
saved activation, and the order in which they were saved and read back (predict.SavedTensorStep) predicts
the peak of any set offloaded. The plan is the one rule (``core.plan.plan_swaps``: the capacity of the
device where known, else the lowest predicted peak; a budget; or a count); later steps offload the plan's
tensors only, and where it moves nothing the model trains with its own train function.
"""

from __future__ import annotations

import contextlib

from ... import compat
from ...units import MIB, format_size
from ..backend import Action
from ..core.plan import PLANNED, BudgetError, Plan, Rule, plan_swaps
from ..core.stats import LmsStats
from ..options import LmsOptions
from .offload import OffloadEvent, TorchOffloader
from .predict import SavedTensorStep


class TorchBackend:
    """One fit's LMS on the PyTorch backend, for the ``LMS`` callback (the TensorFlowBackend's counterpart).

    Args:
        model: the model being trained.
        options: the LMS options (``device`` None: the device the model trains on).
        stats: the fit's stats (``capacity_bytes`` found by the callback), filled in after the first step.
        observer: handed to the :class:`TorchOffloader` (its events, for watching). Defaults to None.
    """

    jit_note = ("torch.compile (jit_compile) is off while LMS trains: it traces its own graph around autograd's "
                "saved-tensor hooks")

    def __init__(self, model, options: LmsOptions, stats: LmsStats, observer=None):
        self.offloader = TorchOffloader(options.selection, options.lb, options.budget_bytes, options.device,
                                        self._watch)
        self.model, self.options, self.stats, self._observer = model, options, stats, observer
        self.device, self.lb = str(self.offloader.device), options.lb
        self._reads: list = []  # the first step's backward reads, in order
        self._release_plan = compat.graph_release_plan(model)
        self._lean = None
        if options.order_backward:
            stats.notes.append("order_backward is not available on PyTorch: the backward pass runs in autograd's "
                               "order")
        if options.lean_ops:
            from .lean import LeanOps

            self._lean = LeanOps(model)
            stats.lean_layers = len(self._lean.layers)
            if not self._lean.layers:
                stats.notes.append("lean_ops: the model has no Keras BatchNormalization layer: nothing to lean")

    def _watch(self, event: OffloadEvent) -> None:
        if event.kind == "read" and self.offloader.steps == 0:
            self._reads.append(event.candidate)
        if self._observer is not None:
            self._observer(event)

    def train_step(self, original):
        return lambda data: self.offloader.run(original, data)

    @contextlib.contextmanager
    def step_scope(self):
        """The model's graph lets go of each activation once its last reader has run, so an offloaded one's
        device memory is free before the forward pass ends (Keras would hold all of them to its end); with
        ``lean_ops``, its BatchNormalization layers lean while the step runs."""
        with compat.graph_intermediates_released(self._release_plan), \
                (self._lean.applied() if self._lean is not None else contextlib.nullcontext()):
            yield

    def first_step_done(self) -> Action:
        found = self.offloader.stats()
        found["notes"] = self.stats.notes + found["notes"]
        self.stats.update(found)
        eligible = self.offloader.selection.eligible(self.offloader.candidates)
        if not eligible:
            return Action.KEEP
        try:
            plan = self._plan(eligible)
        except BudgetError as error:  # measured only now: the probe's swaps stand, said
            self.stats.notes.append(f"the budget: {error}; every eligible activation stays offloaded")
            return Action.KEEP
        self.offloader.n_tensors = len(plan.moved)
        moved = list(plan.moved)
        self.stats.update(swapped_tensors=len(moved), swapped_bytes_per_step=plan.moved_bytes,
                          plan=[{"tensor": c.tensor, "layer": c.layer, "layer_type": c.layer_type, "shape": c.shape,
                                 "bytes": c.nbytes} for c in moved],
                          plan_rule=plan.rule, budget_bytes=plan.budget_bytes, plans_tried=plan.plans_tried,
                          device_peak_bytes=plan.peak_bytes, device_peak_bytes_without_lms=plan.peak_bytes_without_lms,
                          peak_source="predicted", prediction_source=self._source)
        if plan.note:
            self.stats.notes.append(plan.note)
        if not moved and self.options.n_tensors is PLANNED:
            why = ("the step fits the device" if plan.rule is Rule.FITS_DEVICE else
                   "the step fits the budget" if plan.rule is Rule.BUDGET else "no offload lowers the predicted peak")
            self.stats.notes.append(f"{why} ({format_size(plan.peak_bytes)} predicted): nothing moves from the second "
                                    "step on, and the model trains with its own train function")
            self.stats.lean_layers = 0  # the model's own train function: Keras's BatchNormalization
            return Action.STEP_OUT
        return Action.KEEP

    def _plan(self, eligible) -> Plan:
        """The one rule on the first step's saved activations, their peak predicted by replaying them."""
        step = SavedTensorStep(eligible, self._reads, self.lb)
        persistent = _variables_bytes(self.model)
        offset, self._source = 0, "saved activations of the first step, replayed"
        measured = self.offloader.peak_bytes
        if measured is not None:  # CUDA: what the replay leaves out, from the probe's measured peak
            probe = persistent + step.transient_peak(eligible if self.offloader.n_tensors == -1 else
                                                     eligible[:self.offloader.n_tensors])
            offset = max(0, measured - probe)
            self._source += f", plus {format_size(offset)} the allocator's first-step peak shows beyond them"
        return plan_swaps(self.offloader.selection, eligible, step.transient_peak, persistent + offset,
                          self.options.budget_bytes, self.stats.capacity_bytes)

    def summary_line(self) -> str:
        stats = self.stats
        peak = stats.device_peak_bytes
        return (f"LMS (PyTorch): offloading {stats.swapped_tensors} of {stats.candidates} saved activations "
                f"({stats.swapped_bytes_per_step / MIB:.1f} MiB per step, lb={self.lb} layers) to "
                f"{'pinned ' if stats.pinned else ''}host memory; "
                + (f"predicted {self.device} peak {peak / MIB:.1f} MiB with LMS, "
                   f"{stats.device_peak_bytes_without_lms / MIB:.1f} MiB without ({stats.prediction_source})"
                   if peak is not None else "no device peak predicted")
                + (f"; lean BatchNormalization in {stats.lean_layers} layers" if stats.lean_layers else ""))

    def close(self) -> None:
        self.offloader.close()


def _variables_bytes(model) -> int:
    """The bytes of the model's and its optimizer's variables (held through the step)."""
    import numpy as np

    optimizer = getattr(model, "optimizer", None)
    variables = {id(v): v for v in list(model.variables) + list(getattr(optimizer, "variables", []))}.values()
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)
