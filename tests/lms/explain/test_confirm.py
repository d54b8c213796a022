"""The largest batch confirmed by real steps (lms/explain/largest.py, measured.py): the search against a bisection
of real steps, and steps on the simulated accelerator that leave the model as it was."""

import random

import numpy as np
import pytest

from lms_magic.lms.explain.largest import MeasuredStep, confirm_largest


def bisection(fits, limit=1 << 16) -> int:
    """The largest batch a plain bisection of real steps finds (doubling, then halving the gap)."""
    low, high = 0, 1
    while high <= limit and fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def test_the_confirmed_batch_is_the_one_a_bisection_of_real_steps_finds():
    """Devices holding 0.7x to 1.5x what the replay predicts, a constant apart: the search ends where a
    bisection does, in a few steps where the prediction's ratio holds."""
    rng = random.Random(5)
    reached = 0
    for _ in range(200):
        per_sample, fixed = rng.randint(1_000, 50_000), rng.randint(0, 200_000)
        held, extra = rng.uniform(0.7, 1.5), rng.randint(0, 300_000)
        persistent, limit = rng.randint(0, 1_000_000), rng.randint(2_000_000, 60_000_000)
        predicted = lambda batch: fixed + per_sample * batch  # noqa: E731
        real = lambda batch: int(held * predicted(batch)) + extra  # noqa: E731
        fits = lambda batch: persistent + real(batch) <= limit  # noqa: E731
        if not fits(1):
            continue
        guess = max(1, (limit - persistent - fixed) // per_sample)
        found = confirm_largest(lambda batch: MeasuredStep(batch, False, real(batch)), predicted, persistent,
                                limit, guess, max_steps=8)
        assert found.exact and found.batch_size == bisection(fits)
        assert found.total_bytes == persistent + real(found.batch_size) <= found.limit_bytes
        assert len(found.tried) <= 4, [step.batch_size for step in found.tried]
        reached += 1
    assert reached > 150


def test_steps_that_run_out_of_memory_halve_the_batch_until_one_fits():
    measured = []

    def measure(batch):
        measured.append(batch)
        return MeasuredStep(batch, False, None, out_of_memory=True) if batch > 37 else \
            MeasuredStep(batch, False, 100 * batch)

    found = confirm_largest(measure, lambda batch: 100 * batch, 0, 10**6, predicted_largest=400, max_steps=12)
    assert found.batch_size == 37 and found.exact, measured
    assert measured[:3] == [400, 200, 100]  # nothing measured to correct by: halved


def test_a_search_cut_short_says_that_the_batch_above_was_not_measured():
    found = confirm_largest(lambda batch: MeasuredStep(batch, False, 10 * batch), lambda batch: batch, 0, 10_000,
                            predicted_largest=10, max_steps=1)
    assert (found.batch_size, found.exact) == (10, False)
    assert "11 and above not measured" in found.words


def state(model):
    return [np.array(v.numpy()) for v in model.variables + model.optimizer.variables + model.metrics_variables]


def test_explain_fit_confirms_the_largest_plain_batch_by_steps_and_leaves_the_model_as_it_was(simulated):
    import keras

    from lms_magic import explain_fit
    from tests.models import encoder_decoder, pixel_labels

    model = encoder_decoder(32)
    data = pixel_labels(64, 32)
    model.fit(*data, batch_size=8, epochs=1, verbose=0)  # a model with a history, optimizer state and metrics
    before, history = state(model), model.history
    np.random.seed(3)
    numpy_before = np.random.get_state()[1].copy()
    found = explain_fit(model, data, batch_size=64, modes=("without LMS", "LMS"), confirm=True, min_bytes=0)
    plain, lms = found.modes
    confirmed = plain.confirmed
    assert confirmed is not None and confirmed.batch_size > 0 and confirmed.exact, found
    at = {step.batch_size: step for step in confirmed.tried}
    # the batch confirmed measured within the limit, the one above it measured past it
    assert confirmed.total_bytes <= found.plain_usable_bytes
    above = at[confirmed.batch_size + 1]
    assert above.out_of_memory or found.modes[0].confirmed.limit_bytes < \
        confirmed.total_bytes - at[confirmed.batch_size].step_bytes + above.step_bytes
    assert found.correction is not None and found.correction.measured_bytes > 0
    # LMS's steps read as LMS reads its own (the allocator the host shares, less the host's bytes): they fit a
    # larger batch than the plain steps, where the allocator alone would count what moved to the host as well
    assert lms.confirmed is not None and lms.confirmed.total_bytes <= lms.confirmed.limit_bytes, lms
    assert lms.confirmed.batch_size > confirmed.batch_size, (lms.confirmed, confirmed)
    text = str(found)
    assert f"confirmed by a step at {confirmed.batch_size}" in text and "TensorFlow's allocator on CPU:0" in text
    from lms_magic.ui.explain_html import explanation_html

    page = explanation_html(found)  # what a notebook shows
    assert f"{confirmed.batch_size} (confirmed;" in page and "measured: plain steps held" in page
    assert all(np.array_equal(a, b) for a, b in zip(before, state(model)))
    assert model.history is history and np.array_equal(np.random.get_state()[1], numpy_before)
    keras.backend.clear_session()


def test_confirm_without_a_device_to_measure_on_says_what_to_do(devices):
    from lms_magic import explain_fit
    from tests.models import images, reference_cnn_small

    with pytest.raises(ValueError, match="confirm=True: no accelerator to measure on.*leave confirm out"):
        explain_fit(reference_cnn_small(), images(16, 32), batch_size=8, capacity="64MiB", confirm=True,
                    device="/CPU:0", host_device="/CPU:1")


def test_an_allocator_that_keeps_no_statistics_is_said_and_nothing_runs(simulated, monkeypatch):
    """TensorFlow's CPU allocator with oneDNN off (and no BFC) cannot be reset: explain_fit says so (confirm=True:
    an error that says what to set) and runs no step."""
    from lms_magic import explain_fit
    from lms_magic.memory import frameworks
    from tests.models import images, reference_cnn_small

    class NoStatistics:
        framework, device, gpu_index, resettable = "TensorFlow", "CPU:0", None, True

        def reset(self):
            raise ValueError("Cannot reset memory stats for device 'CPU:0'")

    monkeypatch.setattr(frameworks, "discover_counters", lambda modules=None: ([NoStatistics()], []))
    model = reference_cnn_small()
    found = explain_fit(model, images(16, 32), batch_size=64, modes=("without LMS",))
    assert found.correction is None and "TF_CPU_ALLOCATOR_USE_BFC=true" in found.unmeasured
    assert "TF_CPU_ALLOCATOR_USE_BFC=true" in str(found)
    with pytest.raises(ValueError, match="confirm=True: TensorFlow's CPU allocator keeps no statistics"):
        explain_fit(model, images(16, 32), batch_size=64, modes=("without LMS",), confirm=True)


def test_an_allocator_that_misses_small_tensors_is_said_and_nothing_runs(simulated, monkeypatch):
    """oneDNN's CPU allocator (TensorFlow's default on a CPU) counts no tensor under 256 KiB: its peaks would make
    the corrections too small, so explain_fit measures nothing there and says what to set."""
    from lms_magic import explain_fit
    from lms_magic.memory import frameworks
    from tests.models import images, reference_cnn_small

    class MissesSmallTensors:
        framework, device, gpu_index, resettable = "TensorFlow", "CPU:0", None, True
        reads = 0

        def reset(self):
            pass

        def read(self):
            MissesSmallTensors.reads += 1
            return 0, 0

        def counts_every_tensor(self):
            return False

    monkeypatch.setattr(frameworks, "discover_counters", lambda modules=None: ([MissesSmallTensors()], []))
    found = explain_fit(reference_cnn_small(), images(16, 32), batch_size=64, modes=("without LMS",))
    assert found.correction is None and "counts no tensor under 256 KiB" in found.unmeasured
    assert "TF_CPU_ALLOCATOR_USE_BFC=true" in str(found) and MissesSmallTensors.reads == 1  # the meter's check: no step read


def test_a_fixed_part_is_drawn_only_where_the_two_steps_ratios_differ_beyond_their_noise():
    """Two steps of a CI run (the tests' causal LM: 7.2 MiB at batch 8 and 4.1 at 4, against replays of 9.8 and
    5.0; steps at 3 held 2.74 MiB where the replay had 3.75): the ratios 0.73 and 0.82 are within a step's noise,
    so one ratio fits both and batch 3 is within 10%; the line through them was 1.22x there. Where the kernels'
    scratch is a real fixed part (2.35x and 3.1x the replay), the line is kept and holds at a third batch."""
    from lms_magic.lms.core.device_model import Correction

    MiB = 2**20
    noisy = Correction.through(8, int(7.2 * MiB), int(9.8 * MiB), "CPU:0", (4, int(4.1 * MiB), 5 * MiB))
    assert noisy.other is not None and noisy.fixed_bytes == 0 and "one ratio fits both" in noisy.words
    assert 0.9 <= noisy.applied(int(3.75 * MiB), 0) / (2.74 * MiB) <= 1.1
    # a fixed 30 MiB and 1.6x per replayed byte: 10 MiB of tensors at batch 2, 20 at 4, 40 at 8
    held = lambda replayed: 30 * MiB + 1.6 * replayed  # noqa: E731
    line = Correction.through(8, int(held(40 * MiB)), 40 * MiB, "CPU:0", (4, int(held(20 * MiB)), 20 * MiB))
    assert abs(line.fixed_bytes - 30 * MiB) < MiB and abs(line.applied(10 * MiB, 0) - held(10 * MiB)) < MiB


def test_a_later_answer_reads_the_steps_measured_before_and_a_recompiled_model_is_measured_again(simulated):
    """A second explain_fit on the same model, device and data reads the plain steps the first measured (a step
    measured again can hold another amount: the executor's order) and runs none, at the same batch or at one those
    steps hold closely, and with confirm=False (%lms_tune's frontier) too; a model compiled again is measured
    again."""
    import keras

    from lms_magic import explain_fit
    from lms_magic.units import format_size
    from tests.models import images, reference_cnn_small

    model, data = reference_cnn_small(), images(32, 32)
    fits = []
    fit = model.fit
    model.fit = lambda *args, **kwargs: (fits.append(kwargs.get("batch_size")), fit(*args, **kwargs))[1]
    replayed = explain_fit(model, data, batch_size=8, capacity="1MiB", modes=("without LMS",), confirm=False)
    assert fits == [] and replayed.correction is None  # nothing measured yet: the replay's figures
    first = explain_fit(model, data, batch_size=8, capacity="1MiB", modes=("without LMS",))
    # the batch asked and half of it, measured; the largest plain batch confirmed (1 does not fit 1 MiB)
    assert sorted(set(fits)) == [1, 4, 8], fits
    headline = str(first).splitlines()[0]  # the figure the rows below it give, said to be corrected
    assert f"needs {format_size(first.modes[0].peak_bytes)} at its peak without LMS (as the plain steps measured " \
           f"below correct it; {format_size(first.peak['bytes'])} in the replay" in headline, headline
    fits.clear()
    second = explain_fit(model, data, batch_size=8, capacity="1MiB", modes=("without LMS",))
    assert fits == [] and second.correction == first.correction, (fits, second)
    other_batch = explain_fit(model, data, batch_size=6, capacity="1MiB", modes=("without LMS",))
    assert fits == [], fits  # 8 and 4 hold 6: no new steps, the same figures
    assert (other_batch.correction.ratio, other_batch.correction.fixed_bytes) == \
        (first.correction.ratio, first.correction.fixed_bytes)
    unconfirmed = explain_fit(model, data, batch_size=8, capacity="1MiB", modes=("without LMS",), confirm=False)
    assert fits == [] and unconfirmed.correction == first.correction, fits  # read, not run
    assert unconfirmed.modes[0].peak_bytes == first.modes[0].peak_bytes != replayed.modes[0].peak_bytes
    elsewhere = explain_fit(model, data, batch_size=32, capacity="1MiB", modes=("without LMS",), confirm=False)
    assert elsewhere.correction is None and "out of memory" not in str(elsewhere), elsewhere  # 1, 4, 8 do not hold 32
    model.compile(keras.optimizers.SGD(), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    explain_fit(model, data, batch_size=8, capacity="1MiB", modes=("without LMS",))
    assert sorted(set(fits)) == [1, 4, 8], fits


def test_explain_fit_and_largest_batch_tell_one_story_on_the_simulated_device(simulated):
    """By default explain_fit confirms the largest plain batch by steps on the simulated device, as on a GPU, and
    largest_batch (what `%%lms_fit --batch-size max` runs) then reads the same steps: the same batch, no step
    measured again."""
    from lms_magic import explain_fit, largest_batch
    from tests.models import images, reference_cnn_small

    model, data = reference_cnn_small(), images(64, 32)
    explained = explain_fit(model, data, batch_size=64, modes=("without LMS", "LMS"))
    confirmed = explained.modes[0].confirmed
    assert confirmed is not None and confirmed.exact and confirmed.batch_size > 0, explained
    assert f"confirmed by a step at {confirmed.batch_size}" in str(explained)
    fits = []
    fit = model.fit
    model.fit = lambda *args, **kwargs: (fits.append(kwargs.get("batch_size")), fit(*args, **kwargs))[1]
    chosen = largest_batch(model, data, batch_size=64)
    assert chosen.explanation.modes[0].confirmed.batch_size == confirmed.batch_size and fits == [], (chosen, fits)


def test_lms_plans_for_the_budget_on_the_device_as_explain_fits_steps_correct_the_replay(simulated, monkeypatch):
    """Where the measured steps say the device holds more than the replay, explain_fit's LMS line carries the
    budget in the device's bytes, and LMS, reading the same measured steps, plans for it in the replay's bytes
    as explain_fit predicted: no budget in two units."""
    from lms_magic import LMS, explain_fit
    from lms_magic.lms.core.device_model import Correction
    from lms_magic.sizing import explain_fit as explain_module
    from lms_magic.units import format_size
    from tests.models import images, reference_cnn_small

    def twice(session, meter, batch, capacity, limit):  # a device that holds twice what the replay says
        found = Correction(batch, 2 * 2**20, 2**20, 2.0, "a fake allocator")
        meter.measured_device().correction = found
        return found

    monkeypatch.setattr(explain_module, "_correction", twice)
    model, data = reference_cnn_small(), images(64, 32)
    found = explain_fit(model, data, batch_size=64, capacity="64MiB", modes=("without LMS", "LMS"))
    lms = found.modes[1]
    assert lms.magic == "%%lms_fit --budget 51MiB" and "replay's bytes" not in str(found), found  # 80% of 64 MiB
    callback = LMS(verbose=0, budget="51MiB")
    model.fit(*data, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    replayed = found.correction.replayed(51 * 2**20, callback.stats.persistent_bytes)
    note = next(note for note in callback.stats.notes if note.startswith("planned for "))
    assert note.startswith(f"planned for {format_size(replayed)} in the replay's bytes: the 51.0 MiB budget, as the "
                           "plain steps explain_fit measured in a fake allocator correct the replay"), note


def test_lms_after_explain_fit_gives_the_figure_without_it_that_explain_fit_measured(simulated):
    """One model of the device: a fit with LMS after explain_fit on the same model, device and data says, without
    LMS, the plain step explain_fit measured at its batch (not its own replay), and at another batch its replay as
    the same measured steps correct it."""
    import keras

    from lms_magic import LMS, explain_fit
    from tests.models import images, reference_cnn_small

    model, data = reference_cnn_small(), images(64, 32)
    found = explain_fit(model, data, batch_size=8, modes=("without LMS",), min_bytes=0)
    plain = found.modes[0]
    assert found.correction is not None and found.correction.batch_size == 8, found
    budget = found.peak["bytes"] // 2  # in the replay's bytes: LMS moves tensors
    lms = LMS(verbose=0, budget=budget, min_bytes=0)
    model.fit(*data, batch_size=8, epochs=1, verbose=0, callbacks=[lms])
    stats = lms.stats
    assert stats.swapped_tensors > 0, lms.summary()
    assert stats.without_lms_measured and stats.device_peak_bytes_without_lms == plain.peak_bytes, (stats, found)
    assert "a plain step explain_fit measured at this batch" in lms.summary()
    other = LMS(verbose=0, budget=budget * 3 // 4, min_bytes=0)
    model.fit(*data, batch_size=6, epochs=1, verbose=0, callbacks=[other])
    stats = other.stats
    replayed = stats.peak_without_lms["bytes"]
    assert not stats.without_lms_measured and "as explain_fit's measured plain steps correct it" in \
        stats.without_lms_source, other.summary()
    assert stats.device_peak_bytes_without_lms == found.correction.applied(replayed, stats.persistent_bytes)
    keras.backend.clear_session()


def test_a_measured_step_with_lms_is_the_step_the_fit_it_stands_for_keeps(simulated, copies_costing):
    """explain_fit's steps with LMS run a few steps of a fit, and LMS's first step weighs its swaps against a
    retrace over the fit they stand for, not over those few: told a fit of 2 steps, the first step's swaps stand
    (less held); of unknown length, with copies that cost, the plan is traced and measured. Each is kept apart
    in the device's figures, with its first step's time (what a retrace costs)."""
    from lms_magic.lms.core import device_model
    from lms_magic.memory.frameworks import resettable_counter
    from lms_magic.sizing.measured import StepMeter
    from lms_magic.tuning.session import TuningSession
    from tests.models import images, reference_cnn_small

    model, data = reference_cnn_small(), images(64, 32)
    # the first step's copies take the step's compute each way: they cost more than the plan's on any CPU
    copies_costing(TuningSession(model, data, 32, min_bytes=0, device="/CPU:0"), 32, "/CPU:0", 1.0)
    options = {"min_bytes": 0, "budget": 33 << 20}  # 32x32, batch 32: the plan moves 6 of 14 tensors
    short = StepMeter(model, data, resettable_counter("/CPU:0"), options, "/CPU:0", lambda batch: 2)
    long = StepMeter(model, data, resettable_counter("/CPU:0"), options, "/CPU:0")
    kept, planned = short.measure(32, with_lms=True), long.measure(32, with_lms=True)
    assert kept.step_bytes < 0.8 * planned.step_bytes, (kept, planned)
    steps = short.measured_device().steps
    assert sorted(len(way) for key, way in steps.items() if key != device_model.PLAIN) == [1, 1], steps
    assert kept.retrace_s > 0 and planned.retrace_s > 0 and short.measured_device().retrace_s() > 0


def test_a_step_with_lms_that_cannot_be_read_leaves_its_way_predicted_and_says_why(simulated, tmp_path):
    """On the simulated device a step with LMS is read from its profile; where the user's own profiler holds
    TensorFlow's, the LMS way is not confirmed, its line says why, and the plain way is confirmed as before."""
    import tensorflow as tf

    from lms_magic import explain_fit
    from tests.models import images, reference_cnn_small

    tf.profiler.experimental.start(str(tmp_path))
    try:
        found = explain_fit(reference_cnn_small(), images(64, 32), batch_size=64, modes=("without LMS", "LMS"),
                            min_bytes=0)
    finally:
        tf.profiler.experimental.stop()  # raises where explain_fit stopped the user's session
    plain, lms = found.modes
    assert plain.confirmed is not None and plain.confirmed.batch_size > 0, found
    assert lms.confirmed is None and "not confirmed: LMS's step at batch" in lms.note, lms
    assert "not confirmed: LMS's step at batch" in str(found)


def test_a_way_with_lms_is_held_to_its_own_steps_and_where_it_moves_nothing_to_the_plain_ones():
    """explain_fit's figure of a way with LMS at a batch: its step measured there; else its replay times what its
    nearest measured step held over its replay (not the plain steps' ratio, which would charge it for what it
    moved); none where its plan moves nothing there (the model's own step: the plain figure holds it). Its replay
    is the plan's where copies cost, or where it recomputes; where every eligible tensor's copies hide under the
    compute as the plan's do, the first step's swaps of every eligible tensor, which LMS on TensorFlow keeps then."""
    from types import SimpleNamespace

    from lms_magic.lms.core.costs import StepCost
    from lms_magic.lms.core.prediction import Prediction
    from lms_magic.lms.explain.largest import Confirmed
    from lms_magic.lms.explain.results import ModeFit
    from lms_magic.sizing.explain_fit import own_figure

    MiB = 2**20

    class Predictor:  # the replay: 2 MiB a sample with LMS's plan, which moves tensors above batch 4
        persistent_bytes = 10 * MiB
        swaps = True  # False: recompute="only", the plan recomputes what it moves

        def planned(self, lb, batch, capacity):
            moved = batch * MiB if batch > 4 else 0
            return Prediction(batch, 1, lb, 10 * MiB + 2 * batch * MiB, 10 * MiB + 3 * batch * MiB,
                              moved if self.swaps else 0, 3, 10 * MiB, 0 if self.swaps else moved)

        def predict(self, n_tensors, lb, batch):  # every eligible tensor moved: 4 MiB and 1 MiB a sample
            assert n_tensors == -1
            return Prediction(batch, 3, lb, 14 * MiB + batch * MiB, 10 * MiB + 3 * batch * MiB, 2 * batch * MiB, 3,
                              10 * MiB)

    def link(bytes_per_s: float):  # steps of 0.1 s of compute, copies over a host link this fast
        return lambda batch: StepCost(0.1, "measured", bytes_per_s, bytes_per_s)

    # copies cost, over a fit of unknown length: the plan's step runs
    session = SimpleNamespace(predictor=Predictor(), step_cost=link(1e8), fit_left=lambda batch: (None, None))
    held = MeasuredStep(16, True, 48 * MiB)  # 1.5x its replay's 32 MiB
    found = ModeFit("LMS", 0, True, 16, 1.0, "%%lms_fit", confirmed=Confirmed(16, 58 * MiB, 60 * MiB, True, (held,)))
    assert own_figure(session, found, 16, None) == (58 * MiB, "its step at batch 16 measured")
    peak_bytes, how = own_figure(session, found, 8, None)
    assert peak_bytes == 10 * MiB + 24 * MiB and how.endswith("times 1.50, as its step at 16 held"), how
    assert own_figure(session, found, 4, None) is None
    # a fit of 11 steps and a retrace of 5 s: the first step's extra copies (0.17 s a step at 8) stand; in one of
    # 101 steps they would take 17 s: the plan is traced
    session.fit_left = lambda batch: (10, 5.0)
    assert own_figure(session, found, 8, None)[0] == 10 * MiB + int(2.4 * 12 * MiB)
    session.fit_left = lambda batch: (100, 5.0)
    assert own_figure(session, found, 8, None)[0] == 10 * MiB + 24 * MiB
    session.fit_left = lambda batch: (None, None)
    session.step_cost = link(1e13)  # the copies hide: the step that swaps every eligible tensor (20 MiB at 16)
    peak_bytes, how = own_figure(session, found, 8, None)
    assert peak_bytes == 10 * MiB + int(2.4 * 12 * MiB) and how.endswith("times 2.40, as its step at 16 held"), how
    assert own_figure(session, found, 4, None) is None
    session.predictor.swaps = False  # recompute="only" plans on the traced step: no first step swaps them all
    assert own_figure(session, found, 8, None)[0] == 10 * MiB + 24 * MiB
