"""The %lms_tune widget: sliders with instant predictions, Measure, Autotune with Stop, Apply (ui/tuner.py)."""

import asyncio

import pytest

from lms_magic.lms.core.autotune import Setting
from lms_magic.ui.tuner import Tuner
from tests.conftest import DEVICES, state_of
from tests.tuning.test_session import assert_same_state

MIB = 2**20
ACCELERATOR, HOST = DEVICES.accelerator, DEVICES.host


def test_sliders_move_the_prediction_the_right_way(tuning_session):
    tuner = Tuner(tuning_session)
    peaks, ratios = [], []
    for count in range(0, tuner.controls["n_tensors"].max + 1, 2):
        tuner.controls["n_tensors"].value = count
        peaks.append(tuner.estimate.peak_bytes)
        ratios.append(tuner.estimate.step_ratio)
        assert f"{tuner.estimate.peak_bytes / MIB:.1f} MiB" in tuner.prediction_html.value
        assert (f"predicted step time</td><td><b>{tuner.estimate.step_ratio - 1:+.0%}</b> (compute estimated)"
                in tuner.prediction_html.value)
    assert all(later <= earlier for earlier, later in zip(peaks, peaks[1:]))
    # nothing moved costs nothing; more bytes moved never predicts a faster step
    assert ratios[0] == 1.0 and all(later >= earlier for earlier, later in zip(ratios, ratios[1:]))
    assert peaks[-1] < peaks[0]
    swapped = tuner.estimate.swapped_bytes_per_step
    tuner.controls["batch_size"].value = 32
    assert tuner.estimate.peak_bytes > peaks[-1] and tuner.estimate.swapped_bytes_per_step > swapped
    tuner.controls["budget_mib"].value = round(tuner.estimate.peak_bytes / MIB - 1, 1)
    assert tuner.estimate.fits is False and "over the budget" in tuner.prediction_html.value
    tuner.controls["budget_mib"].value = round(tuner.estimate.peak_bytes / MIB + 1, 1)
    assert tuner.estimate.fits is True
    assert tuner.figure.data[0].y[0] == pytest.approx(tuner.estimate.peak_bytes / MIB)
    # the peak's make-up follows the sliders: stacked bars without / with LMS that add up to the predictions
    without, with_lms = ([trace.y[i] for trace in tuner.makeup_figure.data] for i in (0, 1))
    assert sum(without) == pytest.approx(tuner.estimate.peak_bytes_without_lms / MIB)
    assert sum(with_lms) == pytest.approx(tuner.estimate.peak_bytes / MIB)
    assert "the largest tensors" in tuner.top_html.value and tuner.top_html.value.count("<tr>") == 11


def test_measure_adds_a_point_and_leaves_the_model_as_it_was(tuning_session):
    before = state_of(tuning_session.runner.model)
    tuner = Tuner(tuning_session)
    tuner.controls["n_tensors"].value = 6
    trial = tuner.measure()
    assert trial.ok and trial.step_s > 0 and trial.setting == Setting(6, 1, 16)
    assert trial.peak_bytes == pytest.approx(trial.predicted_peak_bytes, rel=0.25)
    assert [t.name for t in tuner.figure.data] == ["prediction (time: lower bound)", "measured"]
    assert tuner.estimate.compute_s is not None  # the bound now includes compute
    assert tuner.estimate.compute_source == "measured" and "(compute measured)" in tuner.prediction_html.value
    assert "not GPU times" in tuner.header.value
    assert_same_state(before, tuning_session.runner.model)


def test_frontier_draws_the_predicted_peak_by_batch_size_against_the_budget(tuning_session):
    tuner = Tuner(tuning_session)
    found = tuner.show_frontier()
    sizes = list(tuner.controls["batch_size"].options)
    assert [p.batch_size for p in found.frontier] == sizes * 2 and found.usable_bytes == pytest.approx(
        tuner.controls["budget_mib"].value * MIB, rel=1e-6)
    assert "frontier:" in tuner.status.value
    assert [trace.name for trace in tuner.frontier_figure.data] == ["without LMS", "LMS"]


