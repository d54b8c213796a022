"""%%lms_fit --compare through a real InteractiveShell: each variant from the same start, on the same
batches, measured alike; failures in one variant caught or put back (fit/compare.py, fit/runs.py)."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from lms_magic.ui.dashboard import Dashboard

from tests.conftest import DEVICES

ON_CPUS = DEVICES.magic_options


def weights(shell):
    return [w.copy() for w in shell.user_ns["model"].get_weights()]


def test_compare_is_fair_with_numpy_and_shuffling(fit_shell):
    result = fit_shell.run_cell(f"%%lms_fit --compare -q -o {ON_CPUS}\n"
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
    result = fit_shell.run_cell("%%lms_fit --compare -q -o --n-tensors 0\n"
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
    result = fit_shell.run_cell(f"%%lms_fit --compare -o {ON_CPUS}\n"
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


def test_legacy_fit_generator_with_a_replayed_one_shot_generator(fit_shell):
    result = fit_shell.run_cell(f"%%lms_fit --compare -q -o {ON_CPUS}\n"
                            "history = model.fit_generator(batches(x, y, 8), steps_per_epoch=16, epochs=2, verbose=0)")
    assert result.success, result.error_in_exec
    no_lms, lms = result.result.variants
    assert no_lms.steps == lms.steps == 32
    assert no_lms.history["loss"] == lms.history["loss"]
    assert lms.lms_stats["swapped_tensors"] > 0  # the batch size was learned from the generator
    assert no_lms.samples_per_s and no_lms.batch_size == 8


def test_samples_per_second_count_the_samples_a_step_took_where_the_batch_is_larger_than_the_data(fit_shell):
    result = fit_shell.run_cell(f"%%lms_fit --compare -q -o {ON_CPUS}\n"
                                "model.fit(x[:24], y[:24], batch_size=64, epochs=3, verbose=0)")
    assert result.success, result.error_in_exec
    for variant in result.result.variants:  # one step an epoch, of the 24 samples there are
        assert variant.steps == 3 and variant.batch_size == 24
        assert variant.samples_per_s == pytest.approx(24 / variant.time_per_step_s)


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
    result = fit_shell.run_cell(f"%%lms_fit --compare -o {ON_CPUS}\n"
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
    result = fit_shell.run_cell(f"%%lms_fit -q {ON_CPUS}\n"
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
    result = fit_shell.run_cell(f"%%lms_fit --compare -q {ON_CPUS}\n"
                            "model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[interrupt])")
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert all(np.array_equal(a, b) for a, b in zip(start, weights(fit_shell)))
    assert fit_shell.run_cell("plain = model.fit(x, y, batch_size=16, epochs=1, verbose=0)").success
    assert "train_step" not in fit_shell.user_ns["model"].__dict__


def test_one_run_trains_as_a_plain_fit_from_the_users_random_state(fit_shell):
    """Without --compare there is one run: it draws from the user's random state (shuffling, dropout) as the
    plain fit would, and leaves that state where the plain fit would."""
    assert fit_shell.run_cell("def fresh():\n    keras.utils.set_random_seed(0)\n    m = keras.models.clone_model(model)\n"
                          "    m.compile('adam', 'binary_crossentropy')\n    keras.utils.set_random_seed(5)\n"
                          "    return m").success
    outcomes = []
    for magic in ("", f"%%lms_fit -q {ON_CPUS}\n"):
        assert fit_shell.run_cell("m = fresh()").success
        assert fit_shell.run_cell(magic + "h = m.fit(x, y, batch_size=16, epochs=2, shuffle=True, verbose=0)").success
        assert fit_shell.run_cell("after = np.random.rand()").success
        outcomes.append((fit_shell.user_ns["h"].history["loss"], fit_shell.user_ns["after"]))
    (plain_loss, plain_after), (lms_loss, lms_after) = outcomes
    assert lms_loss == plain_loss
    assert lms_after == plain_after


def _data_iterators_left_by(run) -> tuple[int, int]:
    """tf.data iterators alive before and after three fair runs of a small Dense model made by ``run(start, model,
    data)``, with Python's collector off: what only a later full collection would free."""
    import gc

    from lms_magic.fit.runs import FairStart

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile("sgd", "mse")
    data = (np.ones((80, 8), "float32"), np.ones((80, 4), "float32"))
    start = FairStart(model)
    gc.collect()
    gc.disable()
    try:
        before = sum(isinstance(o, tf.data.Iterator) for o in gc.get_objects())
        for _ in range(3):
            run(start, model, data)
        return before, sum(isinstance(o, tf.data.Iterator) for o in gc.get_objects())
    finally:
        gc.enable()


@pytest.mark.parametrize("epochs", [1, 3])
def test_a_run_stopped_at_its_steps_leaves_no_data_iterator_to_the_collector(epochs):
    """`%%lms_fit --steps` stops Keras's fit at a step: its epoch is closed when it ends, so the data's tf.data
    iterator (and its threads) is freed then, with Python's collector off, not by some later full collection
    that frees many at once and stalls the process for seconds."""
    def stopped(start, model, data):
        outcome = start.run(model.fit, data, {"batch_size": 8, "epochs": epochs, "verbose": 0}, max_steps=2)
        assert outcome.status == "ok" and len(outcome.recorder.step_s) == 2

    before, left = _data_iterators_left_by(stopped)
    assert left == before, (before, left)


def test_a_run_that_raises_leaves_no_data_iterator_to_the_collector():
    """A run ended by an error (out of memory, an interrupt, a user's callback) closes its epoch as it ends, so the
    data's tf.data iterator is freed then, with Python's collector off."""
    class Raises(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise ValueError("a user's callback fails")

    def raising(start, model, data):
        with pytest.raises(ValueError, match="a user's callback fails"):
            start.run(model.fit, data, {"batch_size": 8, "verbose": 0, "callbacks": [Raises()]})

    before, left = _data_iterators_left_by(raising)
    assert left == before, (before, left)
