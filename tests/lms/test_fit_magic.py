"""%%lms_fit through a real InteractiveShell: fairness, namespace, failures, outputs."""

import html
import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from lms_magic.ui.dashboard import Dashboard

LMS_ON_CPUS = "--device /CPU:0 --host-device /CPU:1 --min-bytes 0"

SETUP = """
import keras, numpy as np
keras.utils.set_random_seed(0)
x = np.random.rand(256, 3).astype("float32")
y = (x.sum(axis=1) > 1.5).astype("float32")
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dropout(0.2), keras.layers.Dense(1, activation="sigmoid")])
model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
def batches(x, y, n):
    while True:
        for start in range(0, len(x) - n + 1, n):
            yield x[start:start + n], y[start:start + n]
"""


@pytest.fixture
def fit_shell(shell):
    assert shell.run_cell(SETUP).success
    return shell


def run(shell, source):
    result = shell.run_cell(source)
    return result


def weights(shell):
    return [w.copy() for w in shell.user_ns["model"].get_weights()]


def test_compare_is_fair_with_numpy_and_shuffling(fit_shell):
    result = run(fit_shell, f"%%lms_fit --compare -q -o {LMS_ON_CPUS}\n"
                            "history = model.fit(x, y, batch_size=16, epochs=2, shuffle=True, verbose=0)")
    assert result.success, result.error_in_exec
    no_lms, lms = result.result.variants
    assert (no_lms.name, lms.name) == ("no_lms", "lms")
    assert no_lms.steps == lms.steps == 32
    assert lms.history["loss"] == no_lms.history["loss"]  # bit-identical, as the README says
    assert lms.swapped_bytes_per_step > 0 and no_lms.swapped_bytes_per_step == 0


@pytest.mark.parametrize("pipeline, fair", [
    (".shuffle(96).batch(16).repeat()", False),
    (".shuffle(96, seed=7).batch(16).repeat()", False),  # a seed alone does not fix the order of each pass
    (".shuffle(96, seed=7, reshuffle_each_iteration=False).batch(16).repeat()", True),
    (".batch(16).repeat()", True),
])
def test_compare_on_a_tf_data_pipeline_is_fair_or_says_why_not(fit_shell, pipeline, fair):
    """The issue's case: a reshuffling pipeline gave final losses 0.1735 and 0.1498, with no word."""
    fit_shell.run_cell(f"data = tf.data.Dataset.from_tensor_slices((x, y)){pipeline}" if "tf" in fit_shell.user_ns
                       else f"import tensorflow as tf\ndata = tf.data.Dataset.from_tensor_slices((x, y)){pipeline}")
    result = run(fit_shell, "%%lms_fit --compare -q -o --n-tensors 0\n"
                            "model.fit(data, steps_per_epoch=16, epochs=2, verbose=0)")
    assert result.success, result.error_in_exec
    no_lms, lms = result.result.variants
    notes = [note for note in result.result.notes if "new order for each pass" in note]
    if fair:
        assert no_lms.history["loss"] == pytest.approx(lms.history["loss"], rel=1e-6)
        assert not notes
    else:
        assert no_lms.history["loss"] != pytest.approx(lms.history["loss"], rel=1e-6)
        assert len(notes) == 1 and "reshuffle_each_iteration=False" in notes[0] and "pass arrays" in notes[0]
        assert "new order for each pass" in Dashboard(result.result).summary
        assert "new order for each pass" in str(result.result)


def test_callbacks_with_state_start_each_variant_as_in_a_plain_run(fit_shell, tmp_path, capsys):
    """ModelCheckpoint(save_best_only) kept the first variant's best, so the second saved nothing."""
    fit_shell.user_ns["path"] = str(tmp_path / "best.weights.h5")
    result = run(fit_shell, f"%%lms_fit --compare -o {LMS_ON_CPUS}\n"
                            "checkpoint = keras.callbacks.ModelCheckpoint(path, monitor='loss', save_best_only=True, "
                            "save_weights_only=True, verbose=1)\n"
                            "plateau = keras.callbacks.ReduceLROnPlateau(monitor='loss', patience=0, min_delta=10.0)\n"
                            "stop = keras.callbacks.EarlyStopping(monitor='loss', patience=1, min_delta=10.0)\n"
                            "model.fit(x, y, batch_size=16, epochs=4, verbose=0, callbacks=[checkpoint, plateau, stop])")
    assert result.success, result.error_in_exec
    out = capsys.readouterr().out
    firsts = re.findall(r"Epoch 1: loss improved from (?:None|inf) to", out)  # None from Keras 3.15, inf before
    assert len(firsts) == 2, out  # each variant's first epoch is its first best
    no_lms, lms = result.result.variants
    assert no_lms.steps == lms.steps == 32  # EarlyStopping stopped both after epoch 2
    assert no_lms.history["loss"] == pytest.approx(lms.history["loss"], rel=1e-6)  # the same learning rates
    assert no_lms.history["learning_rate"] == lms.history["learning_rate"]


