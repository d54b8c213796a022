"""What LMS did in one fit: ``LMS.stats``, one typed record for every backend.

Every field has one meaning on every backend; where a backend fills it
differently, a field says how: ``peak_source`` ("predicted"; "measured" on PyTorch with
CUDA where nothing was eligible to plan) for ``device_peak_bytes``, and ``lb_counts``
("backward ops" or "layers") for ``lb``. The record reads as attributes
(``stats.swapped_tensors``) and, as before it was typed, by key
(``stats["swapped_tensors"]``); ``to_dict()`` is the plain, exportable form.
No framework is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

_INTERNAL = ("records", "partition_graphs")  # graph objects, for inspection: not exported


@dataclass
class LmsStats:
    """What LMS swapped and the device peaks it predicted or measured.

    A record, not an actor: its fields (about 50) are the figures ``callback.stats[...]``, the dashboard and the
    summary line read, each filled in by the part of LMS that found it; nothing here decides anything.

    Example:
        >>> stats = LmsStats(active=True, backend="torch", swapped_tensors=3, device_peak_bytes=2**20,
        ...                  peak_source="measured", lb_counts="layers")
        >>> stats.swapped_tensors, stats["swapped_tensors"], stats.measured_device_peak_bytes
        (3, 3, 1048576)
        >>> stats.predicted_device_peak_bytes is None, "plan" in stats.to_dict()
        (True, True)
        >>> stats["swaped_tensors"]  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        KeyError: "LMS stats have no 'swaped_tensors'; they have: active, reason, backend, steps, batch_size, ..."
    """

    active: bool = False
    reason: str = ""  # why LMS is inactive
    backend: Literal["tensorflow", "torch", "jax"] | None = None
    steps: int = 0  # train steps run with LMS in this fit
    batch_size: int | None = None  # the batch the plan is sized for (the largest the data yields)
    batch_size_source: str = ""  # where it was read: "the traced batch", "the fit call's batch_size", ...
    candidates: int = 0  # activations the backward pass reads that LMS could swap
    swapped_tensors: int = 0
    swapped_bytes_per_step: int = 0  # each also comes back: the host link carries twice this
    recomputed_tensors: int = 0  # dropped after the forward pass and computed again on the device (recompute=...)
    recomputed_bytes_per_step: int = 0  # their bytes: nothing of them crosses the host link
    lean_layers: int = 0  # layers whose gradient lean_ops computes in one piece (TensorFlow's BatchNormalization)
    ordered_layers: int = 0  # layers whose gradients run one at a time (order_backward; TensorFlow)
    device_peak_bytes: int | None = None  # with LMS; predicted or measured, as peak_source says
    device_peak_bytes_without_lms: int | None = None  # predicted (TensorFlow), or measured: without_lms_measured
    # device_peak_bytes_without_lms is the device's allocator's reading of a step at this batch that moved nothing
    # (the model's own step: LMS's first step where the traced plan fits), not a replay
    without_lms_measured: bool = False
    # where device_peak_bytes_without_lms is not LMS's own replay, how it was read: by the allocator in a step that
    # moved nothing, or from the process's model of the device (core.device_model: explain_fit's steps)
    without_lms_source: str | None = None
    peak_source: Literal["predicted", "measured"] | None = None
    prediction_source: str | None = None  # what the peak comes from: "executed partition graphs", ...
    lb_counts: Literal["backward ops", "layers"] = "backward ops"
    persistent_bytes: int | None = None  # weights and optimizer state (TensorFlow's prediction)
    plan: list[dict] = field(default_factory=list)  # a row per moved tensor: action ("swap"/"recompute"), layer, ...
    # the predicted peak explained (TensorFlow; lms/peak.py): {"phase", "op", "bytes", "by_kind", "top"}
    peak: dict | None = None
    peak_without_lms: dict | None = None
    budget_bytes: int | None = None  # what the plan had to fit: the budget asked for, or the capacity less headroom
    capacity_bytes: int | None = None  # the device's memory as its framework sees it (None: not known)
    # the devices LMS relieves, each with the same plan (a strategy's replicas, a mesh's devices); the counts,
    # bytes and peaks here are each device's; capacity_bytes is the smallest of theirs
    devices: list[str] = field(default_factory=list)
    # each device's predicted peak with LMS and without, where there are several: {device: {"with_lms", "without_lms"}}
    device_peaks: dict = field(default_factory=dict)
    plan_rule: str | None = None  # core.plan.Rule: "lowest predicted peak", "fits the device", "budget", ...
    plans_tried: int | None = None  # predictions the plan search made (TensorFlow)
    predicted_step_ratio: float | None = None  # predicted step time with LMS over the plain step (core/costs.py)
    compute_s: float | None = None  # the plain step's compute time the ratio is made with
    compute_source: str | None = None  # "measured: ..." or "estimated: ..."
    planning_s: float | None = None  # the plan search's time (TensorFlow)
    # while a step's plan is checked: the fit's steps after it (None where Keras does not know them), and the time
    # since that step began (its trace, run and check so far)
    steps_left: int | None = None
    checked_step_s: float | None = None
    # the first step of the plan that runs, read from the device's allocator (a GPU's; on the simulated device, the
    # allocator it shares with the host less what the host held: measured_source): the weights and optimizer state
    # plus the step's peak over what the device held before it; None where not read
    measured_step_peak_bytes: int | None = None
    measured_source: str | None = None  # how measured_step_peak_bytes was read where not the device's allocator alone
    predicted_step_peak_bytes: int | None = None  # what the plan predicted for that step
    replanned: bool = False  # the plan was made again after its first step held more than it was allowed
    # the model asks for XLA (jit_compile; torch.compile on PyTorch) and LMS turned it off for its steps (the
    # predicted peaks are of the graph without XLA); False after LMS stepped out (later steps ran with it)
    jit_compile_off: bool = False
    notes: list[str] = field(default_factory=list)
    # TensorFlow
    traced_device_peaks: tuple[int, int] | None = None  # (with, without) from the traced graph alone
    unknown_size_nodes: int | None = None
    rewrite_s: float | None = None
    records: list | None = field(default=None, repr=False)  # the inserted swaps (graph ops)
    partition_graphs: list | None = field(default=None, repr=False)
    # PyTorch
    pinned: bool | None = None
    pinned_pool_bytes: int | None = None
    pinned_allocations: int | None = None

    @property
    def predicted_device_peak_bytes(self) -> int | None:
        return self.device_peak_bytes if self.peak_source == "predicted" else None

    @property
    def measured_device_peak_bytes(self) -> int | None:
        return self.device_peak_bytes if self.peak_source == "measured" else None

    def update(self, values: dict[str, Any] | None = None, **more: Any) -> None:
        """Sets fields by name; a name that is not a field is an error, not a new key."""
        for name, value in {**(values or {}), **more}.items():
            if name not in _names():
                raise AttributeError(f"LmsStats has no field {name!r}")
            setattr(self, name, value)

    def record_plan(self, plan, rows=None) -> None:
        """Records a ``core.plan.Plan``: its rule, its budget, the predictions it tried (added to earlier plans'),
        its note (once); with ``rows`` (``(action, candidate)`` pairs: "swap" or "recompute" and a
        ``core.plan.Candidate``), the plan's rows. Every backend records its plan here.

        Example:
            >>> from lms_magic.lms.core.plan import Candidate, Plan, Rule
            >>> stats = LmsStats()
            >>> conv = Candidate("conv/Relu:0", "conv", "Conv2D", (8, 16), 512, 0)
            >>> stats.record_plan(Plan((conv,), Rule.LOWEST_PEAK, 1024, 2048, plans_tried=3), [("swap", conv)])
            >>> str(stats.plan_rule), stats.plans_tried, stats.plan[0]["layer"], stats.plan[0]["bytes"]
            ('lowest predicted peak', 3, 'conv', 512)
        """
        self.update(plan_rule=plan.rule, plans_tried=(self.plans_tried or 0) + plan.plans_tried,
                    budget_bytes=plan.budget_bytes)
        if rows is not None:
            self.plan = [{"action": action, "tensor": c.tensor, "layer": c.layer, "layer_type": c.layer_type,
                          "shape": c.shape, "bytes": c.nbytes} for action, c in rows]
        if plan.note and plan.note not in self.notes:
            self.notes.append(plan.note)

    def to_dict(self) -> dict[str, Any]:
        """The exported form: every field but the graph objects, lists copied."""
        return {name: (list(value) if isinstance(value, list) else value)
                for name in _names() if name not in _INTERNAL for value in [getattr(self, name)]}

    # -- read by key, as the untyped dict was ---------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        if key not in _names():
            public = [name for name in _names() if name not in _INTERNAL]
            raise KeyError(f"LMS stats have no {key!r}; they have: {', '.join(public)}")
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in _names() else default

    def __contains__(self, key: object) -> bool:
        return key in _names()


def _names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(LmsStats))