def test_the_sliders_say_what_explain_fit_measured_once_it_has(accelerator_memory, tuning_data, devices):
    """The sliders predict from the replay until plain steps of this model are measured on the device; from then on
    (the session already open) every figure is explain_fit's, the measured step's where one ran, and the peak's
    make-up adds up to it; the frontier runs no step and draws the same figures (one model of the device)."""
    from lms_magic import explain_fit
    from lms_magic.tuning.session import TuningSession
    from tests.models import reference_cnn_small

    accelerator_memory("64MiB")  # batch 16 fits: its step is measured
    model = reference_cnn_small()
    options = dict(min_bytes=0, device=devices.accelerator, host_device=devices.host)
    tuner = Tuner(TuningSession(model, tuning_data, batch_size=16, steps=2, **options))
    replayed = tuner.estimate
    assert replayed.measured == "" and "device</td>" not in tuner.prediction_html.value
    found = explain_fit(model, tuning_data, batch_size=16, modes=("without LMS",), batch_sizes=(4, 16),
                        **options)
    measured = {found.correction.batch_size: found.correction.measured_bytes, found.correction.other[0]:
                found.correction.other[1]}
    persistent = tuner.session.persistent_bytes
    frontier = {(point.mode, point.batch_size): point.peak_bytes for point in found.frontier}
    assert 16 in measured, found.correction
    for batch in sorted({4, 16, *measured} & set(tuner.controls["batch_size"].options)):
        tuner.controls["batch_size"].value = batch
        tuner.controls["n_tensors"].value = 0
        assert tuner.estimate.peak_bytes_without_lms == tuner.estimate.peak_bytes
        if batch in measured:  # the allocator's peak of the step measured there
            assert tuner.estimate.peak_bytes_without_lms == persistent + measured[batch], batch
        if ("without LMS", batch) in frontier:
            assert tuner.estimate.peak_bytes_without_lms == frontier["without LMS", batch], batch
    assert "measured: plain steps held" in tuner.estimate.measured and "device</td>" in tuner.prediction_html.value
    tuner.controls["n_tensors"].value = tuner.controls["n_tensors"].max
    stacked = [sum(trace.y[i] for trace in tuner.makeup_figure.data) for i in (0, 1)]
    assert stacked == pytest.approx([tuner.estimate.peak_bytes_without_lms / MIB, tuner.estimate.peak_bytes / MIB])
    # the frontier runs no step and draws the same figures
    fits, fit = [], model.fit
    model.fit = lambda *args, **kwargs: (fits.append(kwargs.get("batch_size")), fit(*args, **kwargs))[1]
    drawn = {(point.mode, point.batch_size): point.peak_bytes for point in tuner.show_frontier().frontier}
    assert fits == [] and drawn["without LMS", 16] == persistent + measured[16], (drawn, measured)


def test_stop_ends_autotune_between_trials(tuning_session):
    tuner = Tuner(tuning_session, max_trials=10)
    trials_seen = []

    async def run():
        task = tuner.start_autotune()
        assert tuner.buttons["Stop"].disabled is False and tuner.buttons["Measure"].disabled is True
        async def first_trial():
            while not tuning_session.trials:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(first_trial(), timeout=120)
        trials_seen.append(len(tuning_session.trials))
        tuner.buttons["Stop"].click()
        await task

    asyncio.run(run())
    result = tuner.search.result()
    assert result.stopped_by == "user" and result.measured_trials <= trials_seen[0] + 1
    assert tuner.buttons["Stop"].disabled is True and tuner.buttons["Autotune"].disabled is False


def test_apply_sets_the_next_lms_fit_and_prints_the_call(tuning_session, shell, tuning_data, capsys):
    fit_magics = shell.magics_manager.registry["LmsFitMagics"]
    tune_magics = shell.magics_manager.registry["LmsTuneMagics"]
    assert tune_magics.on_apply == fit_magics.apply_defaults  # as %lms_tune hands it to its widget
    tuner = Tuner(tuning_session, on_apply=tune_magics.on_apply)
    tuner.controls["n_tensors"].value = 3
    tuner.controls["lb"].value = 2
    code = tuner.apply()
    assert "LMS(n_tensors=3, lb=2" in code and code in capsys.readouterr().out
    shell.user_ns.update(model=tuning_session.runner.model, x=tuning_data[0], y=tuning_data[1])
    shell.run_cell_magic("lms_fit", f"-q --device {ACCELERATOR} --host-device {HOST} --min-bytes 0 --steps 1",
                         "model.fit(x, y, batch_size=16, verbose=0)")
    result = shell.run_cell_magic("lms_fit", f"-q -o --device {ACCELERATOR} --host-device {HOST} --min-bytes 0 "
                                  "--steps 1", "model.fit(x, y, batch_size=16, verbose=0)")
    assert result.variants[-1].lms_stats["swapped_tensors"] == 3


