"""On a real NVIDIA GPU (skipped without one): PyTorch allocates, %%gpumem sees it."""

import pytest

pytestmark = pytest.mark.gpu
MIB = 2**20


def test_torch_allocation_shows_in_nvml_and_allocator(shell):
    torch = pytest.importorskip("torch")
    torch.cuda.init()
    shell.user_ns["torch"] = torch
    shell.run_cell("warm = torch.zeros(1, device='cuda')")  # the CUDA context exists before the cell
    result = shell.run_cell("%%gpumem -q -o\nblock = torch.empty(1024 * MIB // 4, device='cuda').fill_(1)\n"
                            "torch.cuda.synchronize()".replace("MIB", str(MIB)))
    report = result.result
    gpu = report.gpus[0]
    assert gpu.increment_bytes >= 1000 * MIB  # NVML device-wide, sampled
    (peak,) = gpu.allocators
    assert peak.framework == "PyTorch"
    assert peak.peak_bytes - peak.start_bytes == 1024 * MIB  # exact
