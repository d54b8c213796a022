"""GPU memory through NVML, behind a small interface that tests can fake.

:class:`GpuSource` names what the profiler asks of GPUs. :class:`NvmlSource`
answers through ``pynvml`` (the ``nvidia-ml-py`` package), imported and
initialised on first use, never at extension load. Every failure to reach
NVML becomes :class:`GpuUnavailable` with a sentence a user can act on, so a
machine without a GPU flows through reporting instead of crashing.
"""

from __future__ import annotations

import os
import threading


class GpuUnavailable(Exception):
    """No GPU can be measured; ``str(error)`` says why, for the report."""


class GpuLost(Exception):
    """A GPU stopped answering while it was being sampled."""


class GpuSource:
    """What the memory profiler needs to know of the machine's GPUs.

    Indices are NVML's (all GPUs of the machine); :func:`visible_indices`
    maps them to the CUDA-visible order that frameworks use.
    """

    def open(self) -> None:
        """Makes the source ready; raises GpuUnavailable if it cannot be."""

    def device_count(self) -> int:
        raise NotImplementedError

    def name(self, index: int) -> str:
        raise NotImplementedError

    def uuid(self, index: int) -> str:
        raise NotImplementedError

    def total_bytes(self, index: int) -> int:
        raise NotImplementedError

    def used_bytes(self, index: int) -> int:
        """Device-wide used memory; raises GpuLost if the GPU is gone."""
        raise NotImplementedError

    def process_used_bytes(self, index: int, pid: int) -> int | None:
        """Memory used by process ``pid`` on the GPU, or None if NVML does not list it."""
        raise NotImplementedError


# NVML return codes (nvml.h) that have their own explanation.
_NO_PERMISSION = 4
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_GPU_IS_LOST = 15

_REASONS = {
    _NO_PERMISSION: "NVML refused access (permission denied); GPU memory is not measured",
    _DRIVER_NOT_LOADED: "the NVIDIA driver is not loaded, so no GPU is measured",
    _LIBRARY_NOT_FOUND: "no NVIDIA driver library (libnvidia-ml) on this machine, so no GPU is measured",
}


class NvmlSource(GpuSource):
    """GPU memory from the NVIDIA Management Library (v2 memory info).

    Example:
        >>> source = NvmlSource()
        >>> try:
        ...     source.open()
        ...     n_gpus = source.device_count()
        ... except GpuUnavailable as why:  # no driver, no bindings, no permission
        ...     n_gpus = 0
        >>> n_gpus >= 0
        True
    """

    _init_lock = threading.Lock()
    _initialised = False

    def __init__(self):
        self._pynvml = None
        self._handles: dict[int, object] = {}

    def open(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise GpuUnavailable(
                "the NVML bindings are missing (pip install nvidia-ml-py), so no GPU is measured"
            ) from None
        with NvmlSource._init_lock:
            if not NvmlSource._initialised:
                try:
                    pynvml.nvmlInit()
                except pynvml.NVMLError as error:
                    raise GpuUnavailable(_reason(error)) from None
                except OSError as error:  # a broken driver install
                    raise GpuUnavailable(f"NVML could not be loaded ({error})") from None
                NvmlSource._initialised = True
        self._pynvml = pynvml

    def _handle(self, index: int):
        if index not in self._handles:
            self._handles[index] = self._call(self._pynvml.nvmlDeviceGetHandleByIndex, index)
        return self._handles[index]

    def _call(self, function, *args):
        try:
            return function(*args)
        except self._pynvml.NVMLError as error:
            if getattr(error, "value", None) in (_NO_PERMISSION, _DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND):
                raise GpuUnavailable(_reason(error)) from None
            raise GpuLost(str(error)) from None

    def device_count(self) -> int:
        return int(self._call(self._pynvml.nvmlDeviceGetCount))

    def name(self, index: int) -> str:
        name = self._call(self._pynvml.nvmlDeviceGetName, self._handle(index))
        return name.decode() if isinstance(name, bytes) else str(name)

    def uuid(self, index: int) -> str:
        uuid = self._call(self._pynvml.nvmlDeviceGetUUID, self._handle(index))
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)

    def _memory(self, index: int):
        pynvml = self._pynvml
        try:
            return self._call(pynvml.nvmlDeviceGetMemoryInfo, self._handle(index), pynvml.nvmlMemory_v2)
        except GpuLost:
            # Drivers older than v2 memory info: fall back to v1.
            return self._call(pynvml.nvmlDeviceGetMemoryInfo, self._handle(index))

    def total_bytes(self, index: int) -> int:
        return int(self._memory(index).total)

    def used_bytes(self, index: int) -> int:
        return int(self._memory(index).used)

    def process_used_bytes(self, index: int, pid: int) -> int | None:
        """This process's memory on the GPU; None where NVML does not list it or cannot say.

        A GPU that cannot list its processes (NOT_SUPPORTED under vGPU, MIG or WSL,
        for example) still measures its used memory: only this field is missing,
        as nvitop shows N/A for it. A lost GPU still raises GpuLost.
        """
        handle = self._handle(index)
        try:
            processes = self._pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except self._pynvml.NVMLError as error:
            if getattr(error, "value", None) in (_GPU_IS_LOST, _NO_PERMISSION, _DRIVER_NOT_LOADED,
                                                 _LIBRARY_NOT_FOUND):
                self._call(_raise, error)
            return None
        for process in processes:
            if process.pid == pid and process.usedGpuMemory is not None:
                return int(process.usedGpuMemory)
        return None


def _raise(error):
    raise error


def _reason(error) -> str:
    return _REASONS.get(getattr(error, "value", None), f"NVML failed ({error}), so no GPU is measured")


def visible_indices(source: GpuSource, environ=os.environ) -> list[int]:
    """NVML indices of the GPUs that CUDA programs see, in CUDA's order.

    ``CUDA_VISIBLE_DEVICES`` may list indices or UUIDs (or prefixes of them);
    listing stops at the first entry that names no GPU, as in CUDA.

    Example:
        >>> from lms_magic.testing.memory import FakeGpuSource, FakeGpu
        >>> source = FakeGpuSource([FakeGpu("A"), FakeGpu("B"), FakeGpu("C")])
        >>> visible_indices(source, {"CUDA_VISIBLE_DEVICES": "2,0"})
        [2, 0]
    """
    count = source.device_count()
    setting = environ.get("CUDA_VISIBLE_DEVICES")
    if setting is None:
        return list(range(count))
    chosen: list[int] = []
    uuids = None
    for entry in (part.strip() for part in setting.split(",")):
        if entry.isdigit():
            index = int(entry)
            if index >= count:
                break
        else:
            if uuids is None:
                uuids = [source.uuid(i) for i in range(count)]
            matches = [i for i, uuid in enumerate(uuids) if entry and uuid.startswith(entry)]
            if len(matches) != 1:
                break
            index = matches[0]
        if index in chosen:
            break
        chosen.append(index)
    return chosen