def test_the_toggles_switch_the_predictions_the_trials_and_the_next_lms_fit(tuning_data, devices, shell):
    from lms_magic.lms.tensorflow.predictor import TensorFlowStepPredictor
    from lms_magic.tuning.trials import take_samples
    from lms_magic.tuning.session import TuningSession
    from tests.models import residual_bn_dropout

    fit_magics = shell.magics_manager.registry["LmsFitMagics"]
    model = residual_bn_dropout()
    session = TuningSession(model, tuning_data, batch_size=16, steps=1, min_bytes=0, device=ACCELERATOR,
                            host_device=HOST)
    tuner = Tuner(session, on_apply=fit_magics.apply_defaults)
    tuner.controls["n_tensors"].value = tuner.controls["n_tensors"].max
    keras_prediction = tuner.estimate
    tuner.toggles["lean_ops"].value = True
    lean = TensorFlowStepPredictor(model, take_samples(tuning_data, 2), session.predictor.selection, HOST, lean_ops=True)
    count = tuner.controls["n_tensors"].value
    assert session.predictor.lean_ops and session.runner.options["lean_ops"] is True
    assert tuner.estimate.peak_bytes == lean.predict(count, 1, 16).peak_bytes != keras_prediction.peak_bytes
    assert tuner.measure().ok
    tuner.toggles["order_backward"].value = True
    code = tuner.apply()
    assert "lean_ops=True" in code and "order_backward=True" in code
    assert fit_magics.defaults["lean_ops"] and fit_magics.defaults["order_backward"]
    shell.user_ns.update(model=model, x=tuning_data[0], y=tuning_data[1])
    result = shell.run_cell_magic("lms_fit", f"-q -o --device {ACCELERATOR} --host-device {HOST} --min-bytes 0 "
                                  "--steps 1", "model.fit(x, y, batch_size=16, verbose=0)")
    assert result.variants[-1].lms_stats["lean_layers"] == 3
    fit_magics.apply_defaults(None, 1)  # as a new session starts
    tuner.toggles["lean_ops"].value = tuner.toggles["order_backward"].value = False
    assert tuner.controls["n_tensors"].max == keras_prediction.candidates  # the lean gradient reads fewer
    tuner.controls["n_tensors"].value = tuner.controls["n_tensors"].max
    assert tuner.estimate.peak_bytes == keras_prediction.peak_bytes  # Keras's own again (its trace kept)


def test_recompute_only_predicts_recomputes_without_traffic_and_the_next_lms_fit_recomputes(tuning_data, devices,
                                                                                           shell):
    from lms_magic.lms.options import OptionError
    from lms_magic.tuning.session import TuningSession
    from tests.models import residual_bn_dropout

    fit_magics = shell.magics_manager.registry["LmsFitMagics"]
    model = residual_bn_dropout()
    session = TuningSession(model, tuning_data, batch_size=16, steps=1, min_bytes=0, device=ACCELERATOR,
                            host_device=HOST)
    tuner = Tuner(session, on_apply=fit_magics.apply_defaults)
    swap_candidates = tuner.estimate.candidates
    tuner.toggles["recompute"].value = True
    assert session.predictor.recompute == "only" and session.runner.options["recompute"] == "only"
    tuner.controls["n_tensors"].value = tuner.controls["n_tensors"].max
    estimate = tuner.estimate
    assert 0 < estimate.candidates < swap_candidates  # those a cheap chain can compute again
    assert estimate.swapped_bytes_per_step == 0 and estimate.transfer_s == 0
    assert estimate.peak_bytes < estimate.peak_bytes_without_lms
    assert "nothing over the host link" in tuner.prediction_html.value
    code = tuner.apply()
    assert "recompute='only'" in code and fit_magics.defaults["recompute"] == "only"
    shell.user_ns.update(model=model, x=tuning_data[0], y=tuning_data[1])
    result = shell.run_cell_magic("lms_fit", f"-q -o --device {ACCELERATOR} --host-device {HOST} --min-bytes 0 "
                                  "--steps 1", "model.fit(x, y, batch_size=16, verbose=0)")
    stats = result.variants[-1].lms_stats
    assert stats["recomputed_tensors"] > 0 and stats["swapped_tensors"] == 0
    fit_magics.apply_defaults(None, 1)  # as a new session starts
    with pytest.raises(OptionError, match="takes False or 'only' in %lms_tune"):
        session.set_options(recompute=True)


@pytest.mark.parametrize("package, variable", [("ipywidgets", "LMS_MAGIC_EXPECT_IPYWIDGETS"),
                                               ("IPython", "LMS_MAGIC_EXPECT_IPYTHON")])
def test_the_run_uses_the_versions_it_says(package, variable):
    """`make test-colab` runs these tests with Colab's IPython 7.34 and ipywidgets 7.7.1; `make test` with 9 and 8."""
    import importlib
    import os

    expected = os.environ.get(variable)
    if expected is None:
        pytest.skip("only `make test-colab` says which versions it runs with")
    version = importlib.import_module(package).__version__
    assert version.startswith(expected), version
