"""HTML of a ``FitExplanation`` (``lms/explain/results.py``): what fills the step's peak, and what fits."""

from __future__ import annotations

from ..units import MIB
from .report_html import html_table


def _mib(value) -> str | None:
    return None if value is None else f"{value / MIB:.1f}"


def explanation_html(found) -> str:
    """Three tables: the peak by kind, the layers holding the most, and each way of training against the device.

    Example:
        >>> from lms_magic.lms.explain.results import FitExplanation, ModeFit
        >>> peak = {"bytes": 3 * MIB, "phase": "backward", "op": "x", "by_kind": {"weights": MIB, "activations_kept": 2 * MIB},
        ...         "layers": [{"layer": "conv", "bytes": 2 * MIB}]}
        >>> page = explanation_html(FitExplanation(8, 4 * MIB, 3 * MIB, peak, [ModeFit("LMS", MIB, True, 20, 1.1, "%%lms_fit")]))
        >>> "activations kept" in page and "conv" in page and "%%lms_fit" in page
        True
    """
    peak = found.peak
    said = f"batch {found.batch_size}: {peak['bytes'] / MIB:.1f} MiB at the peak, in the {peak['phase']} pass, without LMS"
    if found.plain_peak_source:
        said = (f"batch {found.batch_size}: {found.plain_peak_bytes / MIB:.1f} MiB at the peak without LMS "
                f"({found.plain_peak_source}); what fills it, from the replay of its operations: "
                f"{peak['bytes'] / MIB:.1f} MiB, in the {peak['phase']} pass")
    kinds = html_table(["what fills the peak", "MiB"],
                       [(kind.replace("_", " "), _mib(value)) for kind, value in
                        sorted(peak["by_kind"].items(), key=lambda item: -item[1]) if value],
                       "lms-magic-explain", notes=[said])
    layers = html_table(["layer", "MiB at the peak"], [(row["layer"], _mib(row["bytes"])) for row in peak.get("layers", [])],
                        "lms-magic-explain")
    rows = [(mode.mode, _mib(mode.peak_bytes), {True: "yes", False: "no", None: ""}[mode.fits], _largest(mode),
             None if mode.step_ratio is None else f"{mode.step_ratio:.2f}",
             mode.unavailable or " ".join(part for part in (mode.magic, mode.note and f"({mode.note})") if part))
            for mode in found.modes]
    limit = found.plain_limit_bytes
    plain = f"; without LMS, its peak may fill {limit / MIB:.1f}" if limit else ""
    device = (f"the device: {found.capacity_bytes / MIB:.1f} MiB, LMS plans to fill {found.usable_bytes / MIB:.1f}{plain}"
              if found.capacity_bytes else "no device capacity known")
    measured = found.correction.words if found.correction is not None else found.unmeasured
    notes = [device] + ([measured] if measured else []) + \
        [f"{mode.mode}: {mode.confirmed.words}" for mode in found.modes if mode.confirmed is not None] + \
        ([found.caveat] if found.caveat else []) + \
        ([f"to train batch {found.batch_size}: {found.suggestion}"] if found.suggestion else [])
    modes = html_table(["training", f"peak MiB at batch {found.batch_size}", "fits", "largest batch",
                        "step time (x plain, predicted)", "how"], rows, "lms-magic-explain", left_columns=(0, 5),
                       notes=notes)
    return f"<div>{kinds}{layers}{modes}{frontier_html(found)}{_frontier_plot(found)}</div>"


def _largest(mode):
    """A way's largest batch: the one confirmed by steps, with the predicted one beside it, where steps ran."""
    if mode.confirmed is None:
        return mode.largest_batch
    return f"{mode.confirmed.batch_size} (confirmed; {mode.largest_batch} predicted)"


def _frontier_plot(found) -> str:
    """The frontier's figure (ui/plots.py), where there is a frontier and plotly is installed."""
    try:
        from .plots import figure_html, frontier_figure

        figure = frontier_figure(found)
    except ImportError:  # plotly is optional for this view: the table above has the figures
        return ""
    return "" if figure is None else figure_html(figure)


def frontier_html(found) -> str:
    """The frontier (``explain_fit(..., batch_sizes=...)``): a row per batch size, the predicted peak (MiB) and step
    time over plain of each way of training; "" where there is none."""
    if not found.frontier:
        return ""
    modes = list(dict.fromkeys(point.mode for point in found.frontier))
    by_batch: dict[int, dict] = {}
    for point in found.frontier:
        by_batch.setdefault(point.batch_size, {})[point.mode] = point

    def cell(point):
        if point is None:
            return None
        ratio = "" if point.step_ratio is None else f", {point.step_ratio:.2f}x"
        return f"{point.peak_bytes / MIB:.1f}{ratio}{' (does not fit)' if point.fits is False else ''}"

    best = found.largest_at_speed()
    notes = [] if best is None else [f"the largest batch at {found.speed_target:.0%} of plain speed or better: "
                                     f"{best.batch_size}, {best.mode}"]
    return html_table(["batch"] + [f"{mode}: MiB, step x plain" for mode in modes],
                      [[batch] + [cell(points.get(mode)) for mode in modes] for batch, points in sorted(by_batch.items())],
                      "lms-magic-explain", notes=notes)
