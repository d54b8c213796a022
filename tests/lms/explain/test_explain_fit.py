"""explain_fit on TensorFlow: the step's peak explained by kind and by layer, and the largest batch each way of
training fits, without training (sizing/explain_fit.py, lms/explain/replay.py)."""

import numpy as np
import pytest

from lms_magic import LMS, explain_fit
from lms_magic.lms.core.plan import CAPACITY_HEADROOM, usable_bytes
from lms_magic.lms.explain.replay import LMS_MARGIN
from lms_magic.units import parse_bytes
from lms_magic.lms.train_function import LmsTrainFunction
from lms_magic.tuning.session import TuningSession
from tests.conftest import DEVICES
from tests.models import images, reference_cnn_small

OPTIONS = {"min_bytes": 0, "device": DEVICES.accelerator, "host_device": DEVICES.host}
BATCH = 32


def capacity_between(session) -> int:
    """A device where batch BATCH fits with every candidate swapped and not without LMS."""
    plain, lowest = (session.predictor.predict(n, 1, BATCH).peak_bytes for n in (0, -1))
    return int((plain + lowest) / 2 / 0.8)


def test_the_peak_is_told_by_kind_and_by_the_layers_that_hold_it(devices):
    model = reference_cnn_small()
    found = explain_fit(model, images(64, 32), batch_size=BATCH, capacity="1GiB", modes=("without LMS",), **OPTIONS)
    peak = found.peak
    assert peak["bytes"] == sum(peak["by_kind"].values()) == found.modes[0].peak_bytes
    weights = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    assert peak["by_kind"]["weights"] == weights
    # the layers: the step's own tensors (the weights and optimizer state apart), largest first, the convolutions
    step_bytes = peak["bytes"] - peak["by_kind"]["weights"] - peak["by_kind"]["optimizer_state"]
    held = [row["bytes"] for row in peak["layers"]]
    assert held == sorted(held, reverse=True) and 0 < sum(held) <= step_bytes
    assert all(row["layer"].startswith("conv2d") for row in peak["layers"][:5]), peak["layers"]
    assert sum(held) > step_bytes / 2  # the ten layers hold most of the step's bytes
    text = str(found)
    assert f"batch {BATCH}" in text and peak["layers"][0]["layer"] in text and "activations kept" in text
    assert found.modes[0].fits and found.suggestion == ""  # 1 GiB holds it


def test_explaining_leaves_the_garbage_collector_as_it_was_even_when_it_fails(devices):
    """explain_fit pauses Python's collector while it traces and replays (a full collection walks the whole
    process): on after it, off where the user had it off, on after an error."""
    import gc

    model = reference_cnn_small()
    explain_fit(model, images(64, 32), batch_size=BATCH, capacity="1GiB", modes=("without LMS",), **OPTIONS)
    assert gc.isenabled()
    with pytest.raises(ValueError):  # data the model cannot take: the trace fails
        explain_fit(model, (np.zeros((8, 7), "float32"), np.zeros(8)), batch_size=4, capacity="1GiB", **OPTIONS)
    assert gc.isenabled()
    gc.disable()
    try:
        explain_fit(model, images(64, 32), batch_size=BATCH, capacity="1GiB", modes=("without LMS",), **OPTIONS)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_largest_batches_are_where_the_predictions_cross_the_device(devices):
    model = reference_cnn_small()
    data = images(64, 32)
    session = TuningSession(model, data, BATCH, **OPTIONS)
    capacity = capacity_between(session)
    found = explain_fit(model, data, batch_size=BATCH, capacity=capacity,
                        modes=("without LMS", "LMS", "LMS, recompute"), **OPTIONS)
    usable = usable_bytes(capacity)
    assert found.usable_bytes == usable
    plain, lms, recompute = found.modes
    # the capacity given is not the device's: each line carries the budget LMS is to plan for
    assert plain.fits is False and lms.fits is True and found.suggestion.startswith("%%lms_fit --budget ")
    assert plain.largest_batch < BATCH < lms.largest_batch
    # each largest batch is the edge: predicted within the device there, above it one sample more
    assert session.predictor.predict(0, 1, plain.largest_batch).peak_bytes <= usable
    assert session.predictor.predict(0, 1, plain.largest_batch + 1).peak_bytes > usable
    # with LMS, the edge of the budget LMS is told, less the share its own plan may differ by
    within = int(parse_bytes(lms.magic.rsplit(" ", 1)[1]) * (1 - LMS_MARGIN))
    plan_for = int(within / (1 - CAPACITY_HEADROOM))
    for batch, fits in ((lms.largest_batch, True), (lms.largest_batch + 1, False)):
        assert (session.predictor.planned(1, batch, plan_for).peak_bytes <= within) is fits
    session.set_options(recompute="only")
    assert session.predictor.planned(1, recompute.largest_batch, plan_for).peak_bytes <= within
    assert session.predictor.planned(1, recompute.largest_batch + 1, plan_for).peak_bytes > within
    assert recompute.magic == f"%%lms_fit --recompute only --budget {lms.magic.rsplit(' ', 1)[1]}" and lms.step_ratio >= 1.0
    assert usable - 2**20 < parse_bytes(lms.magic.rsplit(" ", 1)[1]) <= usable
    figures = found.to_dict()
    assert figures["modes"][1]["largest_batch"] == lms.largest_batch and figures["capacity_bytes"] == capacity
    from lms_magic.ui.explain_html import explanation_html

    page = explanation_html(found)
    assert "%%lms_fit" in page and str(lms.largest_batch) in page


