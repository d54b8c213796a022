"""Results of ``%%lms_fit``: one row per variant, compared, as text, HTML, dict and JSON."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field

from ..memory.report import MIB, MemoryReport
from ..lms.core.plan import usable_bytes
from ..lms.core.summary import checked_step_held
from ..units import format_size


@dataclass
class VariantResult:
    """One training variant ("lms" or "no_lms") of one ``fit`` call."""

    name: str
    status: str  # "ok", "oom" or "error"
    steps: int
    time_per_step_s: float | None
    batch_size: int | None
    memory: MemoryReport
    history: dict = field(default_factory=dict)
    step_losses: list[float] = field(default_factory=list)
    swapped_bytes_per_step: int = 0
    lms_stats: dict = field(default_factory=dict)
    message: str | None = None
    step_times_s: list[float] = field(default_factory=list)  # each step's time, the first (tracing) included
    jit_compile: bool | None = None  # whether the model asked for XLA (torch.compile on PyTorch)

    @property
    def xla(self) -> str | None:
        """How the train step ran: "on", "off", or "off in LMS's steps" (LMS turns XLA off while it swaps)."""
        if self.jit_compile is None:
            return None
        if not self.jit_compile:
            return "off"
        return "off in LMS's steps" if self.lms_stats.get("jit_compile_off") else "on"

    @classmethod
    def from_run(cls, name, status, message, recorder, memory, history, lms, batch_size,
                 jit_compile: bool | None = None) -> "VariantResult":
        stats = lms.stats.to_dict() if lms is not None else {}
        return cls(name=name, status=status, steps=len(recorder.step_s), time_per_step_s=recorder.time_per_step_s(),
                   batch_size=batch_size, memory=memory,
                   history={k: [float(v) for v in vs] for k, vs in (history.history.items() if history else [])},
                   step_losses=list(recorder.losses), swapped_bytes_per_step=int(stats.get("swapped_bytes_per_step", 0)),
                   lms_stats=stats, message=message, step_times_s=list(recorder.step_s),
                   jit_compile=jit_compile)

    @property
    def step_time_spread(self) -> float | None:
        """How much this variant's steps vary: their interquartile range over the median, the first step (which
        traces) left out; None with fewer than 4 timed steps."""
        timed = self.step_times_s[1:]
        if len(timed) < 4:
            return None
        quartiles = statistics.quantiles(timed, n=4)
        return (quartiles[2] - quartiles[0]) / quartiles[1] if quartiles[1] else None

    @property
    def samples_per_s(self) -> float | None:
        if not self.time_per_step_s or not self.batch_size:
            return None
        return self.batch_size / self.time_per_step_s

    def final(self, metric: str) -> float | None:
        values = self.history.get(metric)
        return values[-1] if values else None

    def to_dict(self) -> dict:
        memory = self.memory.to_dict()
        host = memory["host"] or {}
        return {
            "name": self.name, "status": self.status, "message": self.message, "steps": self.steps,
            "time_per_step_s": self.time_per_step_s, "samples_per_s": self.samples_per_s,
            "host_peak_mib": host.get("peak_mib"), "host_increment_mib": host.get("increment_mib"),
            "gpus": memory["gpus"], "host_allocators": host.get("allocators", []), "history": self.history,
            "swapped_bytes_per_step": self.swapped_bytes_per_step,
            # LMS's device peak: predicted (TensorFlow) or measured (PyTorch), as device_peak_source says
            "device_peak_bytes": self.lms_stats.get("device_peak_bytes"),
            "device_peak_source": self.lms_stats.get("peak_source"),
            "predicted_device_peak_bytes": (self.lms_stats.get("device_peak_bytes")
                                            if self.lms_stats.get("peak_source") == "predicted" else None),
            "lms_active": bool(self.lms_stats.get("active")), "memory_notes": memory["notes"], "xla": self.xla,
        }


def _host_allocator_peak_mib(variant: VariantResult) -> float | None:
    """The framework's host (CPU) allocator peak: on a simulated accelerator, the same RAM as the host's."""
    host = variant.memory.host
    peak = None if host is None else max((p.peak_bytes for p in host.allocators if p.peak_bytes is not None),
                                         default=None)
    return None if peak is None else peak / MIB


ROWS = [  # (label, function of a variant, format)
    ("status", lambda v: v.status, "{}"),
    ("steps", lambda v: v.steps, "{}"),
    ("time per step (ms)", lambda v: v.time_per_step_s and v.time_per_step_s * 1000, "{:.2f}"),
    ("samples/s", lambda v: v.samples_per_s, "{:.0f}"),
    ("host peak (MiB)", lambda v: v.memory.host and v.memory.host.peak_bytes / MIB, "{:.1f}"),
    ("host increment (MiB)", lambda v: v.memory.host and v.memory.host.increment_bytes / MIB, "{:.1f}"),
    ("GPU used peak (MiB)", lambda v: max((g.peak_bytes / MIB for g in v.memory.gpus), default=None), "{:.1f}"),
    ("GPU allocator peak (MiB)", lambda v: _gpu_allocator_peak(v) and _gpu_allocator_peak(v) / MIB, "{:.1f}"),
    ("host allocator peak (MiB)", _host_allocator_peak_mib, "{:.1f}"),
    ("final loss", lambda v: v.final("loss"), "{:.6f}"),
    ("swapped per step", lambda v: format_size(v.swapped_bytes_per_step), "{}"),
    ("recomputed per step", lambda v: format_size(v.lms_stats.get("recomputed_bytes_per_step") or 0), "{}"),
    ("XLA (jit_compile)", lambda v: v.xla, "{}"),
]


METRICS_AFTER = "final loss"  # the row the metrics' rows follow


def metric_names(variants) -> list[str]:
    """The metrics the variants' histories hold, as the dashboard lists them: accuracies first, then the other
    training metrics, then the validation loss and metrics in the same order (``loss`` has a row of its own).

    Example:
        >>> metric_names([VariantResult("lms", "ok", 1, None, None, MemoryReport(), history={
        ...     "loss": [1.0], "mse": [2.0], "sparse_categorical_accuracy": [0.5], "val_loss": [1.0]})])
        ['sparse_categorical_accuracy', 'mse', 'val_loss']
    """
    names = list(dict.fromkeys(name for v in variants for name in v.history if name != "loss"))

    def order(name: str) -> tuple:
        base = name[4:] if name.startswith("val_") else name
        return name.startswith("val_"), base != "loss", "accuracy" not in base
    return sorted(names, key=order)


def _metric_format(name: str) -> str:
    return "{:.4f}" if any(word in name for word in ("accuracy", "auc", "precision", "recall")) else "{:.6f}"


def device_peaks(lms: VariantResult, plain: VariantResult | None) -> tuple[str, int | None, int | None]:
    """(what they are, device peak with LMS, without): measured by the allocator where both variants ran on a
    GPU, or where LMS's checked step and a plain step at its batch were read on the device (the simulated one's
    too), else LMS's own figures (predicted)."""
    measured = [_gpu_allocator_peak(v) for v in (lms, plain) if v is not None and v.status == "ok"]
    if plain is not None and len(measured) == 2 and None not in measured:
        return "device peak", measured[0], measured[1]
    stats = lms.lms_stats
    measured, with_lms, without = lms_peaks(stats)
    if without is None and plain is not None and plain.status == "ok":
        without = _gpu_allocator_peak(plain)
    if measured:
        return "device peak", with_lms, without
    label = "predicted device peak" if stats.get("peak_source") == "predicted" else "device peak"
    if len(stats.get("devices") or ()) > 1:  # a distribution strategy's replicas: each device's figure
        label = label.replace("device peak", "per-device peak")
    return label, with_lms, without


