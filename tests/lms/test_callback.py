"""The ``LMS`` callback's contract with its backend, driven through a scripted fake (lms_magic/testing/backends.py).

Each test trains a tiny Keras model plainly while the callback drives a fake backend: made once per
fit, entered around every LMS step, told once that the first step ran, closed however the fit
ends; the model left with its own train function and train step; the stats filled from the
backend's report. (tests/lms/tensorflow and tests/lms/torch test the real engines.)
"""

import keras
import numpy as np
import pytest

from lms_magic import LMS
from lms_magic.lms.backend import Action
from lms_magic.testing.backends import FakeBackends, FakeFailure
from lms_magic.lms.train_function import LmsTrainFunction

STEPS = 4  # batches of 8 from 32 rows


def tiny_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,), name="features"), keras.layers.Dense(8, activation="relu", name="hidden"),
                              keras.layers.Dense(1, name="out")])
    model.compile("sgd", "mse")
    return model


def fit(model, callbacks=(), epochs=1):
    rng = np.random.default_rng(0)
    return model.fit(rng.random((8 * STEPS, 4), dtype="float32"), rng.random(8 * STEPS, dtype="float32"),
                     batch_size=8, epochs=epochs, verbose=0, shuffle=False, callbacks=list(callbacks))


def assert_plain(model):
    assert "train_step" not in model.__dict__
    assert not LmsTrainFunction.is_in(model)


class FailAt(keras.callbacks.Callback):
    """Raises ``error`` at the end of batch ``batch``."""

    def __init__(self, batch, error):
        super().__init__()
        self.batch, self.error = batch, error

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            raise self.error


def test_one_backend_per_fit_entered_at_every_step_and_told_once_of_the_first():
    backends = FakeBackends()
    callback = LMS(backend=backends, verbose=0)
    model = tiny_model()
    fit(model, [callback], epochs=2)
    (backend,) = backends.made
    assert backend.events == (["begin", "train_step"] + ["step", "first_step_done", "summary_line"]
                              + ["step"] * (2 * STEPS - 1) + ["close"])
    assert backend.model is model  # and the callback's options, with the devices filled in (no GPU here)
    assert backend.options == callback.options.replace(host_device="/CPU:0")
    assert callback.stats.steps == 2 * STEPS and callback.stats.active
    assert callback.stats.swapped_tensors == 2 and callback.stats.candidates == 4  # the backend's report
    assert_plain(model)


def test_the_same_callback_serves_a_second_fit_from_fresh_stats():
    backends = FakeBackends()
    callback = LMS(backend=backends, verbose=0)
    model = tiny_model()
    fit(model, [callback])
    first = callback.stats
    fit(model, [callback])
    assert len(backends.made) == 2 and callback.stats is not first and callback.stats.steps == STEPS
    assert all(backend.events[-1] == "close" for backend in backends.made)


def test_a_plain_fit_after_an_lms_fit_trains_plainly():
    backends = FakeBackends()
    callback = LMS(backend=backends, verbose=0)
    model = tiny_model()
    fit(model, [callback])
    fit(model)
    assert backends.made[0].events.count("step") == STEPS and callback.stats.steps == STEPS
    assert_plain(model)


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_a_fit_another_callback_ends_leaves_the_model_plain_and_is_closed_by_the_next(error):
    backends = FakeBackends()
    callback = LMS(backend=backends, verbose=0)
    model = tiny_model()
    with pytest.raises(error):
        fit(model, [callback, FailAt(1, error())])
    history = fit(model)  # the next plain fit trains plainly
    assert len(history.history["loss"]) == 1 and backends.made[0].events.count("step") == 2
    assert_plain(model)
    fit(model, [callback])  # Keras tells callbacks nothing of a fit that raised: the next LMS fit closes it
    assert [backend.events.count("close") for backend in backends.made] == [1, 1]


class Interrupting(FakeBackends):
    """Fake backends whose second step is interrupted, as Ctrl-C in the middle of a step would."""

    def __call__(self, model, options, stats):
        backend = super().__call__(model, options, stats)
        entered = backend.step_scope

        def step_scope():
            if backend.events.count("step") == 1:
                raise KeyboardInterrupt
            return entered()

        backend.step_scope = step_scope
        return backend


def test_an_interrupt_inside_a_step_closes_the_backend_at_once():
    backends = Interrupting()
    model = tiny_model()
    with pytest.raises(KeyboardInterrupt):
        fit(model, [LMS(backend=backends, verbose=0)])
    assert backends.made[0].events[-1] == "close"
    assert_plain(model)


