"""Data to plotly figures. Plain ``plotly.graph_objects.Figure`` (not
``FigureWidget``), which renders in JupyterLab, Notebook 7, VS Code, Colab,
Kaggle and exported HTML alike."""

from __future__ import annotations

from ..units import MIB


def _plotly():
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise ImportError("the timeline plot needs plotly: pip install plotly") from None
    return go


def memory_timeline_figure(report):
    """The memory timeline of a report: host RSS and each GPU's used memory, in MiB.

    Each series has its peak sample marked; where the host peak is exact (the
    kernel's high-water mark) and above every sample, it is drawn as a dotted
    line, since the sampler missed that spike.

    Example:
        >>> import lms_magic
        >>> with lms_magic.profile_memory() as report:
        ...     block = bytearray(2**20)
        >>> [trace.name for trace in memory_timeline_figure(report).data][:2]
        ['host RSS', 'host RSS peak']
    """
    go = _plotly()
    figure = go.Figure()
    timeline = report.timeline
    series = [("host RSS", timeline.host_rss_bytes)]
    series += [(f"GPU {gpu.index} used", timeline.gpu_used_bytes.get(gpu.index, [])) for gpu in report.gpus]
    for name, values in series:
        points = [(t, v / MIB) for t, v in zip(timeline.times_s, values) if v is not None]
        if not points:
            continue
        times, mibs = zip(*points)
        figure.add_trace(go.Scatter(x=times, y=mibs, mode="lines", name=name))
        peak_at = max(range(len(mibs)), key=mibs.__getitem__)
        figure.add_trace(go.Scatter(x=[times[peak_at]], y=[mibs[peak_at]], mode="markers+text",
                                    name=f"{name} peak", text=[f"{mibs[peak_at]:.1f} MiB"],
                                    textposition="top center", showlegend=False))
    host = report.host
    if host is not None and host.exact_peak and timeline.host_rss_bytes:
        if host.peak_bytes > max(timeline.host_rss_bytes):
            figure.add_hline(y=host.peak_bytes / MIB, line_dash="dot",
                             annotation_text=f"exact host peak {host.peak_bytes / MIB:.1f} MiB (between samples)")
    figure.update_layout(title="memory timeline", xaxis_title="time (s)", yaxis_title="MiB",
                         height=360, margin=dict(l=50, r=20, t=40, b=40))
    return figure


_plotlyjs_cell = None  # the execution count of the cell whose output last carried plotly.js inline


def _execution_count():
    """The running cell's number in an IPython shell, else None."""
    from IPython import get_ipython

    shell = get_ipython()
    return None if shell is None else shell.execution_count


def figure_html(figure) -> str:
    """A figure as HTML that draws without a network: plotly.js inline in the first figure of each cell's
    output and reused by that cell's later figures, so a cell's figures draw whatever happens to the
    other cells (cleared, re-run, deleted) in an exported page or on nbviewer; in Colab, whose outputs
    are separate frames, from plotly's CDN in each figure. Outside IPython every figure carries it.

    Example:
        >>> import plotly.graph_objects as go
        >>> "Plotly.newPlot" in figure_html(go.Figure())
        True
    """
    global _plotlyjs_cell
    import sys

    if "google.colab" in sys.modules:
        return figure.to_html(full_html=False, include_plotlyjs="cdn")
    cell = _execution_count()
    include = cell is None or cell != _plotlyjs_cell
    _plotlyjs_cell = cell
    return figure.to_html(full_html=False, include_plotlyjs=include)


def figure_bundle(figure) -> dict:
    """A figure as a display bundle for every front end: plotly's own mimetype for
    JupyterLab and VS Code, HTML (:func:`figure_html`) for Colab, Kaggle and notebooks
    exported to HTML, and a line of text for terminals."""
    return {
        "application/vnd.plotly.v1+json": figure.to_plotly_json(),
        "text/html": figure_html(figure),
        "text/plain": f"<plotly Figure: {figure.layout.title.text or ', '.join(t.name or '' for t in figure.data)}>",
    }


def display_figure(figure) -> None:
    """Shows a figure in every front end (see :func:`figure_bundle`)."""
    from IPython.display import display

    display(figure_bundle(figure), raw=True)


MAX_POINTS = 2000  # per line: 10,000 steps of history draw in well under a second


