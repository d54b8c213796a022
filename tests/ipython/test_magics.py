"""The magics through a real InteractiveShell: %gpumem / %%gpumem, and %%lms_fit's options and outputs."""

import gc
import json
import sys
import threading

import keras
import numpy as np
import pytest
from IPython.core.error import UsageError

import lms_magic

from lms_magic.memory.host import rss_bytes
from lms_magic.testing.memory import FakeGpu, FakeGpuSource
from lms_magic.memory.profile import MemoryProfiler
from lms_magic.memory.report import MemoryReport
from tests.conftest import DEVICES

ON_CPUS = DEVICES.magic_options

MIB = 2**20


def run(shell, source):
    result = shell.run_cell(source)
    return result


def weights(shell):
    return [w.copy() for w in shell.user_ns["model"].get_weights()]


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


def test_a_notebook_shows_the_report_as_an_html_table_of_host_and_gpus(shell):
    report = MemoryProfiler(interval_s=0.001, gpu_source=FakeGpuSource([FakeGpu("Fake T4", used_mib=[10, 20])])).start().stop()
    page = shell.display_formatter.formatters["text/html"].lookup(report)(report)  # a notebook Out's HTML
    assert "<table" in page and "host RSS" in page and "GPU 0 (Fake T4) device used" in page


def test_o_without_q_shows_the_report_once_and_underscore_holds_it(shell, capsys):
    result = run(shell, "%%gpumem -o\nx_o = 1")
    out = capsys.readouterr().out
    assert out.count("host: peak memory") == 1 and "Out[" not in out  # printed by the magic, not again as Out
    assert result.result is shell.user_ns["_"] and isinstance(result.result, MemoryReport)
    line = run(shell, "%gpumem -q -o x_o = 2")  # the line form returns it, for `report = %gpumem -q -o ...`
    assert isinstance(line.result, MemoryReport) and "host: peak memory" in capsys.readouterr().out


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


def test_each_cell_s_figures_carry_plotly_js_once_and_colab_s_come_from_the_cdn(shell, monkeypatch):
    import sys
    import types

    shell.run_cell("from lms_magic.ui import plots\nimport plotly.graph_objects as go\n"
                   "figure = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))", store_history=True)
    for _ in range(2):  # a cell, then the same cell re-run: its output replaced, its figures must still draw
        shell.run_cell("pages = [plots.figure_html(figure), plots.figure_html(figure)]", store_history=True)
        first, second = shell.user_ns["pages"]
        assert len(first) > 1_000_000 > len(second)  # plotly.js inline in the cell's first figure, offline
        assert 'src="https://cdn.plot.ly' not in first + second
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    colab = shell.user_ns["plots"].figure_html(shell.user_ns["figure"])
    assert 'src="https://cdn.plot.ly' in colab and len(colab) < 1_000_000  # Colab: each output its own frame


def test_help_documents_the_options(shell):
    doc = shell.find_line_magic("gpumem").__doc__
    for option in ("--interval", "--devices", "-o", "-q", "--plot"):
        assert option in doc


@pytest.mark.parametrize("cell, usage", [
    ("%%gpumem --help\nx = 1", "%gpumem [-i INTERVAL]"),
    ("%gpumem -h", "%gpumem [-i INTERVAL]"),
    ("%%lms_fit --compare --help\nmodel.fit(x, y)", "%lms_fit [--n-tensors N_TENSORS]"),
    ("%lms_fit --help", "%lms_fit [--n-tensors N_TENSORS]"),
    ("%lms_tune --help", "%lms_tune [--data DATA]"),
])
def test_help_prints_the_usage_and_runs_nothing(shell, capsys, cell, usage):
    result = shell.run_cell(cell)
    printed = capsys.readouterr().out
    assert result.success and usage in printed and "options:" in printed
    assert "x" not in shell.user_ns  # the cell did not run


