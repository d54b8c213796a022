"""What ``explain_fit`` found, as plain data: each way of training at the batch asked for and at its largest batch
(:class:`ModeFit`), the frontier's points (:class:`FrontierPoint`), and the whole answer with its lines for a
terminal (:class:`FitExplanation`; ``ui/explain_html.py`` draws it in a notebook)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ...units import format_size
from ..core.plan import CAPACITY_HEADROOM
from ..core.device_model import Correction
from .largest import Confirmed


@dataclass(frozen=True)
class ModeFit:
    """One way of training, at the batch asked for and at its largest batch that fits."""

    mode: str
    peak_bytes: int | None  # predicted at the batch asked for
    fits: bool | None  # within the usable capacity (None: no capacity known)
    largest_batch: int | None  # the largest batch predicted to fit (0: none; None: no capacity known)
    step_ratio: float | None  # predicted step time over a plain step's, at the batch asked for
    magic: str  # the %%lms_fit line that trains this way ("" without LMS)
    unavailable: str = ""  # why this way is not offered on this backend
    note: str = ""  # said beside its figures (lean_ops on a model it changes nothing in)
    confirmed: Confirmed | None = None  # the largest batch confirmed by steps on the device (confirm=...)


@dataclass(frozen=True)
class FrontierPoint:
    """One way of training at one batch size: the predicted peak and step time."""

    batch_size: int
    mode: str
    peak_bytes: int
    step_ratio: float | None  # predicted step time over a plain step's at this batch
    fits: bool | None  # within the usable capacity (None: no capacity known)


@dataclass(frozen=True)
class FitExplanation:
    """What ``explain_fit`` found: the step's peak explained, and what fits. ``to_dict()`` has every figure."""

    batch_size: int
    capacity_bytes: int | None
    usable_bytes: int | None
    peak: dict  # stats["peak"]'s form (core/peak.py) of the step without LMS at batch_size
    modes: list[ModeFit] = field(default_factory=list)
    frontier: list[FrontierPoint] = field(default_factory=list)  # with explain_fit(..., batch_sizes=...)
    speed_target: float = 0.9  # the share of a plain step's speed that "at speed" asks for
    caveat: str = ""  # what the backend's prediction leaves out, where that matters to the answers
    # the peak without LMS where it is not the replay's (peak["bytes"]): its figure and source ("XLA's compiled
    # figure" on JAX; the replay corrected by measured steps, ``correction``)
    plain_peak_bytes: int | None = None
    plain_peak_source: str = ""
    plain_usable_bytes: int | None = None  # what the step without LMS may fill, where not usable_bytes
    correction: Correction | None = None  # the measured step the figures are corrected by (None: not measured)
    unmeasured: str = ""  # why no step was measured, where one was asked for by default
    # what LMS plans to fill, in the replay's bytes, where the measured steps say the device holds more (else None)
    plan_budget_bytes: int | None = None

    @property
    def plain_limit_bytes(self) -> int | None:
        """What the step without LMS may fill where that differs from what LMS plans to (a peak the framework
        itself gives: 95% of the device, not 80%), else None."""
        differs = self.plain_usable_bytes and self.plain_usable_bytes != self.usable_bytes
        return self.plain_usable_bytes if differs else None

    def largest_at_speed(self) -> FrontierPoint | None:
        """The frontier's largest batch that fits at ``speed_target`` of plain speed or better (a step at most
        1 / ``speed_target`` of a plain step's time), the fastest way first where batches tie; None if none."""
        chosen = [point for point in self.frontier if point.fits and point.step_ratio is not None
                  and point.step_ratio <= 1 / self.speed_target]
        return max(chosen, key=lambda point: (point.batch_size, -point.step_ratio), default=None)

    @property
    def suggestion(self) -> str:
        """The first ``%%lms_fit`` line predicted to train ``batch_size``: "" where the step fits without LMS or
        nothing does."""
        if not self.modes or self.modes[0].fits is not False:
            return ""
        return next((mode.magic for mode in self.modes[1:] if mode.fits), "")

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """The explanation as plain lines, for a terminal."""
        peak = self.peak
        limit = self.plain_limit_bytes
        plain = f"; without LMS, its peak may fill {format_size(limit)}" if limit else ""
        device = (f"the device has {format_size(self.capacity_bytes)} (LMS plans to fill {format_size(self.usable_bytes)}, "
                  f"{1 - CAPACITY_HEADROOM:.0%}{plain})" if self.capacity_bytes else "no device capacity known")
        if self.plain_peak_source:
            lines = [f"batch {self.batch_size}: the step needs {format_size(self.plain_peak_bytes)} at its peak "
                     f"without LMS ({self.plain_peak_source}; {format_size(peak['bytes'])} in the replay of its "
                     f"operations, at its peak in the {peak['phase']} pass); {device}"]
        else:
            lines = [f"batch {self.batch_size}: the step needs {format_size(peak['bytes'])} at its peak in the "
                     f"{peak['phase']} pass without LMS; {device}"]
        kinds = ", ".join(f"{kind.replace('_', ' ')} {format_size(value)}" for kind, value in
                          sorted(peak["by_kind"].items(), key=lambda item: -item[1]) if value >= 1024)
        lines.append(f"what fills it{' in the replay' if self.plain_peak_source else ''}: {kinds}")
        if peak.get("layers"):
            lines.append("the layers holding the most at the peak: " + ", ".join(
                f"{row['layer']} {format_size(row['bytes'])}" for row in peak["layers"] if row["bytes"] >= 1024))
        for mode in self.modes:
            if mode.unavailable:
                lines.append(f"  {mode.mode}: {mode.unavailable}")
                continue
            largest = "" if mode.largest_batch is None else f", largest batch {mode.largest_batch}"
            if mode.confirmed is not None:
                largest = f", largest batch {mode.confirmed.batch_size} ({mode.confirmed.words}; " \
                          f"{mode.largest_batch} predicted)"
            ratio = "" if mode.step_ratio is None else f", step {mode.step_ratio:.2f}x a plain step's (predicted)"
            verdict = {True: "fits", False: "does not fit", None: "capacity unknown"}[mode.fits]
            note = f"; {mode.note}" if mode.note else ""
            lines.append(f"  {mode.mode}: {format_size(mode.peak_bytes)} at batch {self.batch_size}, {verdict}"
                         f"{largest}{ratio}{note}")
        if self.frontier:
            modes = list(dict.fromkeys(point.mode for point in self.frontier))
            lines.append("the frontier, predicted peak (and step time over plain) by batch: batch | " + " | ".join(modes))
            by_batch: dict[int, dict[str, FrontierPoint]] = {}
            for point in self.frontier:
                by_batch.setdefault(point.batch_size, {})[point.mode] = point
            for batch, points in sorted(by_batch.items()):
                cells = [f"{format_size(p.peak_bytes)}{'' if p.fits is not False else ' (no)'}"
                         f"{'' if p.step_ratio is None else f' {p.step_ratio:.2f}x'}" if p else "" for p in
                         (points.get(mode) for mode in modes)]
                lines.append(f"  {batch} | " + " | ".join(cells))
            best = self.largest_at_speed()
            if best is not None:
                lines.append(f"the largest batch at {self.speed_target:.0%} of plain speed or better: {best.batch_size}, "
                             f"{best.mode}")
        if self.correction is not None:
            lines.append(self.correction.words)
        elif self.unmeasured:
            lines.append(self.unmeasured)
        if self.caveat:
            lines.append(self.caveat)
        if self.suggestion:
            lines.append(f"to train batch {self.batch_size}: put `{self.suggestion}` on the cell's first line")
        elif self.modes and self.modes[0].fits is False:
            best = max(self.modes, key=lambda mode: (mode.largest_batch or 0, not mode.magic))
            how = f"with `{best.magic}` on the cell's first line" if best.magic else "without LMS"
            lines.append(f"no way predicted to train batch {self.batch_size}: " + (
                f"the largest batch that fits is {best.largest_batch}, {how}" if best.largest_batch else
                "no batch fits this device any way looked at, not even 1"))
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))


__all__ = ["FitExplanation", "FrontierPoint", "ModeFit"]