def test_the_cell_gets_the_lms_variants_values(fit_shell):
    start = weights(fit_shell)
    result = run(fit_shell, f"%%lms_fit --compare -q -o {LMS_ON_CPUS}\n"
                            "history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)\nfinal = history.history")
    lms = result.result.variants[1]
    assert fit_shell.user_ns["final"]["loss"] == lms.history["loss"]
    assert any(not np.array_equal(a, b) for a, b in zip(start, weights(fit_shell)))
    assert "fit" not in keras.Model.__dict__ and "fit_generator" not in keras.Model.__dict__


def test_legacy_fit_generator_with_a_replayed_one_shot_generator(fit_shell):
    result = run(fit_shell, f"%%lms_fit --compare -q -o {LMS_ON_CPUS}\n"
                            "history = model.fit_generator(batches(x, y, 8), steps_per_epoch=16, epochs=2, verbose=0)")
    assert result.success, result.error_in_exec
    no_lms, lms = result.result.variants
    assert no_lms.steps == lms.steps == 32
    assert no_lms.history["loss"] == lms.history["loss"]
    assert lms.lms_stats["swapped_tensors"] > 0  # the batch size was learned from the generator
    assert no_lms.samples_per_s and no_lms.batch_size == 8


def test_steps_limits_each_variant(fit_shell):
    result = run(fit_shell, f"%%lms_fit --compare --steps 5 -q -o {LMS_ON_CPUS}\n"
                            "model.fit(x, y, batch_size=16, epochs=3, verbose=0)")
    assert [v.steps for v in result.result.variants] == [5, 5]


class OutOfMemoryIn(keras.callbacks.Callback):
    """Raises TensorFlow's OOM error in the chosen variants, recognised by the LMS callback's presence."""

    def __init__(self, variant):
        super().__init__()
        self.variant = variant

    def on_train_batch_end(self, batch, logs=None):
        has_lms = any(type(c).__name__ == "LMS" for c in self._callbacks)
        if batch == 2 and self.variant == ("lms" if has_lms else "no_lms"):
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")


def install_oom(shell, variant):
    shell.user_ns["oom"] = OutOfMemoryIn(variant)
    original = keras.callbacks.CallbackList.__init__

    def init(self, callbacks=None, *args, **kwargs):
        original(self, callbacks, *args, **kwargs)
        for callback in self.callbacks:
            if isinstance(callback, OutOfMemoryIn):
                callback._callbacks = self.callbacks

    return original, init


@pytest.mark.parametrize("variant", ["no_lms", "lms"])
def test_out_of_memory_in_one_variant_is_caught_and_the_other_runs(fit_shell, variant, monkeypatch, capsys):
    original, init = install_oom(fit_shell, variant)
    monkeypatch.setattr(keras.callbacks.CallbackList, "__init__", init)
    start = weights(fit_shell)
    result = run(fit_shell, f"%%lms_fit --compare -o {LMS_ON_CPUS}\n"
                            "history = model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[oom])")
    assert result.success, result.error_in_exec
    statuses = {v.name: v.status for v in result.result.variants}
    other = "lms" if variant == "no_lms" else "no_lms"
    assert statuses == {variant: "oom", other: "ok"}
    out = capsys.readouterr().out
    assert "ran out of memory" in out and "--budget" in out
    if variant == "lms":  # the model is put back as before the call, not left half-trained
        assert all(np.array_equal(a, b) for a, b in zip(start, weights(fit_shell)))
    assert "oom" in str(result.result)
    # the dashboard says it, and draws no bars for the variant that ran out
    dashboard = Dashboard(result.result)
    if variant == "no_lms":
        assert dashboard.headline.startswith("LMS: without LMS: out of memory; with LMS it trained, ")
    else:
        assert dashboard.headline.startswith("LMS: out of memory (")
    bars = {trace.name: list(trace.x) for trace in dashboard.figures[0].data}
    assert [name for name in bars if name.endswith(": OOM")] == [f"{variant}: OOM"]
    assert not [x for x in bars[f"{variant}: OOM"] if x != "predicted device peak"]


def test_user_exception_propagates_and_restores_the_model(fit_shell, no_new_threads):
    start = weights(fit_shell)
    result = run(fit_shell, f"%%lms_fit -q {LMS_ON_CPUS}\n"
                            "model.fit(x, y, batch_size=16, epochs=1, verbose=0)\nraise KeyError('after fit')")
    assert isinstance(result.error_in_exec, KeyError)
    assert all(np.array_equal(a, b) for a, b in zip(start, weights(fit_shell)))
    assert "fit" not in keras.Model.__dict__