def test_a_device_that_fits_no_batch_any_way_says_so(devices):
    found = explain_fit(reference_cnn_small(), images(64, 32), batch_size=BATCH, capacity="256KiB",
                        modes=("without LMS", "LMS"), confirm=False, **OPTIONS)
    assert [mode.largest_batch for mode in found.modes] == [0, 0] and not found.suggestion
    assert f"no way predicted to train batch {BATCH}: no batch fits this device any way looked at" in str(found)


def test_the_largest_batch_without_lms_trains_within_the_device(simulated):
    """What a fit then confirms: TensorFlow's allocator at the largest batch found stays within the device. The
    replay alone misses some of what the allocator holds (a fit at its largest batch held 0.86-1.02 of this
    device); the step explain_fit measures on the device closes the gap."""
    import tensorflow as tf

    model = reference_cnn_small()
    data = images(256, 32)
    capacity = capacity_between(TuningSession(model, data, BATCH, **OPTIONS))
    found = explain_fit(model, data, batch_size=BATCH, capacity=capacity, modes=("without LMS",), **OPTIONS)
    assert found.correction is not None and found.correction.measured_bytes > 0, found.unmeasured
    largest = found.modes[0].largest_batch
    device = DEVICES.accelerator.strip("/")
    with tf.device(DEVICES.accelerator):
        model.fit(*data, batch_size=largest, epochs=1, verbose=0, shuffle=False)
        tf.config.experimental.reset_memory_stats(device)
        before = tf.config.experimental.get_memory_info(device)["current"]  # other tests' tensors too
        model.fit(*data, batch_size=largest, epochs=1, verbose=0, shuffle=False)
        peak = tf.config.experimental.get_memory_info(device)["peak"]
    assert peak - before <= capacity, (found.correction, largest)


def test_the_frontier_gives_each_way_at_each_batch_and_the_largest_at_speed(devices):
    model = reference_cnn_small()
    data = images(64, 32)
    capacity = capacity_between(TuningSession(model, data, BATCH, **OPTIONS))
    sizes = (8, 16, 32, 64)
    found = explain_fit(model, data, batch_size=BATCH, capacity=capacity, modes=("without LMS", "LMS"),
                        batch_sizes=sizes, **OPTIONS)
    assert [(p.batch_size, p.mode) for p in found.frontier] == [(b, m) for m in ("without LMS", "LMS") for b in sizes]
    plain = [p.peak_bytes for p in found.frontier if p.mode == "without LMS"]
    assert plain == sorted(plain) and len(set(plain)) == len(plain)  # more samples, more memory
    # with LMS, the plan moves what the device needs: never above without it
    assert all(p.peak_bytes <= plain[sizes.index(p.batch_size)] for p in found.frontier if p.mode == "LMS")
    for mode in found.modes:
        points = [p for p in found.frontier if p.mode == mode.mode]
        assert all(p.fits == (p.batch_size <= mode.largest_batch) for p in points)  # the same edge as the search
    best = found.largest_at_speed()
    assert best.fits and best.step_ratio <= 1 / 0.9
    assert best.batch_size == max(p.batch_size for p in found.frontier if p.fits and p.step_ratio <= 1 / 0.9)
    assert "frontier" in str(found) and f"{best.batch_size}, {best.mode}" in str(found)
    from lms_magic.ui.explain_html import explanation_html
    from lms_magic.ui.plots import frontier_figure

    figure = frontier_figure(found)  # a line a way, the usable memory dashed
    assert [trace.name for trace in figure.data] == ["without LMS", "LMS"]
    assert list(figure.data[0].x) == list(sizes) and figure.layout.shapes[0].line.dash == "dash"
    assert "Plotly.newPlot" in explanation_html(found)
    with pytest.raises(ValueError, match="speed_target"):
        explain_fit(model, data, batch_size=BATCH, capacity=capacity, speed_target=90, **OPTIONS)