def lms_peaks(stats: dict) -> tuple[bool, int | None, int | None]:
    """LMS's own figures of the device peak: (both measured, with LMS, without). Both read on the device where LMS's
    checked step and a plain step at its batch were (the latter by ``explain_fit``, or LMS's own step that moved
    nothing), else LMS's figures as they stand (predicted, or measured where nothing moved).

    Example:
        >>> lms_peaks({"device_peak_bytes": 5, "device_peak_bytes_without_lms": 9})
        (False, 5, 9)
        >>> lms_peaks({"device_peak_bytes": 5, "predicted_step_peak_bytes": 5, "measured_step_peak_bytes": 7,
        ...            "device_peak_bytes_without_lms": 9, "without_lms_measured": True})
        (True, 7, 9)
    """
    held = checked_step_held(stats)
    if stats.get("without_lms_measured") and held is not None:
        return True, held[0], stats.get("device_peak_bytes_without_lms")
    return False, stats.get("device_peak_bytes"), stats.get("device_peak_bytes_without_lms")


def _gpu_allocator_peak(variant: VariantResult) -> int | None:
    peaks = [p.peak_bytes for g in variant.memory.gpus for p in g.allocators if p.peak_bytes is not None]
    return max(peaks) if peaks else None


def _change(new: float, old: float) -> str:
    """A relative change in whole percent, "+0%" (not "-0%") for less than half a percent either way."""
    return f"{round((new - old) / old * 100):+d}%" if old else "n/a"


