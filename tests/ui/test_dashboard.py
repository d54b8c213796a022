"""The %%lms_fit dashboard: the headline first, then the figures and the table, as plain outputs."""

import html

import lms_magic

from lms_magic.ui.dashboard import Dashboard
from tests.conftest import DEVICES

ON_CPUS = DEVICES.magic_options


def test_dashboard_leads_with_what_lms_bought_and_shows_both_variants(fit_shell, tmp_path):
    result = fit_shell.run_cell(f"%%lms_fit --compare -q -o {ON_CPUS}\nmodel.fit(x, y, batch_size=16, epochs=1, verbose=0)")
    dashboard = Dashboard(result.result)
    no_lms, lms = result.result.variants
    stats = lms.lms_stats
    saved = round((stats["device_peak_bytes"] - stats["device_peak_bytes_without_lms"])
                  / stats["device_peak_bytes_without_lms"] * 100)
    assert dashboard.headline.startswith(f"LMS: predicted device peak {saved:+d}% (")
    assert "final loss identical" in dashboard.headline and "step time " in dashboard.headline
    assert f"{lms.final('loss'):.6f}" in dashboard.summary and "lms - no_lms" in dashboard.summary
    bars, makeup, timeline, training, memory = dashboard.figures
    # device and host apart: the predicted device peaks on the left, host RSS on the right, each titled
    device = [t for t in bars.data if t.xaxis == "x"]
    host = [t for t in bars.data if t.xaxis == "x2"]
    assert [t.name for t in device] == ["no_lms", "lms"] == [t.name for t in host]
    assert list(device[1].x) == list(device[0].x) and list(host[1].x) == ["host RSS"]  # the headline's pair
    assert device[1].y[-1] < device[0].y[-1]  # LMS's predicted device peak is the lower one
    titles = [a.text for a in bars.layout.annotations]
    assert titles[0].startswith("device peak (") and "predicted by LMS's replay" in titles[0]
    assert titles[1].startswith("host peak (") and "measured RSS" in titles[1]
    # one step's device memory from the replay, without and with LMS: each line's top is its predicted peak
    lines = {trace.name: max(trace.y) for trace in timeline.data if trace.mode == "lines"}
    assert set(lines) == {"without LMS", "with LMS"} and lines["with LMS"] < lines["without LMS"]
    assert "predicted by LMS's replay" in timeline.layout.title.text
    # the loss curves are identical, and the second is drawn dashed so that both show
    assert training.data[1].line.dash == "dash" and "identical with and without LMS" in training.layout.title.text
    assert sum(t.y[0] for t in makeup.data) > sum(t.y[1] for t in makeup.data)  # stacked: without, with
    assert [t.name for t in training.data] == ["no_lms: loss", "lms: loss"]
    assert len(training.data[1].y) == lms.steps
    assert {t.name for t in memory.data} >= {"no_lms: host RSS", "lms: host RSS"}
    assert not bars.layout.shapes  # no budget asked for, no budget line
    lms.lms_stats["budget_bytes"] = 3 * 2**20
    unit = 2**20 if max(stats["device_peak_bytes_without_lms"], 3 * 2**20) >= 2**20 else 2**10
    assert [shape.y0 for shape in Dashboard(result.result).figures[0].layout.shapes] == [3 * 2**20 / unit]
    # plain outputs (no widget), visible in exported HTML: the headline first, every figure with an HTML form
    bundles = dashboard.bundles()
    assert html.escape(dashboard.headline) in bundles[0]["text/html"]
    assert all("text/html" in b and "application/vnd.plotly.v1+json" in b for b in bundles[1:-1])
    lms_magic.save_html(result.result, tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert page.count('class="plotly-graph-div"') == 5
    assert page.count("<script") >= 5 and 'src="https://cdn.plot.ly' not in page  # plotly.js inline: opens offline


def test_where_nothing_moved_the_headline_says_the_model_fits_and_the_step_time_is_noise(fit_shell):
    result = fit_shell.run_cell(f"%%lms_fit --compare -q -o {ON_CPUS} --budget 1GiB\n"
                                "model.fit(x, y, batch_size=8, epochs=1, verbose=0)")
    no_lms, lms = result.result.variants
    assert lms.lms_stats["swapped_bytes_per_step"] == 0 and lms.steps >= 5
    headline = Dashboard(result.result).headline
    assert headline.startswith("LMS: the model fits the budget (predicted device peak ")
    assert ": nothing moved, step time " in headline and "is noise (steps vary by " in headline
    spread = max(no_lms.step_time_spread, lms.step_time_spread)
    assert f"steps vary by {spread:.0%})" in headline and "final loss identical" in headline
    assert "cost" not in headline and "tensors swapped" not in headline


def test_where_the_step_would_not_fit_without_lms_the_headline_says_so_in_plain_words(fit_shell):
    cell = "model.fit(x, y, batch_size=16, epochs=1, verbose=0)"
    swap_all = fit_shell.run_cell(f"%%lms_fit -q -o {ON_CPUS} --n-tensors -1\n{cell}").result.variants[-1].lms_stats
    budget = (swap_all["device_peak_bytes"] + swap_all["device_peak_bytes_without_lms"]) // 2
    result = fit_shell.run_cell(f"%%lms_fit --compare -q -o {ON_CPUS} --budget {budget}\n{cell}")
    stats = result.result.variants[-1].lms_stats
    assert stats["device_peak_bytes"] <= budget < stats["device_peak_bytes_without_lms"]
    headline = Dashboard(result.result).headline
    assert headline.startswith("LMS: without LMS the step would not fit the budget (")
    assert "predicted, above the" in headline and "LMS plans to fill); with LMS it fits, predicted device peak -" in headline
    assert "final loss identical" in headline
