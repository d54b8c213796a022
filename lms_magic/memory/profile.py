"""Measure host and GPU memory over a block of code: the engine of ``%%gpumem``."""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from typing import Callable, Iterable, Iterator

from .report import AllocatorPeak, GpuMemory, HostMemory, MemoryReport, Timeline
from .frameworks import BFC_ADVICE, MISSES_SMALL_TENSORS, AllocatorCounter, discover_counters
from .host import PeakWindow, rss_bytes
from .nvml import GpuLost, GpuSource, GpuUnavailable, NvmlSource, visible_indices
from .recorder import BackgroundSampler

DEFAULT_INTERVAL_S = 0.01
MAX_SAMPLES = 100_000


class UnknownDeviceError(ValueError):
    """A requested GPU index does not exist."""


class _Gpu:
    """Sampling state of one GPU during a window."""

    def __init__(self, index: int, nvml_index: int, name: str, total_bytes: int, baseline_bytes: int):
        self.index = index
        self.nvml_index = nvml_index
        self.name = name
        self.total_bytes = total_bytes
        self.baseline_bytes = baseline_bytes
        self.peak_bytes = baseline_bytes
        self.end_bytes = baseline_bytes
        self.process_peak_bytes: int | None = None
        self.lost = False


class MemoryProfiler:
    """Measures this process's host memory and the GPUs' memory between start and stop.

    Host: baseline RSS at start, exact peak from the kernel's high-water mark on
    Linux (else the sampled maximum). GPUs: NVML device-wide use, sampled, and
    this process's use where NVML lists its PID. Framework allocators: exact
    peaks of TensorFlow, PyTorch and JAX where already imported and initialised.
    Nothing here raises because a measurement failed: failures become notes.

    Args:
        interval_s: seconds between samples. Defaults to 0.01.
        devices: CUDA-visible GPU indices to measure. Defaults to all.
        gpu_source: where GPU figures come from. Defaults to NVML.
        clock: a function returning seconds. Defaults to ``time.perf_counter``.
        counters: allocator counters to read. Defaults to those discovered in
            ``sys.modules`` at start and stop.
        exact_host_peak: use the kernel's high-water mark where it exists.
            Defaults to True.

    Raises:
        ValueError: ``interval_s`` is not positive.
        UnknownDeviceError: ``devices`` names a GPU that does not exist (the
            message lists those that do).

    Host figures are the whole process's resident memory: memory that anything
    else frees during the window (Python's garbage collector, another thread)
    lowers the increment, and an allocation that reuses memory the process
    already holds (freed earlier, kept by the C allocator) raises nothing. The
    examples write to fresh pages (``mmap``) so that their increment is sure.

    Its state is its arguments (6), what each source read at start (the host's baseline, each GPU, each allocator's
    start and peak), the sampler thread and its timeline, and the report; one job: a window of measurements.

    Example:
        >>> import mmap
        >>> profiler = MemoryProfiler(interval_s=0.005).start()
        >>> block = mmap.mmap(-1, 32 * 2**20); _ = block.write(bytes(32 * 2**20))
        >>> report = profiler.stop()
        >>> report.host.increment_bytes >= 30 * 2**20
        True
    """

    _open_profilers: list["MemoryProfiler"] = []
    _open_lock = threading.Lock()

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        devices: Iterable[int] | None = None,
        gpu_source: GpuSource | None = None,
        clock: Callable[[], float] = time.perf_counter,
        counters: list[AllocatorCounter] | None = None,
        exact_host_peak: bool = True,
    ):
        if not (isinstance(interval_s, (int, float)) and math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s must be a positive, finite number of seconds, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._requested = None if devices is None else [int(d) for d in devices]
        self._source = gpu_source if gpu_source is not None else NvmlSource()
        self._clock = clock
        self._fixed_counters = counters
        self._window = PeakWindow(enabled=exact_host_peak)
        self._notes: list[str] = []
        self._gpus: list[_Gpu] = []
        self._counters: list[AllocatorCounter] = []
        self._allocator_start: dict[tuple, tuple[int, int]] = {}
        self._allocator_seen_peak: dict[tuple, int] = {}
        self._timeline = Timeline()
        self._stride = 1
        self._tick = 0
        self._sampler: BackgroundSampler | None = None
        self._pid = os.getpid()
        self._host_peak_sampled = 0
        self.report = MemoryReport(interval_s=self.interval_s)

    # -- start -----------------------------------------------------------------
    def start(self) -> "MemoryProfiler":
        """Takes the baselines and starts the sampler thread."""
        self._open_gpus()
        # No gc.collect() here: with TensorFlow loaded it costs ~0.2 s a cell.
        self._start_counters()
        self._host_baseline_bytes = rss_bytes()
        self._window.open()
        self._t0 = self._clock()
        with MemoryProfiler._open_lock:
            MemoryProfiler._open_profilers.append(self)
        self._sample()
        self._sampler = BackgroundSampler(self._sample, self.interval_s).start()
        return self

    def _open_gpus(self) -> None:
        try:
            self._source.open()
            visible = visible_indices(self._source)
        except (GpuUnavailable, GpuLost) as why:
            self._notes.append(f"host only: {why}")
            return
        if not visible:
            self._notes.append("host only: no GPU is visible to this process")
            return
        chosen = list(range(len(visible))) if self._requested is None else self._requested
        unknown = [index for index in chosen if not 0 <= index < len(visible)]
        if unknown:
            raise UnknownDeviceError(
                f"GPU {', '.join(map(str, unknown))} does not exist; this process sees GPU "
                f"{', '.join(map(str, range(len(visible))))}"
            )
        for index in chosen:
            nvml_index = visible[index]
            try:
                self._gpus.append(_Gpu(index, nvml_index, self._source.name(nvml_index),
                                       self._source.total_bytes(nvml_index), self._source.used_bytes(nvml_index)))
            except (GpuUnavailable, GpuLost) as why:
                self._notes.append(f"GPU {index} not measured: {why}")

    def _start_counters(self) -> None:
        if self._fixed_counters is not None:
            self._counters = list(self._fixed_counters)
        else:
            self._counters, notes = discover_counters()
            self._notes += notes
        with MemoryProfiler._open_lock:
            for profiler in MemoryProfiler._open_profilers:
                profiler._absorb_allocator_peaks()  # before we reset them under an open window
        for counter in self._counters:
            try:
                if not counter.counts_every_tensor():
                    self._notes.append(f"{counter.framework}'s allocator on {counter.device} (oneDNN's) "
                                       f"{MISSES_SMALL_TENSORS}: {BFC_ADVICE} to count every one")
                if counter.resettable:
                    counter.reset()
                self._allocator_start[counter.key] = counter.read()
            except Exception as error:
                self._notes.append(f"{counter.framework} allocator on {counter.device} not read: {error}")

    def _absorb_allocator_peaks(self) -> None:
        for counter in self._counters:
            if counter.key in self._allocator_start:
                with contextlib.suppress(Exception):
                    peak = counter.read()[1]
                    seen = self._allocator_seen_peak.get(counter.key, 0)
                    self._allocator_seen_peak[counter.key] = max(seen, peak)

    # -- sampling ----------------------------------------------------------------
    def _sample(self) -> None:
        self._tick += 1
        record = self._tick % self._stride == 0
        now_s = self._clock() - self._t0
        host = rss_bytes()
        self._host_peak_sampled = max(self._host_peak_sampled, host)
        used: dict[int, int | None] = {}
        for gpu in self._gpus:
            used[gpu.index] = self._sample_gpu(gpu, now_s)
        if record:
            timeline = self._timeline
            timeline.times_s.append(now_s)
            timeline.host_rss_bytes.append(host)
            for index, value in used.items():
                timeline.gpu_used_bytes.setdefault(index, []).append(value)
            if len(timeline.times_s) >= MAX_SAMPLES:
                self._thin_timeline()

    def _sample_gpu(self, gpu: _Gpu, now_s: float) -> int | None:
        if gpu.lost:
            return None
        try:
            used = self._source.used_bytes(gpu.nvml_index)
            process = self._source.process_used_bytes(gpu.nvml_index, self._pid)
        except (GpuLost, GpuUnavailable) as why:
            gpu.lost = True
            self._notes.append(f"GPU {gpu.index} stopped answering after {now_s:.3f} s ({why}); "
                               "its figures cover the time until then")
            return None
        gpu.peak_bytes = max(gpu.peak_bytes, used)
        gpu.end_bytes = used
        if process is not None:
            gpu.process_peak_bytes = max(gpu.process_peak_bytes or 0, process)
        return used

    def _thin_timeline(self) -> None:
        """Keeps every other sample and halves the recording rate (bounded memory)."""
        timeline = self._timeline
        timeline.times_s[:] = timeline.times_s[::2]
        timeline.host_rss_bytes[:] = timeline.host_rss_bytes[::2]
        for values in timeline.gpu_used_bytes.values():
            values[:] = values[::2]
        self._stride *= 2

    # -- stop --------------------------------------------------------------------
    def stop(self, status: str = "ok", error: str | None = None) -> MemoryReport:
        """Stops the sampler, takes the final figures and returns the report.

        Args:
            status: "ok", "error" or "interrupted".
            error: the exception's type name when the code raised.
        """
        if self._sampler is not None:
            self._sampler.stop()
            if self._sampler.error is not None:
                self._notes.append(f"sampling stopped early: {self._sampler.error!r}")
        self._sample()
        duration_s = self._clock() - self._t0
        exact_peak = self._window.close()
        with MemoryProfiler._open_lock:
            if self in MemoryProfiler._open_profilers:
                MemoryProfiler._open_profilers.remove(self)
        host_allocators, gpu_allocators = self._read_allocators()
        host_end = self._timeline.host_rss_bytes[-1] if self._timeline.host_rss_bytes else rss_bytes()
        host = HostMemory(
            baseline_bytes=self._host_baseline_bytes,
            peak_bytes=max(exact_peak or 0, self._host_peak_sampled, self._host_baseline_bytes),
            end_bytes=host_end,
            exact_peak=exact_peak is not None,
            allocators=host_allocators,
        )
        if self._gpus:
            self._note_process_visibility()
        gpus = [
            GpuMemory(gpu.index, gpu.name, gpu.baseline_bytes, gpu.peak_bytes, gpu.end_bytes, gpu.total_bytes,
                      gpu.process_peak_bytes, gpu_allocators.get(gpu.index, []), gpu.lost)
            for gpu in self._gpus
        ]
        report = self.report
        report.host, report.gpus, report.notes = host, gpus, self._notes
        report.duration_s, report.timeline, report.status = duration_s, self._timeline, status
        report.error = error
        return report

    def _note_process_visibility(self) -> None:
        if all(gpu.process_peak_bytes is None for gpu in self._gpus):
            self._notes.append(
                f"per-process GPU use not shown: NVML does not list this process (PID {self._pid}); "
                "in a container NVML reports host PIDs"
            )

    def _read_allocators(self):
        counters = list(self._counters)
        if self._fixed_counters is None:
            known = {counter.key for counter in counters}
            new, _ = discover_counters()  # a framework initialised during the window
            for counter in new:
                if counter.key not in known:
                    counters.append(counter)
                    self._allocator_start[counter.key] = (0, 0)
        host: list[AllocatorPeak] = []
        gpus: dict[int, list[AllocatorPeak]] = {}
        for counter in counters:
            if counter.key not in self._allocator_start:
                continue
            try:
                current, peak = counter.read()
                reserved = counter.reserved_peak()
            except Exception as error:
                self._notes.append(f"{counter.framework} allocator on {counter.device} not read: {error}")
                continue
            start_current, start_peak = self._allocator_start[counter.key]
            peak = max(peak, self._allocator_seen_peak.get(counter.key, 0))
            exact = counter.resettable or peak > start_peak
            figure = AllocatorPeak(counter.framework, counter.device, start_current, current,
                                   peak if exact else None, exact, reserved)
            if counter.gpu_index is None:
                host.append(figure)
            else:
                gpus.setdefault(counter.gpu_index, []).append(figure)
        return host, gpus


@contextlib.contextmanager
def profiling(profiler: MemoryProfiler) -> Iterator[MemoryReport]:
    """Stops a started ``profiler`` when the block ends, recording how it ended.

    The report is "ok", "error" (with the exception's type name) or
    "interrupted"; the exception itself goes on unchanged.
    """
    status, error = "error", None
    try:
        yield profiler.report
        status = "ok"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except BaseException as raised:
        error = type(raised).__name__
        raise
    finally:
        profiler.stop(status, error=error)


def profile_memory(interval_s: float = DEFAULT_INTERVAL_S, devices: Iterable[int] | None = None, **options):
    """Measures host and GPU memory of the code in a ``with`` block.

    The report it yields is filled in when the block ends, also when the block
    raises (``status`` is then "error" or "interrupted" and the exception goes
    on unchanged).

    Args:
        interval_s: seconds between samples for the timeline. Defaults to 0.01.
        devices: CUDA-visible GPU indices to measure. Defaults to all.
        **options: passed to :class:`MemoryProfiler` (``gpu_source``, ``clock``, ...).

    Example:
        >>> import mmap, lms_magic
        >>> with lms_magic.profile_memory(interval_s=0.01) as report:
        ...     block = mmap.mmap(-1, 64 * 2**20)  # fresh pages (see MemoryProfiler)
        ...     _ = block.write(bytes(64 * 2**20))
        >>> report.host.increment_bytes >= 60 * 2**20
        True
    """
    return profiling(MemoryProfiler(interval_s=interval_s, devices=devices, **options).start())