def downsample(xs, ys, limit: int = MAX_POINTS, keep_peaks: bool = False):
    """At most ``limit`` points of a line: every k-th, or (``keep_peaks``) the largest of each run of k.

    Example:
        >>> downsample(list(range(10)), [0, 5, 1, 1, 9, 1, 1, 1, 2, 1], limit=5, keep_peaks=True)
        ([1, 2, 4, 6, 8], [5, 1, 9, 1, 2])
    """
    xs, ys = list(xs), list(ys)
    if len(xs) <= limit:
        return xs, ys
    step = -(-len(xs) // limit)
    picked = [max(range(i, min(i + step, len(xs))), key=ys.__getitem__) if keep_peaks else i
              for i in range(0, len(xs), step)]
    return [xs[i] for i in picked], [ys[i] for i in picked]


def fit_figures(result) -> list:
    """The %%lms_fit figures of the last fit call: peak memory per variant, the peak's make-up with and
    without LMS (TensorFlow's prediction), training loss and memory over time, variants overlaid."""
    figures = [memory_bars_figure(result.variants)]
    for optional in (peak_makeup_figure(result.variants), step_timeline_figure(result.variants)):
        if optional is not None:
            figures.append(optional)
    return figures + [training_figure(result.variants), memory_overlay_figure(result.variants)]


def step_timeline_figure(variants):
    """Device memory through one train step, without and with LMS, from LMS's replay (``stats["peak"]``'s
    timeline): what is live when, and where the peak is. The x axis is the share of the step's ops (the
    two replays run different numbers of ops: LMS adds its swaps)."""
    lms = next((v for v in variants if v.name == "lms" and v.lms_stats.get("peak")), None)
    if lms is None or not (lms.lms_stats.get("peak_without_lms") or {}).get("timeline"):
        return None
    go = _plotly()
    peaks = {"without LMS": lms.lms_stats["peak_without_lms"], "with LMS": lms.lms_stats["peak"]}
    budget = lms.lms_stats.get("budget_bytes")
    unit, name = size_unit([peak["bytes"] for peak in peaks.values()] + [budget])
    figure = go.Figure()
    for label, peak in peaks.items():
        timeline = peak.get("timeline") or []
        x = [100 * (i + 0.5) / len(timeline) for i in range(len(timeline))]
        figure.add_trace(go.Scatter(x=x, y=[value / unit for value in timeline], mode="lines", name=label))
        top = max(range(len(timeline)), key=timeline.__getitem__, default=None)
        if top is not None:
            figure.add_trace(go.Scatter(x=[x[top]], y=[timeline[top] / unit], mode="markers+text",
                                        text=[f"peak {timeline[top] / unit:.1f} {name} ({peak['phase']} pass)"],
                                        textposition="top center", name=f"{label}: peak", showlegend=False))
    if budget:
        figure.add_hline(y=budget / unit, line_dash="dash",
                         annotation_text=f"{_budget_label(lms.lms_stats)} {budget / unit:.1f} {name}")
    figure.update_layout(title=f"device memory through one train step ({name}, predicted by LMS's replay)",
                         xaxis_title="share of the step's ops (%)", yaxis_title=name, height=360,
                         margin=dict(l=50, r=20, t=40, b=40))
    return figure


def _budget_label(stats) -> str:
    """What the dashed line is: the device's usable memory (the capacity less headroom) or a budget asked for."""
    return "usable device memory" if str(stats.get("plan_rule")) == "fits the device" else "budget"


def size_unit(values) -> tuple[int, str]:
    """The unit that shows the largest of ``values`` (bytes) without rounding to zero: (bytes per unit, name).

    Example:
        >>> size_unit([2048, 500]), size_unit([3 * 2**20]), size_unit([5 * 2**30])
        ((1024, 'KiB'), (1048576, 'MiB'), (1073741824, 'GiB'))
    """
    largest = max((value for value in values if value is not None), default=0)
    return next(((unit, name) for unit, name in ((2**30, "GiB"), (2**20, "MiB")) if largest >= unit), (1024, "KiB"))


def memory_bars_figure(variants):
    """Peak memory per variant, device and host apart (never on one axis): on the left the device's (NVML's
    used memory and its allocator's, measured, or LMS's predicted device peak, with the budget line), on the
    right the host's RSS, measured. Each side in the unit its numbers need.

    A variant that ran out of memory has no bars; its name says so."""
    go = _plotly()
    from plotly.subplots import make_subplots

    device_rows = [("GPU used (NVML)", lambda v: max((g.peak_bytes for g in v.memory.gpus), default=None)),
                   ("GPU allocator", lambda v: max((p.peak_bytes for g in v.memory.gpus for p in g.allocators
                                                    if p.peak_bytes is not None), default=None))]
    lms = next((v for v in variants if v.name == "lms" and v.status == "ok"), None)
    predicted = lms is not None and lms.lms_stats.get("peak_source") == "predicted"
    device, host = {}, {}
    for variant in variants:
        label = variant.name if variant.status == "ok" else f"{variant.name}: {variant.status.upper()}"
        values = {name: get(variant) for name, get in device_rows} if variant.status == "ok" else {}
        if predicted:  # LMS's figures, as the headline gives them; under a distribution strategy, each device's
            values.update(_lms_peaks(lms.lms_stats, with_lms=variant.name == "lms"))
        device[label] = {name: value for name, value in values.items() if value is not None}
        rss = variant.memory.host.peak_bytes if variant.status == "ok" and variant.memory.host else None
        host[label] = {} if rss is None else {"host RSS": rss}
    budget = lms.lms_stats.get("budget_bytes") if lms is not None else None
    device_unit = size_unit([v for values in device.values() for v in values.values()] + [budget])
    host_unit = size_unit([v for values in host.values() for v in values.values()])
    names = {name for values in device.values() for name in values}
    measured = any(not name.startswith("predicted") for name in names)
    replayed = any(name.startswith("predicted") for name in names)
    sources = " and ".join(["measured"] * measured + ["predicted by LMS's replay"] * replayed) or "none read"
    figure = make_subplots(rows=1, cols=2, column_widths=[0.7, 0.3], subplot_titles=(
        f"device peak ({device_unit[1]}, {sources})", f"host peak ({host_unit[1]}, measured RSS)"))
    for column, side, (unit, _) in ((1, device, device_unit), (2, host, host_unit)):
        for index, (label, values) in enumerate(side.items()):
            figure.add_trace(go.Bar(name=label, x=list(values), y=[value / unit for value in values.values()],
                                    text=[f"{value / unit:.1f}" for value in values.values()], textposition="outside",
                                    marker_color=_COLOURS[index % len(_COLOURS)], legendgroup=label,
                                    showlegend=column == 1), row=1, col=column)
    if budget:
        unit, name = device_unit
        figure.add_hline(y=budget / unit, line_dash="dash", row=1, col=1, annotation_position="top left",
                         annotation_text=f"{_budget_label(lms.lms_stats)} {budget / unit:.1f} {name}")
    figure.update_layout(title="peak memory", barmode="group", height=360, margin=dict(l=50, r=20, t=60, b=40))
    return figure


def _lms_peaks(stats: dict, with_lms: bool) -> dict:
    """LMS's device peak with it or without, as bars: the figure the headline gives (``fit.results.lms_peaks``:
    measured where LMS's checked step and a plain step at its batch were read on the device, else predicted), or
    one a device where it relieved several.

    Example:
        >>> _lms_peaks({"device_peak_bytes": 5, "device_peaks": {}}, with_lms=True)
        {'predicted device peak': 5}
        >>> _lms_peaks({"device_peaks": {"/GPU:0": {"with_lms": 5, "without_lms": 9},
        ...                               "/GPU:1": {"with_lms": 6, "without_lms": 9}}}, with_lms=False)
        {'predicted peak, /GPU:0': 9, 'predicted peak, /GPU:1': 9}
    """
    from ..fit.results import lms_peaks

    by_device = stats.get("device_peaks") or {}
    key = "with_lms" if with_lms else "without_lms"
    if len(by_device) > 1:
        return {f"predicted peak, {device}": peaks[key] for device, peaks in by_device.items()}
    measured, with_bytes, without_bytes = lms_peaks(stats)
    return {f"{'measured' if measured else 'predicted'} device peak": with_bytes if with_lms else without_bytes}


_COLOURS = ("#636efa", "#ef553b")  # plotly's first two: a variant keeps its colour on both sides


def peak_makeup_figure(variants):
    """The predicted device peak's make-up, without and with LMS: one stacked bar each (``stats["peak"]``)."""
    from ..lms.core.peak import KINDS

    lms = next((v for v in variants if v.name == "lms" and v.lms_stats.get("peak")), None)
    if lms is None or not lms.lms_stats.get("peak_without_lms"):
        return None
    go = _plotly()
    peaks = {"without LMS": lms.lms_stats["peak_without_lms"], "with LMS": lms.lms_stats["peak"]}
    unit, name = size_unit([peak["bytes"] for peak in peaks.values()])
    figure = go.Figure()
    for kind in KINDS:
        figure.add_trace(go.Bar(name=kind.replace("_", " "), x=list(peaks),
                                y=[peak["by_kind"].get(kind, 0) / unit for peak in peaks.values()],
                                hovertemplate=f"%{{y:.1f}} {name}"))
    figure.update_layout(title=f"what fills the device peak ({name}, predicted by LMS's replay)", barmode="stack",
                         yaxis_title=name, height=340, margin=dict(l=50, r=20, t=40, b=40))
    return figure


def memory_overlay_figure(variants):
    """Host RSS and each GPU's used memory over each variant's run, in MiB."""
    go = _plotly()
    figure = go.Figure()
    for variant in variants:
        timeline = variant.memory.timeline
        series = [("host RSS", timeline.host_rss_bytes)]
        series += [(f"GPU {index} used", values) for index, values in sorted(timeline.gpu_used_bytes.items())]
        for label, values in series:
            points = [(t, v / MIB) for t, v in zip(timeline.times_s, values) if v is not None]
            if points:
                times, mibs = downsample(*zip(*points), keep_peaks=True)
                figure.add_trace(go.Scatter(x=times, y=mibs, mode="lines", name=f"{variant.name}: {label}"))
    figure.update_layout(title="memory during training", xaxis_title="time since the variant started (s)",
                         yaxis_title="MiB", height=360, margin=dict(l=50, r=20, t=40, b=40))
    return figure


def training_figure(variants):
    """Loss at every step of each variant."""
    go = _plotly()
    figure = go.Figure()
    drawn = [variant.step_losses for variant in variants if variant.step_losses]
    identical = len(drawn) == 2 and drawn[0] == drawn[1]
    for index, variant in enumerate(v for v in variants if v.step_losses):
        steps, losses = downsample(range(1, len(variant.step_losses) + 1), variant.step_losses)
        dashed = identical and index == 1  # the second of two identical curves, dashed over the first
        figure.add_trace(go.Scatter(x=steps, y=losses, mode="lines", name=f"{variant.name}: loss",
                                    line=dict(dash="dash", width=3) if dashed else dict(width=2)))
    figure.update_layout(title="training loss (running mean over the epoch, as Keras logs it; "
                               + ("identical with and without LMS: the dashed line lies on the other; "
                                  if identical else "") + f"at most {MAX_POINTS} points a line)",
                         xaxis_title="step", yaxis_title="loss", height=360, margin=dict(l=50, r=20, t=40, b=40))
    return figure


def frontier_figure(found):
    """The frontier of an ``explain_fit(..., batch_sizes=...)`` result: predicted peak against batch size, a line
    per way of training, with the device's usable memory as a dashed line (None where there is no frontier).

    Example:
        >>> from lms_magic.lms.explain.results import FitExplanation, FrontierPoint
        >>> points = [FrontierPoint(b, "without LMS", 10 * b * MIB, 1.0, b <= 4) for b in (2, 4, 8)]
        >>> figure = frontier_figure(FitExplanation(8, 64 * MIB, 48 * MIB, {}, [], points))
        >>> [trace.name for trace in figure.data], figure.layout.xaxis.title.text
        (['without LMS'], 'batch size')
    """
    if not found.frontier:
        return None
    go = _plotly()
    modes = list(dict.fromkeys(point.mode for point in found.frontier))
    unit, name = size_unit([point.peak_bytes for point in found.frontier] + [found.usable_bytes])
    figure = go.Figure()
    for mode in modes:
        points = sorted((point for point in found.frontier if point.mode == mode), key=lambda point: point.batch_size)
        figure.add_trace(go.Scatter(
            x=[point.batch_size for point in points], y=[point.peak_bytes / unit for point in points],
            mode="lines+markers", name=mode,
            text=["" if point.step_ratio is None else f"step {point.step_ratio:.2f}x plain" for point in points],
            hovertemplate=f"batch %{{x}}: %{{y:.1f}} {name}, %{{text}}"))
    if found.usable_bytes:
        figure.add_hline(y=found.usable_bytes / unit, line_dash="dash", annotation_position="top left",
                         annotation_text=f"usable device memory {found.usable_bytes / unit:.1f} {name}")
    figure.update_layout(title=f"predicted device peak by batch size ({name})", xaxis_title="batch size",
                         yaxis_title=name, height=360, margin=dict(l=50, r=20, t=40, b=40))
    return figure