class Interrupt(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 3:
            raise KeyboardInterrupt


def test_keyboard_interrupt_restores_and_leaves_no_thread(fit_shell, no_new_threads):
    fit_shell.user_ns["interrupt"] = Interrupt()
    start = weights(fit_shell)
    result = run(fit_shell, f"%%lms_fit --compare -q {LMS_ON_CPUS}\n"
                            "model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[interrupt])")
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert all(np.array_equal(a, b) for a, b in zip(start, weights(fit_shell)))
    assert run(fit_shell, "plain = model.fit(x, y, batch_size=16, epochs=1, verbose=0)").success
    assert "train_step" not in fit_shell.user_ns["model"].__dict__


def test_quiet_prints_nothing_and_o_returns_a_full_result(fit_shell, capsys, tmp_path):
    result = run(fit_shell, f"%%lms_fit --compare -q -o {LMS_ON_CPUS}\nmodel.fit(x, y, batch_size=16, epochs=1, verbose=0)")
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
    result.result.save_html(page)
    text = page.read_text()
    assert "lms - no_lms" in text and text.count('class="plotly-graph-div"') == 4


@pytest.mark.parametrize("options, words", [("--lb 0", "--lb must be"), ("--steps 0", "--steps must be"),
                                            ("--budget lots", "--budget: not a memory size"),
                                            ("--n-tensors -5", "--n-tensors must be"),
                                            ("-i inf", "positive, finite number of seconds"),
                                            ("--device banana", "--device 'banana' is not a device of this "
                                                                "process, which has /CPU:0, /CPU:1"),
                                            ("--host-device /GPU:3", "--host-device '/GPU:3' is not a device")])
def test_bad_options_are_usage_errors(fit_shell, options, words):
    from IPython.core.error import UsageError

    result = run(fit_shell, f"%%lms_fit {options}\nnot_run = 1")
    assert isinstance(result.error_in_exec, UsageError) and words in str(result.error_in_exec)
    assert "not_run" not in fit_shell.user_ns


def test_a_cell_without_fit_says_so(fit_shell, capsys):
    result = run(fit_shell, "%%lms_fit -o\nvalue = 3")
    assert result.result.calls == [] and "called no fit" in str(result.result)


def test_dashboard_leads_with_what_lms_bought_and_shows_both_variants(fit_shell, tmp_path):
    result = run(fit_shell, f"%%lms_fit --compare -q -o {LMS_ON_CPUS}\nmodel.fit(x, y, batch_size=16, epochs=1, verbose=0)")
    dashboard = Dashboard(result.result)
    no_lms, lms = result.result.variants
    stats = lms.lms_stats
    saved = round((stats["device_peak_bytes"] - stats["device_peak_bytes_without_lms"])
                  / stats["device_peak_bytes_without_lms"] * 100)
    assert dashboard.headline.startswith(f"LMS: predicted device peak {saved:+d}% (")
    assert "final loss identical" in dashboard.headline and "step time " in dashboard.headline
    assert f"{lms.final('loss'):.6f}" in dashboard.summary and "lms - no_lms" in dashboard.summary
    bars, makeup, training, memory = dashboard.figures
    assert [t.name for t in bars.data] == ["no_lms", "lms"]
    assert list(bars.data[1].x)[-1] == "predicted device peak"
    assert bars.data[1].y[-1] < bars.data[0].y[-1]  # LMS's predicted device peak is the lower one
    assert sum(t.y[0] for t in makeup.data) > sum(t.y[1] for t in makeup.data)  # stacked: without, with
    assert [t.name for t in training.data] == ["no_lms: loss", "lms: loss"]
    assert len(training.data[1].y) == lms.steps
    assert {t.name for t in memory.data} >= {"no_lms: host RSS", "lms: host RSS"}
    assert not bars.layout.shapes  # no budget asked for, no budget line
    lms.lms_stats["budget_bytes"] = 3 * 2**20
    assert [shape.y0 for shape in Dashboard(result.result).figures[0].layout.shapes] == [3.0]
    # plain outputs (no widget), visible in exported HTML: the headline first, every figure with an HTML form
    bundles = dashboard.bundles()
    assert html.escape(dashboard.headline) in bundles[0]["text/html"]
    assert all("text/html" in b and "application/vnd.plotly.v1+json" in b for b in bundles[1:-1])
    result.result.save_html(tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert page.count('class="plotly-graph-div"') == 4
    assert page.count("<script") >= 5 and 'src="https://cdn.plot.ly' not in page  # plotly.js inline: opens offline


def test_one_run_trains_as_a_plain_fit_from_the_users_random_state(fit_shell):
    """Without --compare there is one run: it draws from the user's random state (shuffling, dropout) as the
    plain fit would, and leaves that state where the plain fit would."""
    assert run(fit_shell, "def fresh():\n    keras.utils.set_random_seed(0)\n    m = keras.models.clone_model(model)\n"
                          "    m.compile('adam', 'binary_crossentropy')\n    keras.utils.set_random_seed(5)\n"
                          "    return m").success
    outcomes = []
    for magic in ("", f"%%lms_fit -q {LMS_ON_CPUS}\n"):
        assert run(fit_shell, "m = fresh()").success
        assert run(fit_shell, magic + "h = m.fit(x, y, batch_size=16, epochs=2, shuffle=True, verbose=0)").success
        assert run(fit_shell, "after = np.random.rand()").success
        outcomes.append((fit_shell.user_ns["h"].history["loss"], fit_shell.user_ns["after"]))
    (plain_loss, plain_after), (lms_loss, lms_after) = outcomes
    assert lms_loss == plain_loss
    assert lms_after == plain_after
