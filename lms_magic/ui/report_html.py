"""HTML of the result objects: the package's one table helper, a memory report, a %%lms_fit result and its page.

The result objects (``memory/report.py``, ``fit/results.py``) hold data and know
nothing of HTML: loading the extension (or importing ``lms_magic`` in IPython)
makes notebooks render them with these, and :func:`save_html` writes a page.
"""

from __future__ import annotations

import html

from ..units import MIB


def html_table(header, rows, css_class: str = "", left_columns=(0,), notes=()) -> str:
    """The package's one HTML table: escaped cells (None shows empty), optional notes below as a list.

    Example:
        >>> html_table(["what", "MiB"], [["a<b", 1.5], ["c", None]], left_columns=())
        '<table><thead><tr><th>what</th><th>MiB</th></tr></thead><tbody><tr><td>a&lt;b</td><td>1.5</td></tr><tr><td>c</td><td></td></tr></tbody></table>'
    """
    def cell(tag, index, value):
        style = " style='text-align:left'" if index in left_columns else ""
        return f"<{tag}{style}>{html.escape('' if value is None else str(value))}</{tag}>"

    head = "".join(f"<th>{html.escape(str(name))}</th>" for name in header)
    body = "".join("<tr>" + "".join(cell("td", index, value) for index, value in enumerate(row)) + "</tr>"
                   for row in rows)
    css = f" class='{css_class}'" if css_class else ""
    items = "".join(f"<li>{html.escape(note)}</li>" for note in notes)
    return (f"<table{css}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            + (f"<ul>{items}</ul>" if items else ""))


def memory_report_html(report) -> str:
    """A ``MemoryReport`` as the notebook shows it: a table of baselines, peaks and increments, and its notes."""
    rows = []
    if report.host is not None:
        host = report.host
        rows.append(("host RSS", host.baseline_bytes, host.peak_bytes, host.increment_bytes,
                     "exact" if host.exact_peak else "sampled"))
        rows += [(f"host: {p.framework} allocator", p.start_bytes, p.peak_bytes,
                  None if p.peak_bytes is None else p.peak_bytes - p.start_bytes, "exact") for p in host.allocators]
    for gpu in report.gpus:
        rows.append((f"GPU {gpu.index} ({gpu.name}) device used", gpu.baseline_bytes, gpu.peak_bytes,
                     gpu.increment_bytes, "NVML, sampled"))
        if gpu.process_peak_bytes is not None:
            rows.append((f"GPU {gpu.index} this process", None, gpu.process_peak_bytes, None, "NVML, sampled"))
        rows += [(f"GPU {gpu.index}: {p.framework} allocator", p.start_bytes, p.peak_bytes,
                  None if p.peak_bytes is None else p.peak_bytes - p.start_bytes, "exact") for p in gpu.allocators]

    def mib(value):
        return None if value is None else f"{value / MIB:.1f}"

    table = html_table(["memory", "baseline MiB", "peak MiB", "increment MiB", "how"],
                       [(name, mib(base), mib(peak), mib(inc), how) for name, base, peak, inc, how in rows],
                       "lms-magic-memory", left_columns=(0, 4))
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in report.notes)
    return (table + f"<div>{report.duration_s:.3f} s, {report.n_samples} samples every {report.interval_s * 1000:g} ms"
            f"{'' if report.status == 'ok' else ', ' + report.status}</div>" + (f"<ul>{notes}</ul>" if notes else ""))


def fit_result_html(result) -> str:
    """An ``LmsFitResult``'s table (one column per variant) and its messages."""
    rows = result.table() if result.calls else [["no fit call"]]
    notes = [f"{v.name}: {v.message}" for v in result.variants if v.message] + result.notes
    return html_table(rows[0], rows[1:], "lms-magic-fit", left_columns=(), notes=notes)


def fit_result_page(result) -> str:
    """A standalone page that opens offline: the headline, the figures (plotly.js inline, once) and the table."""
    from .plots import fit_figures

    figures = "".join(figure.to_html(full_html=False, include_plotlyjs=index == 0)
                      for index, figure in enumerate(fit_figures(result) if result.calls else []))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>%%lms_fit</title></head><body>"
            f"<h2>{html.escape(result.headline())}</h2>{figures}{fit_result_html(result)}</body></html>")


def save_html(result, path) -> None:
    """Writes an ``LmsFitResult`` (``%%lms_fit -o``) as a standalone page that opens offline: the
    headline, the figures (plotly.js inline, once) and the table.

    Example:
        >>> import pathlib, tempfile
        >>> from lms_magic.fit.results import LmsFitResult
        >>> page = pathlib.Path(tempfile.mkdtemp()) / "comparison.html"
        >>> save_html(LmsFitResult(), page)
        >>> "the cell called no fit" in page.read_text()
        True
    """
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(fit_result_page(result))