def test_every_lms_option_is_a_flag_of_lms_fit_with_its_default_in_the_help(shell, capsys):
    import dataclasses

    from lms_magic.lms.options import LmsOptions, flag_of

    shell.run_cell("%lms_fit --help")
    printed = " ".join(capsys.readouterr().out.split())  # argparse wraps the help: compare with one space
    python_only = {"verbose", "batch_size_hint"}  # -q in the magic; a function of the data in Python
    for field in dataclasses.fields(LmsOptions):
        if field.name in python_only:
            continue
        assert flag_of(field.name) in printed, field.name
        if not isinstance(field.default, bool):
            assert f"(default {field.metadata['default_text']})" in printed, field.name
    assert "(default 65536)" in printed and "(default 1)" in printed  # min_bytes, lb


def test_a_new_lms_option_field_adds_its_flag_to_the_magics(monkeypatch):
    """The magics' flags come from LmsOptions's fields: one more field is one more flag, parsed into the options."""
    import argparse
    import dataclasses

    from lms_magic.ipython import argv
    from lms_magic.lms import options as lms_options

    extra = dataclasses.field(default=4, metadata={"help": "a new knob", "flag": None, "type": int, "choices": None,
                                                   "default_text": "4"})
    extra.name, extra.type = "new_knob", int
    monkeypatch.setattr(dataclasses, "fields", lambda cls, _fields=dataclasses.fields: (
        _fields(cls) + ((extra,) if cls is lms_options.LmsOptions else ())))

    def magic(line):
        """A magic."""
    magic = argv.lms_option_arguments(magic)
    parser = argparse.ArgumentParser()
    for decorator in reversed(magic.decorators):
        decorator.add_to_parser(parser, None)
    assert "--new-knob" in argv.flags_of(magic) and "a new knob (default 4)" in " ".join(parser.format_help().split())
    assert parser.parse_args(["--new-knob", "7", "--lb", "2"]).new_knob == 7


def test_lms_fit_question_mark_finds_the_cell_magics_help_and_its_line_form_says_what_to_do(shell, capsys):
    assert "--compare" in shell.find_line_magic("lms_fit").__doc__  # what %lms_fit? shows
    result = shell.run_cell("%lms_fit --compare")
    assert isinstance(result.error_in_exec, UsageError)
    assert "%%lms_fit works on a cell" in str(result.error_in_exec)


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



# -- %%lms_fit: options, outputs, the cell's namespace --------------------------------------------
def test_the_cell_gets_the_lms_variants_values(fit_shell):
    start = weights(fit_shell)
    result = fit_shell.run_cell(f"%%lms_fit --compare -q -o {ON_CPUS}\n"
                            "history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)\nfinal = history.history")
    lms = result.result.variants[1]
    assert fit_shell.user_ns["final"]["loss"] == lms.history["loss"]
    assert any(not np.array_equal(a, b) for a, b in zip(start, weights(fit_shell)))
    assert "fit" not in keras.Model.__dict__ and "fit_generator" not in keras.Model.__dict__


def test_o_shows_the_table_once_and_underscore_holds_the_result(fit_shell, capsys):
    result = fit_shell.run_cell(f"%%lms_fit --compare -o {ON_CPUS}\nmodel.fit(x, y, batch_size=16, epochs=1, verbose=0)")
    out = capsys.readouterr().out
    assert out.count("time per step") == 1 and "Out[" not in out  # the dashboard's table, not again as Out
    assert result.result is fit_shell.user_ns["_"] and result.result.variants[1].name == "lms"


def test_steps_limits_each_variant(fit_shell):
    result = fit_shell.run_cell(f"%%lms_fit --compare --steps 5 -q -o {ON_CPUS}\n"
                            "model.fit(x, y, batch_size=16, epochs=3, verbose=0)")
    assert [v.steps for v in result.result.variants] == [5, 5]