@pytest.mark.parametrize("point", ["begin", "train_step", "step", "first_step_done", "summary_line"])
def test_a_backend_that_fails_leaves_the_model_as_it_was(point):
    backends = FakeBackends(fail_at=point)
    model = tiny_model()
    weights = [w.copy() for w in model.get_weights()]
    with pytest.raises(FakeFailure, match=point):
        fit(model, [LMS(backend=backends, verbose=0)])
    if point == "step":  # raised inside the step: closed at once
        assert backends.made[0].events[-1] == "close"
    if point in ("begin", "train_step", "step"):  # before any step ran: not a weight changed
        assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
    assert_plain(model)
    fit(model)  # and it trains plainly


def test_n_tensors_zero_turns_lms_off_without_a_backend():
    backends = FakeBackends()
    callback = LMS(n_tensors=0, backend=backends, verbose=1)
    fit(tiny_model(), [callback])
    assert backends.made == [] and not callback.stats.active and "n_tensors=0" in callback.stats.reason
    assert callback.summary() == "LMS: inactive (n_tensors=0: LMS is off)"


def test_the_summary_is_printed_once_when_training_starts(capsys):
    fit(tiny_model(), [LMS(backend=FakeBackends(), verbose=1)], epochs=2)
    assert capsys.readouterr().out.count("LMS (fake): 2 of 4 tensors") == 1
    fit(tiny_model(), [LMS(backend=FakeBackends(), verbose=0)])
    assert capsys.readouterr().out == ""


def test_names_that_match_no_layer_are_said():
    callback = LMS(include_layers="dense_x", exclude_types=["Conv2d"], backend=FakeBackends(), verbose=0)
    fit(tiny_model(), [callback])
    assert "include_layers names no layer of the model: 'dense_x'" in callback.stats.notes
    assert "exclude_types names no layer type of the model: 'Conv2d'" in callback.stats.notes
    named = LMS(include_layers="hidden", include_types="Dense", backend=FakeBackends(), verbose=0)
    fit(tiny_model(), [named])
    assert not [note for note in named.stats.notes if "names no" in note]


def test_a_backend_that_steps_out_leaves_the_rest_of_the_fit_to_the_models_own_train_function(capsys):
    backends = FakeBackends(actions=[Action.STEP_OUT])
    callback = LMS(backend=backends, verbose=1)
    model = tiny_model()
    fit(model, [callback])
    assert callback.stats.steps == 1 and backends.made[0].events.count("step") == 1  # the rest trained plainly
    assert capsys.readouterr().out.count("LMS (fake)") == 1  # the summary, once
    assert_plain(model)


def test_a_backend_that_replans_gets_its_train_step_again_and_checks_the_next_step(capsys):
    backends = FakeBackends(actions=[Action.RETRACE, Action.KEEP])
    callback = LMS(backend=backends, verbose=1)
    model = tiny_model()
    fit(model, [callback])
    (backend,) = backends.made
    assert backend.events[:8] == ["begin", "train_step", "step", "first_step_done", "train_step", "step",
                                  "first_step_done", "summary_line"]
    assert callback.stats.steps == STEPS and backend.events.count("first_step_done") == 2
    assert capsys.readouterr().out.count("LMS (fake)") == 1  # said once, after the plan that stands
    assert_plain(model)


def test_where_processes_train_together_the_first_prints_and_an_out_of_memory_names_its_process(monkeypatch, capsys):
    from lms_magic.lms import callback as callback_module
    from lms_magic.lms.tensorflow.framework import TensorFlowFramework

    monkeypatch.setattr(TensorFlowFramework, "process", staticmethod(lambda: (1, 2)))
    lms = LMS(backend=FakeBackends(), verbose=1)
    fit(tiny_model(), [lms])
    assert capsys.readouterr().out == "" and lms.stats.swapped_tensors == 2  # process 1 keeps its stats, silent
    monkeypatch.setattr(callback_module, "is_out_of_memory", lambda error: True)
    with pytest.raises(FakeFailure):
        fit(tiny_model(), [LMS(backend=FakeBackends(fail_at="step"), verbose=1)])
    assert "lms_magic: process 1 of 2" in capsys.readouterr().out
    monkeypatch.setattr(TensorFlowFramework, "process", staticmethod(lambda: (0, 2)))
    fit(tiny_model(), [LMS(backend=FakeBackends(), verbose=1)])
    assert "LMS (fake): 2 of 4 tensors" in capsys.readouterr().out
