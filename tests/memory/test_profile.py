"""The profiler's GPU and allocator paths, driven by fakes (no GPU needed)."""

import threading

import pytest

import lms_magic
from lms_magic.testing.memory import FakeClock, FakeCounter, FakeGpu, FakeGpuSource
from lms_magic.memory.profile import MemoryProfiler, UnknownDeviceError, profile_memory

MIB = 2**20


def profile(source, counters=(), **options):
    return MemoryProfiler(interval_s=0.001, gpu_source=source, counters=list(counters), **options)


@pytest.fixture(autouse=True)
def _no_new_threads(no_new_threads):
    yield


def test_several_gpus_peak_and_increment():
    source = FakeGpuSource([FakeGpu("Fake T4", used_mib=[100, 100, 900, 300]),
                            FakeGpu("Fake A100", used_mib=[50])])
    report = profile(source).start().stop()
    first, second = report.gpus
    assert (first.index, first.name) == (0, "Fake T4")
    assert first.baseline_bytes == 100 * MIB
    assert first.peak_bytes == 900 * MIB
    assert first.increment_bytes == 800 * MIB
    assert second.increment_bytes == 0
    assert "GPU 0 (Fake T4): device used peak 900.0 MiB, increment 800.0 MiB" in str(report)
    assert "GPU 1 (Fake A100)" in str(report)


@pytest.mark.parametrize("count", [2, 4])
def test_each_gpu_has_a_line_of_its_own(count):  # Kaggle's T4 x2, a 4-GPU machine
    source = FakeGpuSource([FakeGpu("Fake T4", used_mib=[100, 100 + 50 * index]) for index in range(count)])
    lines = str(profile(source).start().stop()).splitlines()
    for index in range(count):
        mine = [line for line in lines if line.startswith(f"GPU {index} (Fake T4): ")]
        assert len(mine) == 1 and f"increment {50 * index:.1f} MiB" in mine[0]


def test_missing_library_gives_a_host_only_report_with_the_reason():
    report = profile(FakeGpuSource(unavailable="no NVIDIA driver library on this machine")).start().stop()
    assert report.gpus == []
    assert report.host.peak_bytes > 0
    text = str(report)
    assert text.startswith("host: peak memory")
    assert "host only: no NVIDIA driver library on this machine" in text


def test_permission_error_gives_a_host_only_report():
    report = profile(FakeGpuSource(unavailable="NVML refused access (permission denied)")).start().stop()
    assert report.gpus == [] and "permission denied" in str(report)


def test_hidden_pid_is_said_not_guessed():
    report = profile(FakeGpuSource([FakeGpu("Fake", process_mib=None)])).start().stop()
    assert report.gpus[0].process_peak_bytes is None
    assert "does not list this process" in str(report)
    assert "this process" not in str(report).splitlines()[1]


def test_visible_pid_reports_process_use():
    report = profile(FakeGpuSource([FakeGpu("Fake", process_mib=640)])).start().stop()
    assert report.gpus[0].process_peak_bytes == 640 * MIB
    assert "this process 640.0 MiB" in str(report)


def test_gpu_vanishing_mid_cell_keeps_figures_until_then():
    source = FakeGpuSource([FakeGpu("Fake", used_mib=[100, 700], lost_after=2), FakeGpu("Other", used_mib=[10])])
    profiler = profile(source).start()
    report = profiler.stop()
    lost, other = report.gpus
    assert lost.lost and lost.peak_bytes == 700 * MIB
    assert not other.lost
    assert "GPU 0 stopped answering" in str(report)
    assert report.to_dict()["gpus"][0]["lost"] is True


def test_unknown_device_says_which_exist():
    source = FakeGpuSource([FakeGpu("A"), FakeGpu("B")])
    with pytest.raises(UnknownDeviceError, match="GPU 5 does not exist; this process sees GPU 0, 1"):
        profile(source, devices=[5]).start()


def test_devices_option_selects_gpus():
    source = FakeGpuSource([FakeGpu("A"), FakeGpu("B")])
    report = profile(source, devices=[1]).start().stop()
    assert [gpu.index for gpu in report.gpus] == [1]


def test_allocator_peak_is_exact_and_attached_to_its_gpu():
    counter = FakeCounter("PyTorch", "cuda:0", gpu_index=0)
    counter.allocate(100 * MIB)
    counter.allocate(400 * MIB)  # an old peak, before the window
    counter.free(400 * MIB)
    profiler = profile(FakeGpuSource([FakeGpu("Fake")]), [counter]).start()
    counter.allocate(250 * MIB)
    counter.free(250 * MIB)
    report = profiler.stop()
    (peak,) = report.gpus[0].allocators
    assert peak.peak_bytes == 350 * MIB  # reset at start: the old 500 MiB peak is not counted
    assert "PyTorch allocator peak 350.0 MiB" in str(report)
    assert report.to_dict()["gpus"][0]["allocator"] == "PyTorch"
    assert report.to_dict()["gpus"][0]["allocator_peak_mib"] == 350