def test_lean_ops_on_a_model_without_batch_normalization_is_traced_once(devices, monkeypatch):
    """lean_ops changes BatchNormalization's gradient only: on a model without one its step is the step with LMS
    alone, traced once for both, with the same figures."""
    from lms_magic.lms.tensorflow.predictor import TensorFlowStepPredictor

    traced = []
    trace = TensorFlowStepPredictor._trace
    monkeypatch.setattr(TensorFlowStepPredictor, "_trace", lambda self, batch: traced.append(self.lean_ops) or trace(self, batch))
    found = explain_fit(reference_cnn_small(), images(64, 32), batch_size=BATCH, capacity="4MiB",
                        modes=("LMS", "LMS, lean_ops"), batch_sizes=(16, 64), **OPTIONS)
    assert traced == [False]
    lms, lean = found.modes
    assert (lms.peak_bytes, lms.largest_batch, lms.step_ratio) == (lean.peak_bytes, lean.largest_batch, lean.step_ratio)
    assert [(p.peak_bytes, p.fits) for p in found.frontier if p.mode == "LMS"] == \
        [(p.peak_bytes, p.fits) for p in found.frontier if p.mode == "LMS, lean_ops"]
    assert lean.note and not lms.note and lean.note in str(found)  # and the user is told why they are the same
    import html

    from lms_magic.ui.explain_html import explanation_html

    assert html.escape(lean.note) in explanation_html(found)


def test_an_lms_fit_that_runs_out_of_memory_says_why_above_the_error(devices, capsys):
    """In plain Python, with LMS() in the callbacks: a step that runs out of device memory (a layer asking for 1 TiB)
    prints what filled it, then TensorFlow's error comes through unchanged."""
    import keras
    import tensorflow as tf

    class RunsOutOfMemory(keras.layers.Layer):
        def call(self, x):  # a real allocation the device cannot make: 1 TiB, at run time
            return x + 0.0 * tf.reduce_sum(tf.random.uniform([2**38]))

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                              RunsOutOfMemory(), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [w.copy() for w in model.get_weights()]
    lms = LMS(**OPTIONS)
    with pytest.raises(tf.errors.ResourceExhaustedError):
        model.fit(*images(32, 32), batch_size=16, epochs=1, verbose=0, callbacks=[lms])
    out = capsys.readouterr().out
    assert "ran out of device memory" in out and "batch 16" in out, out
    assert "the layers holding the most at the peak: runs_out_of_memory 1024.00 GiB" in out  # what filled it
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert not LmsTrainFunction.is_in(model)


def test_an_out_of_memory_whose_data_cannot_be_read_again_says_so_and_what_to_run(devices):
    """Above an out-of-memory error of a fit whose data cannot be read again (here none was given), one line: why
    there is no account, and the call that gives one."""
    from lms_magic.lms.explain.account import explain_out_of_memory

    said = explain_out_of_memory(reference_cnn_small(), (), {})
    assert said == ("lms_magic: the fit ran out of device memory; its data could not be read again (the fit was "
                    "given no data). lms_magic.explain_fit(model, data, batch_size=...) says what filled the step "
                    "and the largest batch each way of training fits")


def test_a_fit_too_short_to_pay_for_a_retrace_is_predicted_with_the_first_steps_swaps_as_lms_keeps_them(
        devices, copies_costing):
    """LMS's first step on TensorFlow swaps every eligible tensor; where their extra copies over the fit's steps
    left cost less than a retrace, they stand (less memory, slower steps), else the plan is traced. Told the fit's
    length, explain_fit predicts the step that fit keeps: over a link where those copies cost a sixth of the step's
    compute more than the plan's, a fit of 2 steps the first step's, one of 3 million the plan's (as for a fit of
    unknown length). LMS's fits of
    those lengths do the same, at about the same figure, and the short fit's choice is not reused by the long one."""
    import gc

    import keras
    import tensorflow as tf

    model, (x, y) = reference_cnn_small(), images(2 * BATCH, 32)
    session = TuningSession(model, (x, y), BATCH, **OPTIONS)
    capacity = capacity_between(session)
    copies_costing(session, BATCH, OPTIONS["device"], 0.5)

    def lms_way(**fit):
        return explain_fit(model, (x, y), batch_size=BATCH, capacity=capacity, modes=("LMS",), **OPTIONS,
                           **fit).modes[0]

    short, long = lms_way(epochs=1), lms_way(epochs=3, steps_per_epoch=10**6)
    assert short.peak_bytes < long.peak_bytes == lms_way().peak_bytes
    assert short.step_ratio > long.step_ratio  # more copies a step

    class StopAfterTwo(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.model.stop_training = batch >= 1

    budget = short.magic.partition("--budget ")[2]
    short_fit, long_fit = (LMS(budget=budget, verbose=0, **OPTIONS) for _ in range(2))
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, callbacks=[short_fit])
    repeated = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()
    model.fit(repeated, epochs=3, steps_per_epoch=10**6, verbose=0, callbacks=[long_fit, StopAfterTwo()])
    kept, planned = short_fit.stats, long_fit.stats
    assert any("swaps stand" in note for note in kept.notes) and kept.swapped_tensors > planned.swapped_tensors > 0, \
        "\n".join(kept.notes + planned.notes)
    gc.collect()  # the stopped fit's epoch generator holds its tf.data iterator (and buffers) until collected
    for way, stats in ((short, kept), (long, planned)):
        assert abs(way.peak_bytes / stats.device_peak_bytes - 1) < 0.05, (way.peak_bytes, stats.device_peak_bytes)
