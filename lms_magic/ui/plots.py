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
        >>> [trace.name for trace in report.figure().data][:2]
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


def figure_bundle(figure) -> dict:
    """A figure as a display bundle for every front end: plotly's own mimetype for
    JupyterLab and VS Code, and an HTML version (plotly.js from its CDN) for Colab,
    Kaggle and notebooks exported to HTML."""
    return {
        "application/vnd.plotly.v1+json": figure.to_plotly_json(),
        "text/html": figure.to_html(full_html=False, include_plotlyjs="cdn"),
        "text/plain": f"<plotly Figure: {', '.join(trace.name or '' for trace in figure.data)}>",
    }


def display_figure(figure) -> None:
    """Shows a figure in every front end (see :func:`figure_bundle`)."""
    from IPython.display import display

    display(figure_bundle(figure), raw=True)


def fit_figures(result) -> list:
    """The %%lms_fit figures of the last fit call: memory over time and training loss, variants overlaid."""
    return [memory_overlay_figure(result.variants), training_figure(result.variants)]


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
                times, mibs = zip(*points)
                figure.add_trace(go.Scatter(x=times, y=mibs, mode="lines", name=f"{variant.name}: {label}"))
    figure.update_layout(title="memory during training", xaxis_title="time since the variant started (s)",
                         yaxis_title="MiB", height=360, margin=dict(l=50, r=20, t=40, b=40))
    return figure


def training_figure(variants):
    """Loss at every step of each variant."""
    go = _plotly()
    figure = go.Figure()
    for variant in variants:
        if variant.step_losses:
            figure.add_trace(go.Scatter(x=list(range(1, len(variant.step_losses) + 1)), y=variant.step_losses,
                                        mode="lines", name=f"{variant.name}: loss"))
    figure.update_layout(title="training loss (running mean over the epoch, as Keras logs it)",
                         xaxis_title="step", yaxis_title="loss", height=360, margin=dict(l=50, r=20, t=40, b=40))
    return figure
