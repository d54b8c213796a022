"""%gpumem / %%gpumem through a real InteractiveShell."""

import gc
import sys
import threading

import pytest

from lms_magic.memory.host import rss_bytes
from lms_magic.results import MemoryReport

MIB = 2**20


def run(shell, source):
    result = shell.run_cell(source)
    return result


def test_assignments_persist_and_trailing_value_is_the_result(shell, capsys):
    result = run(shell, "%%gpumem\nkept = list(range(10))\nlen(kept) * 2")
    assert result.success and result.result == 20
    assert shell.user_ns["kept"] == list(range(10))
    assert "host: peak memory" in capsys.readouterr().out


def test_trailing_semicolon_silences_the_value(shell):
    assert run(shell, "%%gpumem\n41 + 1;").result is None


def test_ipython_syntax_runs_inside_the_cell(shell, capsys):
    run(shell, "%%gpumem\n!echo shell-escape-ran\nfiles = !echo captured\n%time inner = 7")
    assert "shell-escape-ran" in capsys.readouterr().out
    assert shell.user_ns["files"] == ["captured"] and shell.user_ns["inner"] == 7


def test_line_form_profiles_one_statement(shell, capsys):
    result = run(shell, "%gpumem -q line_value = 'a b  c'")
    assert result.success and shell.user_ns["line_value"] == "a b  c"
    assert capsys.readouterr().out == ""


def test_line_form_needs_a_statement(shell):
    result = run(shell, "%gpumem -q")
    assert "needs a statement" in str(result.error_in_exec)


def test_kept_array_increment_is_within_ten_percent(shell):
    result = run(shell, "%%gpumem -q -o\nimport numpy as np\nkept_block = np.ones(256 * 2**20 // 8)")
    increment_mib = result.result.host.increment_bytes / MIB
    assert 256 * 0.9 <= increment_mib <= 256 * 1.1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="exact peak needs Linux's VmHWM")
def test_short_spike_is_caught_by_the_exact_peak(shell):
    result = run(shell, "%%gpumem -q -o -i 1\nimport numpy as np\nspike = np.ones(300 * 2**20 // 8)\ndel spike")
    report = result.result
    assert report.host.exact_peak
    assert report.host.increment_bytes >= 290 * MIB
    assert report.host.end_bytes - report.host.baseline_bytes < 50 * MIB


def test_user_exception_propagates_and_partial_report_is_kept(shell, capsys, no_new_threads):
    result = run(shell, "%%gpumem\nbefore_error = 1\nraise KeyError('mine')")
    assert isinstance(result.error_in_exec, KeyError) and result.error_in_exec.args == ("mine",)
    assert shell.user_ns["before_error"] == 1
    partial = shell.user_ns["_"]
    assert isinstance(partial, MemoryReport) and partial.status == "error"
    assert "partial: the code raised KeyError" in capsys.readouterr().out


def test_keyboard_interrupt_shows_partial_report(shell, capsys, no_new_threads):
    result = run(shell, "%%gpumem\nraise KeyboardInterrupt")
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert "was interrupted" in capsys.readouterr().out
    assert shell.user_ns["_"].status == "interrupted"


def test_return_result_with_o(shell):
    result = run(shell, "%%gpumem -q -o -i 0.005\nx_o = 1")
    assert isinstance(result.result, MemoryReport)
    assert result.result.interval_s == 0.005


@pytest.mark.parametrize("options, words", [
    ("-i 0", "positive, finite number of seconds"), ("-i fast", "invalid float"),
    ("-i inf", "positive, finite number of seconds"), ("-i nan", "positive, finite number of seconds"),
    ("-d a,b", "GPU indices separated by commas"), ("--bogus", "unrecognized arguments"),
])
def test_bad_options_raise_usage_errors(shell, options, words):
    from IPython.core.error import UsageError

    result = run(shell, f"%%gpumem {options}\nnot_run = 1")
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    assert words in str(result.error_in_exec)
    assert "not_run" not in shell.user_ns


def test_unknown_line_option_is_not_run_as_code(shell):
    result = run(shell, "%gpumem -x = 1")
    assert "unknown option '-x'" in str(result.error_in_exec)


def test_plot_displays_a_plotly_figure(shell, capsys):
    shown = []
    import IPython.display

    original = IPython.display.display
    IPython.display.display = lambda obj, **kw: shown.append(obj)
    try:
        run(shell, "%%gpumem --plot\nplotted = bytearray(2**20)")
    finally:
        IPython.display.display = original
    (bundle,) = shown
    figure = bundle["application/vnd.plotly.v1+json"]
    assert [trace["name"] for trace in figure["data"]][:2] == ["host RSS", "host RSS peak"]
    assert "Plotly.newPlot" in bundle["text/html"]  # renders in Colab and exported HTML too


def test_figure_html_carries_plotly_js_once_a_kernel_and_from_the_cdn_in_colab(monkeypatch):
    import sys
    import types

    import plotly.graph_objects as go

    from lms_magic.ui import plots

    figure = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    monkeypatch.setattr(plots, "_plotlyjs_sent", False)
    first, second = plots.figure_html(figure), plots.figure_html(figure)
    assert len(first) > 1_000_000 > len(second)  # plotly.js inline in the first: offline, one page
    assert 'src="https://cdn.plot.ly' not in first + second
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    colab = plots.figure_html(figure)
    assert 'src="https://cdn.plot.ly' in colab and len(colab) < 1_000_000  # Colab: each output its own frame


def test_help_documents_the_options(shell):
    doc = shell.find_line_magic("gpumem").__doc__
    for option in ("--interval", "--devices", "-o", "-q", "--plot"):
        assert option in doc


def test_unload_removes_the_magics(shell):
    shell.run_line_magic("unload_ext", "lms_magic")
    assert shell.find_cell_magic("gpumem") is None and shell.find_line_magic("gpumem") is None
    shell.run_line_magic("load_ext", "lms_magic")
    assert shell.find_cell_magic("gpumem") is not None


def test_fifty_cells_leave_no_threads_and_little_memory(shell):
    for _ in range(5):
        run(shell, "%%gpumem -q\nwarm = 1")
    gc.collect()
    threads_before = threading.active_count()
    rss_before = rss_bytes()
    for _ in range(50):
        run(shell, "%%gpumem -q -i 0.001\nsmall = [0] * 1000")
    gc.collect()
    assert threading.active_count() == threads_before
    assert rss_bytes() - rss_before < 20 * MIB
