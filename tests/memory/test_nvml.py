"""The real NvmlSource against a fake pynvml module, and CUDA_VISIBLE_DEVICES mapping."""

import sys
import types
from types import SimpleNamespace

import pytest

from lms_magic.testing.memory import FakeGpu, FakeGpuSource
from lms_magic.memory.nvml import GpuLost, GpuUnavailable, NvmlSource, visible_indices


class FakeNVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_pynvml(init_error=None, pid_listed=True, lost=False, processes_error=None):
    module = types.ModuleType("pynvml")
    module.NVMLError = FakeNVMLError
    module.nvmlMemory_v2 = 0x02000028
    calls = []

    def init():
        if init_error is not None:
            raise FakeNVMLError(init_error)

    def memory(handle, version=None):
        calls.append(version)
        if lost:
            raise FakeNVMLError(15)
        return SimpleNamespace(total=16 * 2**30, used=(1 + handle) * 2**30)

    module.nvmlInit = init
    module.nvmlDeviceGetCount = lambda: 2
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetName = lambda h: b"Tesla T4"
    module.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    module.nvmlDeviceGetMemoryInfo = memory
    def processes(handle):
        if processes_error is not None:
            raise FakeNVMLError(processes_error)
        return [SimpleNamespace(pid=pid_listed, usedGpuMemory=512 * 2**20)] if pid_listed else []

    module.nvmlDeviceGetComputeRunningProcesses = processes
    module.calls = calls
    return module


@pytest.fixture
def install(monkeypatch):
    def _install(module):
        monkeypatch.setitem(sys.modules, "pynvml", module)
        monkeypatch.setattr(NvmlSource, "_initialised", False)
        return module

    return _install


def test_reads_names_and_v2_memory(install):
    module = install(fake_pynvml())
    source = NvmlSource()
    source.open()
    assert source.device_count() == 2
    assert source.name(0) == "Tesla T4"
    assert source.used_bytes(1) == 2 * 2**30
    assert module.calls[-1] == module.nvmlMemory_v2


@pytest.mark.parametrize("code, words", [(12, "no NVIDIA driver library"), (4, "permission denied"),
                                         (9, "driver is not loaded"), (999, "NVML failed")])
def test_init_errors_become_reasons(install, code, words):
    install(fake_pynvml(init_error=code))
    with pytest.raises(GpuUnavailable, match=words):
        NvmlSource().open()


def test_missing_bindings_say_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with pytest.raises(GpuUnavailable, match="pip install nvidia-ml-py"):
        NvmlSource().open()


def test_lost_gpu_raises_gpu_lost(install):
    install(fake_pynvml(lost=True))
    source = NvmlSource()
    source.open()
    with pytest.raises(GpuLost):
        source.used_bytes(0)


def test_process_use_only_when_pid_listed(install):
    install(fake_pynvml(pid_listed=4242))
    source = NvmlSource()
    source.open()
    assert source.process_used_bytes(0, 4242) == 512 * 2**20
    assert source.process_used_bytes(0, 1) is None


def test_a_gpu_that_cannot_list_processes_still_measures(install):
    """NOT_SUPPORTED (3) from the process list (vGPU, MIG, WSL) marked the whole GPU as lost."""
    install(fake_pynvml(processes_error=3))
    source = NvmlSource()
    source.open()
    assert source.process_used_bytes(0, 4242) is None
    assert source.used_bytes(0) == 2**30


def test_a_lost_gpu_in_the_process_list_is_still_lost(install):
    install(fake_pynvml(processes_error=15))
    source = NvmlSource()
    source.open()
    with pytest.raises(GpuLost):
        source.process_used_bytes(0, 4242)


@pytest.mark.parametrize("setting, expected", [
    (None, [0, 1, 2]), ("", []), ("1", [1]), ("2,0", [2, 0]), ("0,7,1", [0]),
    ("GPU-fake-0002", [2]), ("GPU-fake-000", []), ("1,1", [1]),
])
def test_visible_indices_follow_cuda_rules(setting, expected):
    source = FakeGpuSource([FakeGpu("A"), FakeGpu("B"), FakeGpu("C")])
    environ = {} if setting is None else {"CUDA_VISIBLE_DEVICES": setting}
    assert visible_indices(source, environ) == expected
