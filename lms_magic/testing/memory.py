"""Fakes for hermetic tests: a scripted GPU source, allocator counter and clock.

They implement the same small interfaces as the real sources, so tests drive
every GPU code path (several GPUs, a missing library, a permission error, a
hidden PID, a GPU that vanishes mid-cell) on a machine without a GPU.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from ..memory.frameworks import AllocatorCounter
from ..memory.nvml import GpuLost, GpuSource, GpuUnavailable
from ..units import MIB as _MIB


@dataclass
class FakeGpu:
    """One fake GPU.

    Args:
        name: what NVML would call it.
        used_mib: device-wide used memory, in MiB, returned in turn by each
            query (the last value repeats). Defaults to ``[0]``.
        total_mib: device size in MiB. Defaults to 16384.
        process_mib: this process's use in MiB, or None when NVML does not
            list this process (as in containers). Defaults to None.
        lost_after: the GPU raises GpuLost after this many memory queries.
            Defaults to None (never).
    """

    name: str
    used_mib: list[float] = field(default_factory=lambda: [0])
    total_mib: float = 16384
    process_mib: float | None = None
    lost_after: int | None = None
    queries: int = 0


class FakeGpuSource(GpuSource):
    """A :class:`GpuSource` that replays scripted values.

    Example:
        >>> source = FakeGpuSource([FakeGpu("Fake T4", used_mib=[100, 300])])
        >>> source.open(); source.used_bytes(0) // 2**20, source.used_bytes(0) // 2**20
        (100, 300)
    """

    def __init__(self, gpus: list[FakeGpu] = (), unavailable: str | None = None):
        self.gpus = list(gpus)
        self.unavailable = unavailable
        self._lock = threading.Condition()

    def wait_for_queries(self, count: int, timeout_s: float = 10.0) -> None:
        """Blocks until the GPUs' memory was queried ``count`` times in all (by a sampler thread).

        Raises:
            TimeoutError: fewer queries came within ``timeout_s``.
        """
        with self._lock:
            if not self._lock.wait_for(lambda: sum(gpu.queries for gpu in self.gpus) >= count, timeout_s):
                raise TimeoutError(f"the fake GPUs were queried fewer than {count} times in {timeout_s} s")

    def open(self) -> None:
        if self.unavailable:
            raise GpuUnavailable(self.unavailable)

    def device_count(self) -> int:
        return len(self.gpus)

    def name(self, index: int) -> str:
        return self.gpus[index].name

    def uuid(self, index: int) -> str:
        return f"GPU-fake-{index:04d}"

    def total_bytes(self, index: int) -> int:
        return int(self.gpus[index].total_mib * _MIB)

    def used_bytes(self, index: int) -> int:
        gpu = self.gpus[index]
        with self._lock:
            if gpu.lost_after is not None and gpu.queries >= gpu.lost_after:
                raise GpuLost("GPU is lost")
            position = min(gpu.queries, len(gpu.used_mib) - 1)
            gpu.queries += 1
            self._lock.notify_all()
        return int(gpu.used_mib[position] * _MIB)

    def process_used_bytes(self, index: int, pid: int) -> int | None:
        gpu = self.gpus[index]
        return None if gpu.process_mib is None else int(gpu.process_mib * _MIB)


class FakeCounter(AllocatorCounter):
    """An allocator counter whose peak the test sets by hand."""

    def __init__(self, framework="FakeFramework", device="GPU:0", gpu_index=0, resettable=True, every_tensor=True):
        super().__init__(framework, device, gpu_index, resettable)
        self.every_tensor = every_tensor  # False: as oneDNN's CPU allocator, which counts no tensor under 256 KiB
        self.current_bytes = 0
        self.peak_bytes = 0
        self.resets = 0

    def allocate(self, n_bytes: int) -> None:
        self.current_bytes += n_bytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def free(self, n_bytes: int) -> None:
        self.current_bytes -= n_bytes

    def reset(self) -> None:
        self.resets += 1
        self.peak_bytes = self.current_bytes

    def read(self) -> tuple[int, int]:
        return self.current_bytes, self.peak_bytes

    def counts_every_tensor(self) -> bool:
        return self.every_tensor


class FakeClock:
    """A clock that advances ``step_s`` each time it is read.

    Example:
        >>> clock = FakeClock(step_s=0.5)
        >>> clock(), clock()
        (0.0, 0.5)
    """

    def __init__(self, step_s: float = 0.01):
        self._ticks = itertools.count()
        self.step_s = step_s

    def __call__(self) -> float:
        return next(self._ticks) * self.step_s
