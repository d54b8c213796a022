"""Tuning LMS on a real Keras model: autotune within a budget, trials that run out of memory (tuning/session.py)."""

import functools
import gc
import os

import numpy as np
import pytest
import tensorflow as tf

from lms_magic.lms.core.autotune import Setting, grid_search
from lms_magic.tuning.session import TuningSession, autotune
from tests.conftest import DEVICES, state_of
from tests.models import reference_cnn_small

OPTIONS = {"min_bytes": 0, "device": DEVICES.accelerator, "host_device": DEVICES.host}


def assert_same_state(before, model):
    after = state_of(model)
    assert len(before) == len(after)
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)


def test_autotune_on_a_real_model_fits_the_budget_in_fewer_trials_than_the_grid(tuning_data):
    """Every grid setting is measured once; autotune's trials reuse those measurements (same setting, same
    data, same start). How close its best comes to the grid's is a timing question, answered by
    benchmarks/lms_tune.py (on 2 shared cores the step times of neighbouring settings differ by less than
    their noise, and an assertion on them failed in CI runs): here, what does not depend on timing."""
    tuning_session = TuningSession(reference_cnn_small(), tuning_data, batch_size=16, steps=2, **OPTIONS)
    count = tuning_session.predictor.predict(-1, 1, 16).candidates
    n_values, lb_values = [0, count // 3, 2 * count // 3, count], [1, 2]
    plain = tuning_session.predictor.predict(0, 1, 16)
    tuning_session.set_budget(plain.peak_bytes - (plain.peak_bytes - tuning_session.predictor.predict(-1, 1, 16).peak_bytes) // 3)
    measure = functools.cache(tuning_session.measure)  # one measured trial per setting, shared by both searches
    grid = grid_search([Setting(n, lb, 16) for n in n_values for lb in lb_values], measure, tuning_session.budget_bytes)
    found = tuning_session.autotune(max_trials=20, n_values=n_values, lb_values=lb_values, measure=measure)
    assert found.best is not None and found.best.peak_bytes <= tuning_session.budget_bytes
    assert found.measured_trials < len(n_values) * len(lb_values), found.measured_trials
    fitting = [trial for trial in found.trials if trial.status == "ok" and trial.peak_bytes <= tuning_session.budget_bytes]
    assert found.best.step_s == min(trial.step_s for trial in fitting)  # the fastest it measured that fits
    assert found.best.step_s in [trial.step_s for trial in grid.trials]  # measured once, shared with the grid


def test_autotune_skips_an_out_of_memory_trial_and_keeps_the_weights(tuning_data, monkeypatch):
    model = reference_cnn_small()
    model.fit(*tuning_data, batch_size=16, epochs=1, verbose=0)  # an optimizer with state, not a fresh one
    before = state_of(model)
    real_fit = type(model).fit

    def fit_without_lms_runs_out_of_memory(*args, callbacks=(), **kwargs):
        if not any(type(c).__name__ == "LMS" for c in callbacks):
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape [16,32,32,32]")
        return real_fit(model, *args, callbacks=callbacks, **kwargs)

    monkeypatch.setattr(model, "fit", fit_without_lms_runs_out_of_memory, raising=False)
    found = autotune(model, tuning_data, max_trials=4, batch_size=16, steps=2, **OPTIONS)
    assert found.trials[0].setting.n_tensors == 0 and found.trials[0].status == "oom"
    assert found.best is not None and found.best.setting.n_tensors > 0
    assert_same_state(before, model)


def native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts the process's threads in Linux's /proc")
def test_trials_leave_no_threads_behind(tuning_data):
    """Each trial's fit is freed when the trial ends, its tf.data iterators' threads too, with Python's collector
    off: a fit stopped at its last step leaves Keras's epoch generator in a cycle with its iterator, which only a
    full collection frees (a tuning test's trials then held 38 more threads, and freeing them all at once stalled
    it for seconds; a full collection after each trial cost seconds in a test worker's large heap)."""
    tuning_session = TuningSession(reference_cnn_small(), tuning_data, batch_size=16, steps=2, **OPTIONS)
    count = tuning_session.predictor.predict(-1, 1, 16).candidates
    tuning_session.measure(Setting(count, 1, 16))  # TensorFlow's own pools start with the first fits
    tuning_session.measure(Setting(0, 1, 16))
    gc.disable()
    try:
        before = native_threads()
        for n_tensors in (0, count // 2, count, count // 2):
            assert tuning_session.measure(Setting(n_tensors, 1, 16)).status == "ok"
        after = native_threads()
    finally:
        gc.enable()
    assert after <= before, (before, after)


def test_a_trial_hides_tensorflows_retracing_advice_and_nothing_else(tuning_data, caplog):
    """Each trial traces the step anew, and after a few TensorFlow advises changing the code that retraces: not
    the user's code, so a trial leaves that warning out; any other warning still shows."""
    import logging

    model = reference_cnn_small()
    real_fit = type(model).fit

    def fit_that_warns(*args, **kwargs):
        tensorflow_log = logging.getLogger("tensorflow")
        tensorflow_log.warning("5 out of the last 13 calls to <function multi_step_on_iterator> triggered "
                               "tf.function retracing. Tracing is expensive")
        tensorflow_log.warning("a warning of the user's own")
        return real_fit(model, *args, **kwargs)

    model.fit = fit_that_warns
    TuningSession(model, tuning_data, batch_size=16, steps=1, **OPTIONS).measure(Setting(0, 1, 16))
    logged = [record.getMessage() for record in caplog.records if record.name == "tensorflow"]
    assert "a warning of the user's own" in logged, logged
    assert not any("triggered tf.function retracing" in message for message in logged), logged
