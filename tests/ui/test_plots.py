"""The plotly figures (ui/plots.py), drawn from reports made with fake GPUs and allocators: what each shows."""

from lms_magic.fit.results import LmsFitResult, VariantResult
from lms_magic.testing.memory import FakeCounter, FakeGpu, FakeGpuSource
from lms_magic.memory.profile import MemoryProfiler
from lms_magic.ui.plots import MAX_POINTS, downsample, fit_figures, memory_timeline_figure

MIB = 2**20


def report(gpu_used_mib=(100, 900, 300), allocator_peak_mib=512):
    """A finished MemoryReport: one fake GPU whose used memory goes through ``gpu_used_mib``, one allocator."""
    counter = FakeCounter("TensorFlow", "GPU:0", 0)
    source = FakeGpuSource([FakeGpu("Fake T4", list(gpu_used_mib))])
    profiler = MemoryProfiler(interval_s=0.001, gpu_source=source, counters=[counter]).start()
    counter.allocate(allocator_peak_mib * MIB)
    source.wait_for_queries(len(gpu_used_mib))  # the sampler has read every scripted value
    return profiler.stop()


def test_the_timeline_draws_host_and_gpu_with_their_peaks_marked():
    figure = memory_timeline_figure(report())
    names = [trace.name for trace in figure.data]
    assert names == ["host RSS", "host RSS peak", "GPU 0 used", "GPU 0 used peak"]
    gpu_peak = figure.data[3]
    assert list(gpu_peak.y) == [900.0] and gpu_peak.text == ("900.0 MiB",)


def test_downsampling_keeps_the_peaks_of_a_long_history():
    xs = list(range(10_000))
    ys = [1.0] * 10_000
    ys[7_777] = 50.0
    kept_x, kept_y = downsample(xs, ys, keep_peaks=True)
    assert len(kept_x) <= MAX_POINTS and max(kept_y) == 50.0 and 7_777 in kept_x
    assert len(downsample(xs, ys)[0]) <= MAX_POINTS


def variant(name, status="ok", stats=None, losses=(0.9, 0.5)):
    return VariantResult(name=name, status=status, steps=len(losses), time_per_step_s=0.1, batch_size=8,
                         memory=report(), step_losses=list(losses), lms_stats=stats or {})


def peak(kinds_mib):
    by_kind = {kind: int(value * MIB) for kind, value in kinds_mib.items()}
    return {"phase": "backward", "op": "x", "bytes": sum(by_kind.values()), "by_kind": by_kind, "top": []}


KINDS = ("weights", "optimizer_state", "gradients", "activations_kept", "activations_swapped_in", "other")


def test_the_dashboards_figures_show_each_variant_and_the_predicted_peaks():
    without = peak({**dict.fromkeys(KINDS, 0), "weights": 10, "activations_kept": 90})
    with_lms = peak({**dict.fromkeys(KINDS, 0), "weights": 10, "activations_kept": 20, "activations_swapped_in": 5})
    stats = {"active": True, "peak_source": "predicted", "device_peak_bytes": with_lms["bytes"],
             "device_peak_bytes_without_lms": without["bytes"], "peak": with_lms, "peak_without_lms": without,
             "budget_bytes": 64 * MIB}
    bars, makeup, training, memory = fit_figures(LmsFitResult(calls=[[variant("no_lms"), variant("lms", stats=stats)]]))
    device = [trace for trace in bars.data if trace.xaxis == "x"]  # the device side; host RSS on its own axis
    predicted = {trace.name: dict(zip(trace.x, trace.y))["predicted device peak"] for trace in device}
    assert predicted == {"no_lms": 100.0, "lms": 35.0}
    assert all("host RSS" in trace.x for trace in bars.data if trace.xaxis == "x2")
    assert [shape.y0 for shape in bars.layout.shapes] == [64.0]  # the budget line
    assert [sum(trace.y[i] for trace in makeup.data) for i in (0, 1)] == [100.0, 35.0]  # without, with: stacked
    assert [trace.name for trace in training.data] == ["no_lms: loss", "lms: loss"]
    assert {trace.name for trace in memory.data} >= {"no_lms: host RSS", "lms: GPU 0 used"}


def test_a_variant_that_ran_out_of_memory_has_no_bars_and_says_so():
    bars = fit_figures(LmsFitResult(calls=[[variant("no_lms", status="oom", losses=()),
                                            variant("lms", stats={"active": True})]]))[0]
    host = {trace.name: list(trace.x) for trace in bars.data if trace.xaxis == "x2"}
    assert host["no_lms: OOM"] == [] and host["lms"] == ["host RSS"]


def test_small_figures_are_drawn_in_a_unit_that_does_not_round_to_zero():
    without = peak({**dict.fromkeys(KINDS, 0), "weights": 0.002, "activations_kept": 0.006})
    with_lms = peak({**dict.fromkeys(KINDS, 0), "weights": 0.002, "activations_kept": 0.001})
    stats = {"active": True, "peak_source": "predicted", "device_peak_bytes": with_lms["bytes"],
             "device_peak_bytes_without_lms": without["bytes"], "peak": with_lms, "peak_without_lms": without}
    no_gpu = MemoryProfiler(interval_s=0.001, gpu_source=FakeGpuSource([])).start().stop()  # a simulated accelerator
    variants = [variant("no_lms"), variant("lms", stats=stats)]
    for one in variants:
        one.memory = no_gpu
    bars, makeup, *_ = fit_figures(LmsFitResult(calls=[variants]))
    assert bars.layout.annotations[0].text == "device peak (KiB, predicted by LMS's replay)"
    device = [trace for trace in bars.data if trace.xaxis == "x"]
    assert [round(trace.y[0], 1) for trace in device] == [round(without["bytes"] / 1024, 1), round(with_lms["bytes"] / 1024, 1)]
    assert makeup.layout.yaxis.title.text == "KiB"


def test_one_steps_memory_timeline_shows_both_replays_their_peaks_and_the_limit():
    without = {**peak({**dict.fromkeys(KINDS, 0), "weights": 10, "activations_kept": 90}),
               "timeline": [int(m * MIB) for m in (10, 60, 100, 40, 12)]}
    with_lms = {**peak({**dict.fromkeys(KINDS, 0), "weights": 10, "activations_kept": 25}),
                "timeline": [int(m * MIB) for m in (10, 30, 35, 20, 25, 12)]}
    stats = {"active": True, "peak_source": "predicted", "device_peak_bytes": with_lms["bytes"],
             "device_peak_bytes_without_lms": without["bytes"], "peak": with_lms, "peak_without_lms": without,
             "budget_bytes": 64 * MIB, "plan_rule": "fits the device"}
    figures = fit_figures(LmsFitResult(calls=[[variant("no_lms"), variant("lms", stats=stats)]]))
    timeline = next(f for f in figures if f.layout.title.text.startswith("device memory through one train step"))
    lines = {trace.name: list(trace.y) for trace in timeline.data if trace.mode == "lines"}
    assert lines == {"without LMS": [10, 60, 100, 40, 12], "with LMS": [10, 30, 35, 20, 25, 12]}
    marks = [trace.text[0] for trace in timeline.data if trace.mode == "markers+text"]
    assert marks == ["peak 100.0 MiB (backward pass)", "peak 35.0 MiB (backward pass)"]
    assert [shape.y0 for shape in timeline.layout.shapes] == [64.0]
    assert "usable device memory 64.0 MiB" in [a.text for a in timeline.layout.annotations]
