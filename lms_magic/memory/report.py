"""Plain result objects of a memory profile, with text and dict views (HTML and figures: ui/).

Sizes are held in bytes (``*_bytes``); MiB appear only in what is shown and
in :meth:`MemoryReport.to_dict`, whose keys say so (``*_mib``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from ..units import MIB  # noqa: F401  (MIB: a name callers import from here)


def _mib(n_bytes: int | None) -> float | None:
    return None if n_bytes is None else round(n_bytes / MIB, 3)


@dataclass
class AllocatorPeak:
    """A framework allocator's figures for one device over the profiled window."""

    framework: str
    device: str
    start_bytes: int
    end_bytes: int
    peak_bytes: int | None
    exact: bool
    reserved_peak_bytes: int | None = None

    def describe(self) -> str:
        if self.peak_bytes is None:
            return f"{self.framework} allocator peak unknown (not resettable, no new high)"
        text = f"{self.framework} allocator peak {self.peak_bytes / MIB:.1f} MiB"
        if self.reserved_peak_bytes is not None:
            text += f" (reserved {self.reserved_peak_bytes / MIB:.1f} MiB)"
        return text

    def to_dict(self) -> dict:
        return {
            "framework": self.framework,
            "device": self.device,
            "start_mib": _mib(self.start_bytes),
            "end_mib": _mib(self.end_bytes),
            "peak_mib": _mib(self.peak_bytes),
            "reserved_peak_mib": _mib(self.reserved_peak_bytes),
            "exact": self.exact,
        }


@dataclass
class HostMemory:
    """This process's resident memory (RSS) over the window."""

    baseline_bytes: int
    peak_bytes: int
    end_bytes: int
    exact_peak: bool
    allocators: list[AllocatorPeak] = field(default_factory=list)

    @property
    def increment_bytes(self) -> int:
        return self.peak_bytes - self.baseline_bytes


@dataclass
class GpuMemory:
    """One GPU over the window: NVML device-wide use (sampled) and allocators (exact)."""

    index: int
    name: str
    baseline_bytes: int
    peak_bytes: int
    end_bytes: int
    total_bytes: int
    process_peak_bytes: int | None = None
    allocators: list[AllocatorPeak] = field(default_factory=list)
    lost: bool = False

    @property
    def increment_bytes(self) -> int:
        return self.peak_bytes - self.baseline_bytes


@dataclass
class Timeline:
    """Samples taken by the background sampler; times in seconds from the start."""

    times_s: list[float] = field(default_factory=list)
    host_rss_bytes: list[int] = field(default_factory=list)
    gpu_used_bytes: dict[int, list[int | None]] = field(default_factory=dict)


@dataclass
class MemoryReport:
    """What ``%%gpumem`` and :func:`lms_magic.profile_memory` measured.

    ``status`` is "ok", "error" (the code raised; figures up to then) or
    "interrupted" (KeyboardInterrupt), or "running" inside the ``with`` block.
    """

    host: HostMemory | None = None
    gpus: list[GpuMemory] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    interval_s: float = 0.01
    timeline: Timeline = field(default_factory=Timeline)
    status: str = "running"
    error: str | None = None

    @property
    def n_samples(self) -> int:
        return len(self.timeline.times_s)

    def lines(self) -> list[str]:
        """The report as lines of text, as printed by ``%%gpumem``."""
        if self.host is None:
            return ["memory profile still running"]
        host = self.host
        how = "exact" if host.exact_peak else f"sampled every {self.interval_s * 1000:g} ms"
        line = f"host: peak memory {host.peak_bytes / MIB:.1f} MiB, increment {host.increment_bytes / MIB:.1f} MiB ({how})"
        lines = ["; ".join([line] + [peak.describe() for peak in host.allocators])]
        for gpu in self.gpus:
            parts = [
                f"GPU {gpu.index} ({gpu.name}): device used peak {gpu.peak_bytes / MIB:.1f} MiB, "
                f"increment {gpu.increment_bytes / MIB:.1f} MiB (NVML, sampled)"
            ]
            if gpu.process_peak_bytes is not None:
                parts.append(f"this process {gpu.process_peak_bytes / MIB:.1f} MiB")
            parts += [peak.describe() for peak in gpu.allocators]
            lines.append("; ".join(parts) + (" [GPU lost during the cell]" if gpu.lost else ""))
        lines += [f"note: {note}" for note in self.notes]
        if self.status in ("error", "interrupted"):
            what = f"raised {self.error or 'an exception'}" if self.status == "error" else "was interrupted"
            lines.append(f"partial: the code {what} after {self.duration_s:.3f} s; figures cover the time until then")
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __repr__(self) -> str:
        return f"<MemoryReport {self.status}: {self.lines()[0]}>"

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))

    def to_dict(self) -> dict:
        """A JSON-ready summary (sizes in MiB); see docs/gpumem.md for the keys."""
        host = self.host
        return {
            "status": self.status,
            "error": self.error,
            "host": None if host is None else {
                "baseline_mib": _mib(host.baseline_bytes),
                "peak_mib": _mib(host.peak_bytes),
                "increment_mib": _mib(host.increment_bytes),
                "exact_peak": host.exact_peak,
                "allocators": [peak.to_dict() for peak in host.allocators],
            },
            "gpus": [
                {
                    "index": gpu.index,
                    "name": gpu.name,
                    "baseline_mib": _mib(gpu.baseline_bytes),
                    "peak_mib": _mib(gpu.peak_bytes),
                    "increment_mib": _mib(gpu.increment_bytes),
                    "total_mib": _mib(gpu.total_bytes),
                    "process_peak_mib": _mib(gpu.process_peak_bytes),
                    "allocator": gpu.allocators[0].framework if gpu.allocators else None,
                    "allocator_peak_mib": _mib(gpu.allocators[0].peak_bytes) if gpu.allocators else None,
                    "allocators": [peak.to_dict() for peak in gpu.allocators],
                    "lost": gpu.lost,
                }
                for gpu in self.gpus
            ],
            "notes": list(self.notes),
            "duration_s": self.duration_s,
            "interval_s": self.interval_s,
            "n_samples": self.n_samples,
        }