def _would_not_fit(stats: dict, without: int, budget: int) -> str:
    """The headline's first words where the step without LMS exceeds what LMS planned for: against the device's
    usable share where the figure without LMS is the device's (measured, or corrected by measured steps), as
    ``explain_fit`` says it, else against the plan's budget (the replay's bytes, as LMS plans)."""
    how = "measured" if stats.get("without_lms_measured") else \
        "corrected by measured steps" if stats.get("without_lms_source") else "predicted"
    capacity = stats.get("capacity_bytes")
    if stats.get("without_lms_source") and capacity and without > usable_bytes(capacity):
        return (f"without LMS the step would not fit the device ({format_size(without)} {how}, above the "
                f"{format_size(usable_bytes(capacity))} usable of its {format_size(capacity)}); with LMS it fits")
    what = "the device" if str(stats.get("plan_rule")) == "fits the device" else "the budget"
    return (f"without LMS the step would not fit {what} ({format_size(without)} {how}, above the "
            f"{format_size(budget)} LMS plans to fill); with LMS it fits")


def _loss_part(plain: VariantResult, lms: VariantResult) -> list[str]:
    """The headline's words on the final loss of both variants (none where either has no loss)."""
    losses = plain.final("loss"), lms.final("loss")
    if None in losses:
        return []
    return ["final loss identical" if losses[0] == losses[1] else f"final loss {losses[0]:.6g} -> {losses[1]:.6g}"]


def _cell(value, fmt) -> str:
    if value is None:
        return "-"
    return fmt.format(value) if not isinstance(value, str) else value


