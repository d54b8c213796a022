"""``%lms_tune`` and ``TuningSession`` on Keras's JAX backend: predictions from the step's jaxpr that are LMS's
own, measured trials from one saved start, autotune within a budget, the knobs JAX does not take refused."""

import numpy as np
import pytest

from lms_magic import LMS
from lms_magic.lms.core.autotune import Setting
from lms_magic.lms.options import OptionError
from lms_magic.tuning.session import TuningSession

from tests.models import small_residual_bn_dropout as residual_bn_dropout


def state_of(model) -> list:
    return [np.array(v.numpy()) for v in model.variables + model.optimizer.variables]


def assert_same_state(before, model):
    after = state_of(model)
    assert len(before) == len(after)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


@pytest.fixture
def session(data):
    return TuningSession(residual_bn_dropout(), data, batch_size=16, steps=2, min_bytes=0)


def test_the_tuner_predicts_the_peaks_lms_plans_by(session, data):
    """What a slider shows is what LMS(n_tensors=N) then reports for the fit, to the byte."""
    model = session.runner.model
    estimates = [session.estimate(Setting(count, 1, 16)) for count in range(session.estimate(
        Setting(-1, 1, 16)).candidates + 1)]
    assert estimates[0].peak_bytes == estimates[0].peak_bytes_without_lms and estimates[0].swapped_bytes_per_step == 0
    assert estimates[-1].peak_bytes < estimates[0].peak_bytes
    assert [e.swapped_bytes_per_step for e in estimates] == sorted(e.swapped_bytes_per_step for e in estimates)
    for count in (2, len(estimates) - 1):
        callback = LMS(n_tensors=count, min_bytes=0, verbose=0)
        model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
        stats = callback.stats
        assert stats.device_peak_bytes == estimates[count].peak_bytes
        assert stats.device_peak_bytes_without_lms == estimates[count].peak_bytes_without_lms
        assert stats.swapped_bytes_per_step == estimates[count].swapped_bytes_per_step
    # the step-time ratio, from XLA's FLOP count before any trial: moving more never predicts a faster step
    ratios = [e.step_ratio for e in estimates]
    assert estimates[0].compute_source == "estimated" and ratios[0] == 1.0 and ratios == sorted(ratios)


def test_a_trial_leaves_the_model_as_it_was_and_says_its_peak_is_predicted(session):
    before = state_of(session.runner.model)
    trial = session.measure(Setting(3, 1, 16))
    assert trial.ok and trial.step_s > 0 and trial.peak_bytes == trial.predicted_peak_bytes
    assert "jaxpr" in session.runner.peak_source and not session.runner.measures_peak
    assert_same_state(before, session.runner.model)
    assert session.estimate(Setting(3, 1, 16)).compute_source == "measured"