def test_quiet_prints_nothing_and_o_returns_a_full_result(fit_shell, capsys, tmp_path):
    result = fit_shell.run_cell(f"%%lms_fit --compare -q -o {ON_CPUS}\nmodel.fit(x, y, batch_size=16, epochs=1, verbose=0)")
    out = capsys.readouterr().out  # only IPython's display of the returned value, as with %timeit -q -o
    assert "%%lms_fit:" not in out and "LMS:" not in out and out.startswith("Out[")
    summary = result.result.to_dict()
    for variant in summary["variants"]:
        assert set(variant) >= {"name", "status", "steps", "time_per_step_s", "host_peak_mib",
                                "host_increment_mib", "gpus", "history", "swapped_bytes_per_step"}
    assert json.loads(result.result.to_json())["variants"][0]["name"] == "no_lms"
    lms = summary["variants"][1]
    assert lms["device_peak_source"] == "predicted" and lms["device_peak_bytes"] > 0
    assert lms["predicted_device_peak_bytes"] == lms["device_peak_bytes"]
    page = tmp_path / "comparison.html"
    lms_magic.save_html(result.result, page)
    text = page.read_text()
    assert "lms - no_lms" in text and text.count('class="plotly-graph-div"') == 5
    shown = fit_shell.display_formatter.formatters["text/html"].lookup(result.result)(result.result)
    assert "<table class='lms-magic-fit'>" in shown and "lms - no_lms" in shown


def test_recompute_only_says_what_it_recomputed_and_that_the_loss_is_the_same(fit_shell):
    fit_shell.run_cell("bn_model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3), "
                       "keras.layers.BatchNormalization(), keras.layers.ReLU(), keras.layers.GlobalAveragePooling2D(), "
                       "keras.layers.Dense(1)])\nbn_model.compile('sgd', 'mse')\n"
                       "images = np.random.default_rng(0).random((32, 16, 16, 3), dtype='float32')")
    result = fit_shell.run_cell(f"%%lms_fit --compare -q -o {ON_CPUS} --recompute only --n-tensors -1 --min-bytes 0\n"
                                "bn_model.fit(images, images[:, 0, 0, 0], batch_size=8, epochs=1, verbose=0)").result
    headline = result.headline()
    assert "recomputed on the device" in headline and "swapped" not in headline, headline
    assert "final loss identical" in headline
    row = next(row for row in result.table() if row[0] == "recomputed per step")
    assert row[1] == "0.0 KiB" and row[2] != "0.0 KiB"


def test_recompute_on_says_what_it_recomputed_and_what_it_swapped(fit_shell):
    """The hybrid plan through the magic, with the default plan, on a residual model with BatchNormalization."""
    fit_shell.run_cell("from tests import models as test_models\nresidual = test_models.residual_bn_dropout()\n"
                       "x, y = test_models.images(48, 32)")
    result = fit_shell.run_cell(f"%%lms_fit --compare -q -o {ON_CPUS} --recompute on --min-bytes 0\n"
                                "residual.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)").result
    headline = result.headline()
    stats = next(v.lms_stats for v in result.variants if v.lms_stats)
    assert f"{stats['swapped_tensors']} tensors swapped" in headline and "final loss identical" in headline
    if stats["recomputed_tensors"]:  # TensorFlow 2.21 here
        assert f"{stats['recomputed_tensors']} tensors recomputed on the device" in headline, headline
    else:  # TensorFlow 2.17 (make test-oldest): the recomputes' step came out above swaps alone, which took over
        assert "recomputed" not in headline
        assert any("swaps alone from the next step" in note for note in stats["notes"]), stats["notes"]


def test_lean_ops_says_which_layers_lean_and_that_the_loss_differs_at_rounding_only(fit_shell):
    fit_shell.run_cell("from tests import models as test_models\nresidual = test_models.residual_bn_dropout()\n"
                       "x, y = test_models.images(48, 32)")
    result = fit_shell.run_cell(f"%%lms_fit --compare -q -o {ON_CPUS} --lean-ops --n-tensors -1 --min-bytes 0\n"
                                "residual.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)").result
    stats = next(v.lms_stats for v in result.variants if v.lms_stats)
    assert stats["lean_layers"] == 3 and stats["swapped_tensors"] > 0
    assert "lean BatchNormalization gradient in 3 layers" in result.headline()
    lms, plain = (next(v for v in result.variants if v.name == name) for name in ("lms", "no_lms"))
    np.testing.assert_allclose(lms.step_losses, plain.step_losses, rtol=1e-5)