@dataclass
class LmsFitResult:
    """What ``%%lms_fit`` measured: the variants of each ``fit`` call in the cell."""

    calls: list[list[VariantResult]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def variants(self) -> list[VariantResult]:
        """The variants of the last ``fit`` call (the usual cell has one)."""
        return self.calls[-1] if self.calls else []

    def headline(self) -> str:
        """The one line a user came for: the device memory LMS saved, what it cost in speed, whether the
        result is the same (for the last fit call).

        Example:
            >>> LmsFitResult().headline()
            '%%lms_fit: the cell called no fit'
        """
        variants = {v.name: v for v in self.variants}
        lms, plain = variants.get("lms"), variants.get("no_lms")
        if lms is None:
            return "%%lms_fit: the cell called no fit" if not self.calls else "%%lms_fit: LMS did not run"
        if lms.status != "ok":
            return f"LMS: {'out of memory' if lms.status == 'oom' else 'failed'} ({lms.message or lms.status})"
        stats = lms.lms_stats
        if not stats.get("active"):
            return f"LMS: inactive ({stats.get('reason') or 'no reason given'}): nothing was swapped"
        label, with_lms, without = device_peaks(lms, plain)
        if not stats.get("swapped_bytes_per_step") and not stats.get("recomputed_bytes_per_step"):
            return self._nothing_moved_headline(lms, plain, label, with_lms)
        parts = []
        if with_lms is not None and without is not None:
            how = "measured" if stats.get("without_lms_measured") else \
                "corrected by measured steps" if stats.get("without_lms_source") else "by replay"
            source = f", without LMS {how}" if label.startswith("predicted") else ", both measured"
            parts.append(f"{label} {_change(with_lms, without)} ({format_size(without)} -> "
                         f"{format_size(with_lms)}{source})")
        elif with_lms is not None:
            parts.append(f"{label} {format_size(with_lms)}")
        held = checked_step_held(stats)
        if held is not None and label.startswith("predicted"):  # the plan that stands, read as its step ran
            parts.append(f"its checked step held {format_size(held[0])} ({held[1]})")
        for action, done in (("swapped", "swapped"), ("recomputed", "recomputed on the device")):
            count = stats.get(f"{action}_tensors", 0)
            if count:  # one of the two at least: something moved
                parts.append(f"{count} tensor{'' if count == 1 else 's'} {done} "
                             f"({format_size(stats.get(f'{action}_bytes_per_step', 0))} per step)")
        if stats.get("lean_layers"):
            parts.append(f"lean BatchNormalization gradient in {stats['lean_layers']} layers")
        if stats.get("ordered_layers"):
            parts.append(f"backward pass one layer at a time ({stats['ordered_layers']} layers)")
        if stats.get("predicted_step_ratio"):
            parts.append(f"predicted step time {stats['predicted_step_ratio'] - 1:+.0%}")
        budget = stats.get("budget_bytes")
        if plain is not None and plain.status == "oom":
            parts.insert(0, "without LMS: out of memory; with LMS it trained")
        elif budget and without is not None and with_lms is not None and without > budget >= with_lms:
            parts.insert(0, _would_not_fit(stats, without, budget))
        if plain is not None and plain.status == "ok":
            if plain.time_per_step_s and lms.time_per_step_s:
                parts.append(f"measured step time {_change(lms.time_per_step_s, plain.time_per_step_s)}")
            parts += _loss_part(plain, lms)
        return "LMS: " + ", ".join(parts)

    @staticmethod
    def _nothing_moved_headline(lms: VariantResult, plain: VariantResult | None, label: str, peak) -> str:
        """Where LMS moved nothing: the model fits, and a step-time difference is noise, not a cost."""
        stats = lms.lms_stats
        why = {"fits the device": "the model fits the device", "budget": "the model fits the budget"}.get(
            str(stats.get("plan_rule")), "no swap lowers the peak")
        parts = [f"{why}" + (f" ({label} {format_size(peak)})" if peak is not None else "") + ": nothing moved"]
        if plain is not None and plain.status == "ok":
            if plain.time_per_step_s and lms.time_per_step_s:
                spreads = [s for s in (plain.step_time_spread, lms.step_time_spread) if s is not None]
                noise = f"steps vary by {max(spreads):.0%}" if spreads else "too few steps to tell"
                parts.append(f"step time {_change(lms.time_per_step_s, plain.time_per_step_s)} is noise ({noise})")
            parts += _loss_part(plain, lms)
        return "LMS: " + ", ".join(parts)

    def table(self) -> list[list[str]]:
        """Rows of [label, value per variant..., difference] for the last call."""
        variants = self.variants
        rows = [["", *[v.name for v in variants]] + (["lms - no_lms"] if len(variants) == 2 else [])]
        rows_of = []
        for label, get, fmt in ROWS:
            rows_of.append((label, get, fmt))
            if label == METRICS_AFTER:  # every metric the model was compiled with, each way
                rows_of += [(f"final {name}", lambda v, name=name: v.final(name), _metric_format(name))
                            for name in metric_names(variants)]
        for label, get, fmt in rows_of:
            values = [get(v) for v in variants]
            row = [label, *[_cell(value, fmt) for value in values]]
            if len(values) == 2:
                both = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values)
                row.append(_cell(values[1] - values[0], fmt) if both else "")
            rows.append(row)
        return rows

    def __str__(self) -> str:
        if not self.calls:
            return "%%lms_fit: the cell called no fit"
        rows = self.table()
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        messages = [f"{v.name}: {v.message}" for v in self.variants if v.message]
        return "\n".join(lines + messages + self.notes)

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))

    def to_dict(self) -> dict:
        return {"variants": [v.to_dict() for v in self.variants],
                "calls": [[v.to_dict() for v in call] for call in self.calls], "notes": list(self.notes)}

    def to_json(self, **options) -> str:
        return json.dumps(self.to_dict(), **{"indent": 1, **options})
