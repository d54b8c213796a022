"""Every framework answers the same questions (lms/framework.py), so the callback and the tuner never compare a
backend's name; the options a framework does not honour are said when a fit starts."""

import dataclasses
import inspect

import pytest

from lms_magic.lms.backend import Framework
from lms_magic.lms.framework import NAMES, framework, unsupported_message
from lms_magic.lms.options import LmsOptions


@pytest.mark.parametrize("name", NAMES)
def test_each_framework_answers_every_question_of_the_protocol(name):
    chosen = framework(name)
    assert chosen.name == name and issubclass(chosen, Framework)
    required = ("devices", "prepare", "backend", "trial_device", "trial_peak_source")  # no default in Framework
    assert [member for member in required if member not in vars(chosen)] == []
    fields = {field.name for field in dataclasses.fields(LmsOptions)}
    assert set(chosen.unavailable) <= fields  # each refusal names a real option
    assert all(why.startswith("not ") for why in chosen.unavailable.values())  # and says why
    if name == "tensorflow":  # PyTorch's and JAX's backends are imported and checked so in their own test runs
        assert_a_backend_class(chosen)


def assert_a_backend_class(chosen) -> None:
    """The framework's backend is a class with the train step LMS drives (tests/lms/{torch,jax} call this too)."""
    assert inspect.isclass(chosen.backend()) and hasattr(chosen.backend(), "train_step")


def test_a_backend_lms_does_not_run_on_is_refused_with_what_to_set():
    with pytest.raises(RuntimeError, match="KERAS_BACKEND=jax, torch or tensorflow") as raised:
        framework("numpy")
    assert str(raised.value) == unsupported_message("numpy")


def test_the_tuner_runs_where_it_predicts_and_refuses_with_why_elsewhere():
    assert framework("tensorflow").tuner_refusal is None and framework("jax").tuner_refusal is None
    assert "KERAS_BACKEND=tensorflow or jax" in framework("torch").tuner_refusal


def test_an_option_the_framework_does_not_honour_is_noted_when_the_fit_starts(monkeypatch):
    """The callback reads the framework's table; a framework that does not honour ``lb`` gets a note for lb=3,
    none for the default, and the fit still trains."""
    import keras
    import numpy as np

    from lms_magic import LMS
    from lms_magic.testing.backends import FakeBackends

    tensorflow = framework("tensorflow")
    picky = type("Picky", (tensorflow,), {"unavailable": {"lb": "not honoured here: the test says so"}})
    monkeypatch.setattr("lms_magic.lms.callback.chosen_framework", lambda name=None: picky)
    notes = {}
    for lb in (1, 3):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile("sgd", "mse")
        callback = LMS(lb=lb, device="/CPU:0", verbose=0, backend=FakeBackends())
        model.fit(np.ones((8, 4)), np.ones((8, 2)), epochs=1, verbose=0, callbacks=[callback])
        notes[lb] = callback.stats.notes
    assert "lb=3 is not honoured here: the test says so" in notes[3]
    assert not any("not honoured" in note for note in notes[1])