def test_order_backward_orders_the_backward_pass_and_trains_to_the_bit(fit_shell):
    fit_shell.run_cell("import keras, numpy as np\nfrom tests.lms.tensorflow.real_models import reduced\n"
                       "net = reduced('resnet')()\nnet.compile(keras.optimizers.SGD(0.01, momentum=0.9), "
                       "keras.losses.SparseCategoricalCrossentropy(from_logits=True))\n"
                       "rng = np.random.default_rng(0)\n"
                       "x, y = rng.random((16, 32, 32, 3), dtype='float32'), rng.integers(0, 10, 16)")
    result = fit_shell.run_cell(f"%%lms_fit --compare -q -o {ON_CPUS} --order-backward --n-tensors -1 --min-bytes 0\n"
                                "net.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)").result
    stats = next(v.lms_stats for v in result.variants if v.lms_stats)
    assert stats["ordered_layers"] > 0 and stats["swapped_tensors"] > 0
    headline = result.headline()
    assert f"backward pass one layer at a time ({stats['ordered_layers']} layers)" in headline
    assert "final loss identical" in headline, headline


@pytest.mark.parametrize("options, words", [("--lb 0", "--lb 0: must be a whole number >= 1"),
                                            ("--steps 0", "--steps 0: must be a whole number >= 1"),
                                            ("--budget lots", "--budget lots: not a memory size"),
                                            ("--n-tensors -5", "--n-tensors -5: must be None (planned"),
                                            ("--min-bytes -1", "--min-bytes -1: must be a whole number >= 0"),
                                            ("-i inf", "positive, finite number of seconds"),
                                            ("--device banana", "--device banana: is not a device of this "
                                                                "process, which has /CPU:0, /CPU:1"),
                                            ("--host-device /GPU:3", "--host-device /GPU:3: is not a device"),
                                            ("--recompute yes", "argument --recompute: invalid choice: 'yes'")])
def test_bad_options_are_usage_errors(fit_shell, options, words):
    from IPython.core.error import UsageError

    result = fit_shell.run_cell(f"%%lms_fit {options}\nnot_run = 1")
    assert isinstance(result.error_in_exec, UsageError) and words in str(result.error_in_exec)
    assert "not_run" not in fit_shell.user_ns


def test_a_cell_without_fit_says_so(fit_shell, capsys):
    result = fit_shell.run_cell("%%lms_fit -o\nvalue = 3")
    assert result.result.calls == [] and "called no fit" in str(result.result)
    capsys.readouterr()
    fit_shell.run_cell("%%lms_fit\nvalue = 3")
    assert capsys.readouterr().out.count("called no fit") == 1  # said once


@pytest.mark.parametrize("callbacks, words", [("[None]", "item 0 is None, not a keras.callbacks.Callback"),
                                              ("[keras.callbacks.History(), 3]", "item 1 is 3"),
                                              ("keras.callbacks.History()", "write callbacks=[...]")])
def test_a_bad_callback_is_refused_in_the_users_terms_and_the_model_is_untouched(fit_shell, callbacks, words):
    fit_shell.run_cell("import keras\nmodel = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])\n"
                       "model.compile('sgd', 'mse')\nweights = [w.copy() for w in model.get_weights()]")
    result = fit_shell.run_cell(f"%%lms_fit\nmodel.fit(np.ones((8, 4)), np.ones((8, 2)), callbacks={callbacks}, "
                                "verbose=0)")
    assert isinstance(result.error_in_exec, TypeError) and words in str(result.error_in_exec)
    model, before = fit_shell.user_ns["model"], fit_shell.user_ns["weights"]
    assert model.optimizer.iterations.numpy() == 0
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), before))