def test_non_resettable_counter_is_exact_only_with_a_new_high():
    counter = FakeCounter("JAX", "gpu:0", gpu_index=0, resettable=False)
    counter.allocate(500 * MIB)
    counter.free(500 * MIB)
    report = profile(FakeGpuSource([FakeGpu("Fake")]), [counter]).start().stop()
    assert report.gpus[0].allocators[0].peak_bytes is None
    assert "JAX allocator peak unknown" in str(report)
    profiler = profile(FakeGpuSource([FakeGpu("Fake")]), [counter]).start()
    counter.allocate(800 * MIB)
    assert profiler.stop().gpus[0].allocators[0].peak_bytes == 800 * MIB


def test_nested_windows_keep_the_outer_allocator_peak():
    counter = FakeCounter("TensorFlow", "CPU:0", gpu_index=None)
    outer = profile(FakeGpuSource(), [counter]).start()
    counter.allocate(300 * MIB)
    counter.free(300 * MIB)
    inner = profile(FakeGpuSource(), [counter]).start()  # resets the counter
    counter.allocate(10 * MIB)
    inner_report = inner.stop()
    outer_report = outer.stop()
    assert inner_report.host.allocators[0].peak_bytes == 10 * MIB
    assert outer_report.host.allocators[0].peak_bytes == 300 * MIB


def test_an_allocator_that_misses_small_tensors_is_said_with_what_to_set():
    counter = FakeCounter("TensorFlow", "CPU:0", gpu_index=None, every_tensor=False)
    report = profile(FakeGpuSource(), [counter]).start().stop()
    assert "counts no tensor under 256 KiB" in str(report) and "TF_CPU_ALLOCATOR_USE_BFC=true" in str(report)
    assert "256 KiB" not in str(profile(FakeGpuSource(), [FakeCounter("TensorFlow", "CPU:0", None)]).start().stop())


def test_injected_clock_sets_duration():
    report = profile(FakeGpuSource(), clock=FakeClock(step_s=0.25)).start().stop()
    assert report.duration_s > 0 and report.duration_s % 0.25 == 0


def test_sampler_records_a_timeline_and_stops():
    source = FakeGpuSource([FakeGpu("Fake", used_mib=[1, 2, 3])])
    with profile_memory(interval_s=0.001, gpu_source=source) as report:
        assert report.status == "running"
        threading.Event().wait(0.05)
    assert report.status == "ok"
    assert report.n_samples >= 5
    assert len(report.timeline.gpu_used_bytes[0]) == report.n_samples
    assert report.to_dict()["n_samples"] == report.n_samples


def test_context_manager_keeps_partial_report_and_reraises():
    with pytest.raises(ZeroDivisionError):
        with profile_memory(gpu_source=FakeGpuSource()) as report:
            1 / 0
    assert report.status == "error" and report.error == "ZeroDivisionError"
    assert "partial: the code raised ZeroDivisionError" in str(report)


def test_keyboard_interrupt_marks_interrupted():
    with pytest.raises(KeyboardInterrupt):
        with profile_memory(gpu_source=FakeGpuSource()) as report:
            raise KeyboardInterrupt
    assert report.status == "interrupted"


@pytest.mark.parametrize("interval_s", [0, -1, float("inf"), float("nan"), "0.01"])
def test_bad_interval_is_a_value_error(interval_s):
    with pytest.raises(ValueError, match="positive, finite number of seconds"):
        MemoryProfiler(interval_s=interval_s)


def test_to_dict_has_the_documented_keys():
    report = profile(FakeGpuSource([FakeGpu("Fake", used_mib=[10, 20])])).start().stop()
    summary = report.to_dict()
    assert set(summary["host"]) >= {"baseline_mib", "peak_mib", "increment_mib", "exact_peak"}
    assert set(summary["gpus"][0]) >= {"index", "name", "peak_mib", "increment_mib", "allocator",
                                       "allocator_peak_mib"}
    assert set(summary) >= {"duration_s", "interval_s", "n_samples"}
    assert summary["gpus"][0]["increment_mib"] == 10


def test_figure_has_host_and_gpu_traces_with_peaks():
    report = profile(FakeGpuSource([FakeGpu("Fake", used_mib=[10, 50, 20])])).start().stop()
    figure = lms_magic.memory_timeline_figure(report)
    names = [trace.name for trace in figure.data]
    assert names == ["host RSS", "host RSS peak", "GPU 0 used", "GPU 0 used peak"]
    gpu_peak = figure.data[3]
    assert gpu_peak.y[0] == 50