def test_autotune_within_a_budget_measures_no_lb_jax_would_not_honour(session):
    lowest, highest = (session.estimate(Setting(count, 1, 16)).peak_bytes for count in (-1, 0))
    session.set_budget((lowest + highest) // 2)
    found = session.autotune(max_trials=3)
    assert found.best is not None and found.best.ok
    assert session.estimate(found.best.setting).peak_bytes <= (lowest + highest) // 2
    assert {trial.setting.lb for trial in found.trials} == {1}
    assert session.lms_call(found.best.setting).startswith(f"LMS(n_tensors={found.best.setting.n_tensors}, lb=1")


def test_options_jax_does_not_take_are_refused_with_why(session, data):
    with pytest.raises(OptionError, match="lean_ops=True: not available on JAX"):
        TuningSession(residual_bn_dropout(), data, batch_size=16, lean_ops=True)
    with pytest.raises(OptionError, match="device='/GPU:0': not used on JAX"):
        TuningSession(residual_bn_dropout(), data, batch_size=16, device="/GPU:0")
    with pytest.raises(OptionError, match="order_backward=True: not available on JAX"):
        session.set_options(order_backward=True)
    assert session.lms_options["order_backward"] is False  # a refused change changes nothing
    session.set_options(recompute="only")
    recomputed = session.predictor.predict(-1, 1, 16)
    assert recomputed.swapped_bytes_per_step == 0 and recomputed.recomputed_bytes_per_step > 0
    assert "recompute='only'" in session.lms_call(Setting(-1, 1, 16))


def test_lms_tune_prints_the_plan_and_autotunes_on_jax(shell, data, capsys):
    shell.user_ns.update(model=residual_bn_dropout(), x=data[0], y=data[1])
    shell.run_line_magic("lms_tune", "model --data (x, y) --batch-size 16 --min-bytes 0")
    printed = capsys.readouterr().out
    assert "LMS's default plan swaps" in printed and "without LMS: peak" in printed and "with the plan: peak" in printed
    found = shell.run_line_magic("lms_tune", "model --data (x, y) --batch-size 16 --min-bytes 0 --autotune "
                                             "--max-trials 2 --steps 2")
    assert found.best is not None and found.measured_trials <= 2


def test_the_widget_disables_the_knobs_jax_does_not_take(session):
    from lms_magic.ui.tuner import Tuner

    tuner = Tuner(session)
    assert tuner.controls["lb"].disabled and tuner.toggles["lean_ops"].disabled
    assert tuner.toggles["order_backward"].disabled and not tuner.toggles["recompute"].disabled
    assert "jaxpr" in tuner.header.value
    tuner.controls["n_tensors"].value = 0
    plain = tuner.estimate.peak_bytes
    tuner.controls["n_tensors"].value = tuner.controls["n_tensors"].max
    assert tuner.estimate.peak_bytes < plain
    with_lms = [trace.y[1] for trace in tuner.makeup_figure.data]
    assert sum(with_lms) == pytest.approx(tuner.estimate.peak_bytes / 2**20)


def test_apply_sets_the_next_lms_fit_on_jax(session, shell, data, capsys):
    from lms_magic.ui.tuner import Tuner

    tune_magics = shell.magics_manager.registry["LmsTuneMagics"]
    tuner = Tuner(session, on_apply=tune_magics.on_apply)
    tuner.controls["n_tensors"].value = 3
    tuner.toggles["recompute"].value = True
    code = tuner.apply()
    assert "LMS(n_tensors=3, lb=1" in code and "recompute='only'" in code and code in capsys.readouterr().out
    shell.user_ns.update(model=session.runner.model, x=data[0], y=data[1])
    result = shell.run_cell_magic("lms_fit", "-q -o --min-bytes 0 --steps 1",
                                  "model.fit(x, y, batch_size=16, verbose=0)")
    stats = result.variants[-1].lms_stats
    assert stats["recomputed_tensors"] == 3 and stats["swapped_tensors"] == 0
    assert stats["device_peak_bytes"] == session.estimate(Setting(3, 1, 16)).peak_bytes


def test_explain_fit_finds_the_largest_batches_on_jax(data):
    """explain_fit on JAX: the peak without LMS as XLA compiles it, what fills it by kind and layer from the jaxpr's
    replay (its parts add up to the replay's peak), the largest batch without LMS and with it at the edge of the
    predictions, and lean_ops said to be unavailable."""
    from lms_magic import explain_fit
    from lms_magic.lms.core.plan import MEASURED_HEADROOM, usable_bytes

    model = residual_bn_dropout()
    session = TuningSession(model, data, batch_size=16, steps=2, min_bytes=0)
    replay, lowest = (session.predictor.predict(n, 1, 16).peak_bytes for n in (0, -1))
    compiled = session.predictor.plain_peak_bytes(16)
    assert 0.8 < compiled / replay < 1.6  # on a CPU XLA fuses little: 1.41 measured, its buffers packed its own way
    capacity = int((compiled + lowest) / 2 / 0.95)
    found = explain_fit(model, data, batch_size=16, capacity=capacity, min_bytes=0)
    without, lms, _, lean = found.modes
    assert found.peak["bytes"] == sum(found.peak["by_kind"].values()) == replay
    assert without.peak_bytes == found.plain_peak_bytes == compiled
    assert found.plain_peak_source == "XLA's compiled figure" and "XLA's compiled figure" in str(found)
    assert found.peak["layers"] and without.fits is False and lms.fits is True and found.suggestion.startswith("%%lms_fit --budget ")
    plain_usable = int(capacity * (1 - MEASURED_HEADROOM))  # XLA's own figure: all but the allocator's share
    assert session.predictor.plain_peak_bytes(without.largest_batch) <= plain_usable
    assert session.predictor.plain_peak_bytes(without.largest_batch + 1) > plain_usable
    assert session.predictor.predict(-1, 1, lms.largest_batch).peak_bytes <= usable_bytes(capacity)
    assert "not available" in lean.unavailable and lean.largest_batch is None


def test_an_lms_step_that_runs_out_of_memory_on_jax_says_why_above_the_error(data, capsys):
    """JAX's out-of-memory error raised inside an LMS step (here once, by a layer, as XLA raises it): the account is
    made on zeros shaped as the batch the step saw, printed above the error, which comes through unchanged."""
    import keras

    class RunsOutOfMemoryOnce(keras.layers.Layer):
        calls_left = None  # calls before the one that fails: fit's symbolic build, then the LMS step's trace

        def call(self, x):
            if RunsOutOfMemoryOnce.calls_left is not None:
                RunsOutOfMemoryOnce.calls_left -= 1
                if RunsOutOfMemoryOnce.calls_left < 0:
                    RunsOutOfMemoryOnce.calls_left = None
                    raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1099511627776 "
                                       "bytes.")
            return x

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input(data[0].shape[1:]), keras.layers.Conv2D(8, 3, activation="relu"),
                              RunsOutOfMemoryOnce(), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    RunsOutOfMemoryOnce.calls_left = 1
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[LMS(min_bytes=0)])
    out = capsys.readouterr().out
    assert "ran out of device memory. Why" in out and "batch 16" in out and "conv2d" in out, out


def test_an_out_of_memory_that_jax_says_after_the_first_lms_step_returned_is_explained(data, capsys, monkeypatch):
    """JAX runs steps asynchronously: on an H200 the error of a step that ran out of memory came when its results
    were read, after the step had returned. LMS waits for its first step, inside the LMS step, so the error is
    explained there (here JAX's wait raises it, as a GPU would)."""
    import jax

    waited = []

    def block_until_ready(values):
        waited.append(values)
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 20.71GiB")

    monkeypatch.setattr(jax, "block_until_ready", block_until_ready)
    with pytest.raises(RuntimeError, match="20.71GiB"):
        residual_bn_dropout().fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[LMS(min_bytes=0)])
    out = capsys.readouterr().out
    assert len(waited) == 1 and "ran out of device memory. Why" in out and "batch 16" in out, out
