"""LMS on Keras 3 / TensorFlow, on two logical CPU devices (the ``devices`` fixture): the same math with
and without it on every kind of model and data, the options' effect on what is swapped, budgets, the
swaps TensorFlow executes, and what the stats and the summary say."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from lms_magic import LMS
from lms_magic.lms.core.plan import BudgetError, Rule
from lms_magic.lms.tensorflow.backend import TensorFlowBackend
from lms_magic.lms.persistent import persistent_bytes
from tests import models


def train(build, data, callbacks=(), epochs=2, **fit_options):
    """Builds a fresh seeded model and fits it; returns (model, history)."""
    model = build()
    keras.utils.set_random_seed(7)
    x, y = data() if callable(data) else data
    history = model.fit(x, y, epochs=epochs, verbose=0, callbacks=list(callbacks), **fit_options)
    return model, history


def assert_same_training(plain, lms):
    """Bit-identical losses and weights: the README's claim, with no tolerance."""
    (plain_model, plain_history), (lms_model, lms_history) = plain, lms
    plain_loss, lms_loss = np.array(plain_history.history["loss"]), np.array(lms_history.history["loss"])
    assert np.array_equal(lms_loss, plain_loss), (plain_loss, lms_loss)
    for before, after in zip(plain_model.get_weights(), lms_model.get_weights()):
        assert np.array_equal(after, before)


class Batches(keras.utils.PyDataset):
    def __init__(self, x, y, batch_size):
        super().__init__()
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return len(self.x) // self.batch_size

    def __getitem__(self, index):
        part = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.x[part], self.y[part]


def generator(x, y, batch_size):
    while True:
        for start in range(0, len(x) - batch_size + 1, batch_size):
            yield x[start:start + batch_size], y[start:start + batch_size]


CASES = {
    "sequential cnn, numpy": (models.reference_cnn_small, lambda: models.images(64, 32),
                              dict(batch_size=32, shuffle=False)),
    "functional residual, batchnorm, dropout": (models.residual_bn_dropout, lambda: models.images(64, 32),
                                                dict(batch_size=16, shuffle=False)),
    "subclassed, custom train_step": (models.custom_step, lambda: models.images(64, 32), dict(batch_size=16,
                                                                                              shuffle=False)),
    "validation data and class weights": (models.residual_bn_dropout, lambda: models.images(64, 32),
                                          dict(batch_size=16, shuffle=False, validation_data=models.images(32, 32, 1),
                                               class_weight={i: 1.0 + i / 10 for i in range(10)})),
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_losses_and_weights_with_and_without_lms(case, lms_options):
    build, data, options = CASES[case]
    callback = LMS(**lms_options)
    lms = train(build, data, [callback], **options)
    assert callback.stats.swapped_tensors > 0 and callback.stats.steps == 2 * 64 // options["batch_size"]
    assert_same_training(train(build, data, **options), lms)


@pytest.mark.parametrize("source", ["tf.data", "generator", "PyDataset"])
def test_same_training_from_every_data_source(source, lms_options):
    x, y = models.images(64, 32)
    if source == "tf.data":
        make = lambda: (tf.data.Dataset.from_tensor_slices((x, y)).batch(16), None)  # noqa: E731
        options = {}
    elif source == "generator":
        make = lambda: (generator(x, y, 16), None)  # noqa: E731
        options = {"steps_per_epoch": 4}
    else:
        make = lambda: (Batches(x, y, 16), None)  # noqa: E731
        options = {}
    callback = LMS(**lms_options)
    lms = train(models.residual_bn_dropout, make, [callback], **options)
    assert callback.stats.swapped_tensors > 0
    assert_same_training(train(models.residual_bn_dropout, make, **options), lms)


def test_mixed_precision(lms_options):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        callback = LMS(**lms_options)
        lms = train(models.residual_bn_dropout, lambda: models.images(64, 32), [callback], batch_size=16,
                    shuffle=False)
        plain = train(models.residual_bn_dropout, lambda: models.images(64, 32), batch_size=16, shuffle=False)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    # activations were swapped at 2 bytes per element: the float16 compute dtype, not float32
    assert any(row["bytes"] == 2 * int(np.prod(row["shape"])) for row in callback.stats.plan)
    assert_same_training(plain, lms)


def test_recurrent_layer_is_named_and_left_alone(lms_options):
    def build():
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((12, 8)), keras.layers.Dense(32, activation="relu", name="embed"),
                                  keras.layers.LSTM(16, name="memory"), keras.layers.Dense(10)])
        return models.compiled(model)

    data = (np.random.default_rng(0).random((32, 12, 8), dtype="float32"), np.arange(32) % 10)
    callback = LMS(**lms_options)
    lms = train(build, data, [callback], batch_size=8, shuffle=False)
    assert any("'memory'" in note for note in callback.stats.notes)
    assert all(row["layer"] != "memory" for row in callback.stats.plan)
    assert_same_training(train(build, data, batch_size=8, shuffle=False), lms)


def fit(model, callbacks=(), epochs=1, **options):
    x, y = models.images(64, 32)
    return model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, shuffle=False, callbacks=list(callbacks),
                     **options)


def where(plan):  # tensor names differ between two model instances; layer types and shapes do not
    return [(row["layer_type"], row["shape"]) for row in plan]


@pytest.fixture(scope="module")
def everything(devices):
    """The residual model with every candidate swapped: the plan the option tests compare with."""
    callback = LMS(device=devices.accelerator, host_device=devices.host, min_bytes=0, verbose=0, n_tensors=-1)
    fit(models.residual_bn_dropout(), [callback])
    return callback.stats


def test_n_tensors_swaps_the_first_n_in_every_fit_of_the_callback(lms_options, everything):
    first_two = LMS(**{**lms_options, "n_tensors": 2})
    model = models.residual_bn_dropout()
    for _ in range(2):  # the same callback, a second fit: planned and swapped again
        fit(model, [first_two])
        assert first_two.stats.swapped_tensors == 2 and first_two.stats.plan_rule is Rule.FIRST_N
        assert where(first_two.stats.plan) == where(everything.plan)[:2]


def test_min_bytes_and_layer_filters(lms_options, everything):
    big_only = LMS(**{**lms_options, "min_bytes": 64 * 1024})
    fit(models.residual_bn_dropout(), [big_only])
    assert big_only.stats.plan and all(row["bytes"] >= 64 * 1024 for row in big_only.stats.plan)
    assert len(big_only.stats.plan) < len(everything.plan)
    model = models.residual_bn_dropout()
    conv = next(layer.name for layer in model.layers if isinstance(layer, keras.layers.Conv2D))
    only_one = LMS(**{**lms_options, "include_layers": conv, "exclude_types": "Dense"})
    fit(model, [only_one])
    assert only_one.stats.plan and {row["layer"] for row in only_one.stats.plan} == {conv}


def test_budget_swaps_the_fewest_that_fit(lms_options):
    everything = LMS(**lms_options)
    fit(models.reference_cnn_small(), [everything])
    low, high = everything.stats.traced_device_peaks[0], everything.stats.traced_device_peaks[1]
    budget = (low + high) // 2
    callback = LMS(budget=budget, **lms_options)
    fit(models.reference_cnn_small(), [callback])
    assert 0 < callback.stats.swapped_tensors < everything.stats.swapped_tensors
    assert callback.stats.plan_rule == "budget" and callback.stats.budget_bytes == budget
    assert callback.stats.traced_device_peaks[0] <= budget  # planned on the traced graph
    assert callback.stats.device_peak_bytes <= budget * 1.1  # the executed graph's replay


@pytest.mark.parametrize("above_weights, words", [
    (None, "weights and optimizer state alone take .* LMS swaps activations, not weights"),  # as %lms_tune says
    (1024, "lowest predicted device peak of any plan tried is .* above the budget"),
])
def test_impossible_budget_fails_before_training_and_keeps_the_model(lms_options, above_weights, words):
    model = models.reference_cnn_small()
    weights = [w.copy() for w in model.get_weights()]
    budget = 1024 if above_weights is None else persistent_bytes(model) + above_weights
    with pytest.raises(BudgetError, match=words):
        fit(model, [LMS(budget=budget, **lms_options)])
    assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
    assert "train_step" not in model.__dict__
    fit(model)  # plain training still works


@pytest.fixture(scope="module")
def reference(devices):
    """The reference CNN (12 Conv2D, 64x64, batch 32) trained with every candidate swapped."""
    callback = LMS(device=devices.accelerator, host_device=devices.host, min_bytes=0, verbose=1, n_tensors=-1)
    model = models.reference_cnn()
    x, y = models.images(64, 64)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    return callback


def test_every_planned_swap_is_executed_on_the_host(reference, devices):
    executed = {node.name: node for graph in reference.stats.partition_graphs for node in graph.node}
    records = reference.stats.records
    assert len(records) == reference.stats.swapped_tensors >= 12
    host = tf.DeviceSpec.from_string(devices.host)
    for record in records:
        for name in (record.swap_out, record.swap_in):
            matches = [node for full, node in executed.items() if full.endswith("/" + name) or full == name]
            assert matches, f"{name} was removed before execution"
            assert all(tf.DeviceSpec.from_string(n.device).device_index == host.device_index for n in matches)
            assert all(n.op in ("EnsureShape", "Snapshot") for n in matches)


def test_reference_cnn_peak_is_at_least_halved(reference):
    stats = reference.stats
    assert stats.prediction_source == "executed partition graphs"
    assert stats.device_peak_bytes <= 0.5 * stats.device_peak_bytes_without_lms


def test_stats_and_summary_say_what_was_swapped_and_the_predicted_peaks(reference, devices):
    stats = reference.stats
    assert stats.swapped_bytes_per_step == sum(row["bytes"] for row in stats.plan)
    assert set(stats.plan[0]) >= {"layer", "layer_type", "shape", "bytes", "lb", "trigger"}
    assert stats.backend == "tensorflow" and stats.peak_source == "predicted" and stats.lb_counts == "backward ops"
    assert stats.predicted_device_peak_bytes == stats.device_peak_bytes and stats.measured_device_peak_bytes is None
    assert stats.peak["bytes"] == stats.device_peak_bytes == sum(stats.peak["by_kind"].values())
    summary = reference.summary()
    assert summary.startswith(f"LMS: swapping {stats.swapped_tensors} of {stats.candidates} tensors")
    assert f"predicted {devices.accelerator} peak" in summary and "MiB without (executed partition graphs)" in summary


def test_outside_the_supported_versions_lms_refuses_before_changing_anything(lms_options, monkeypatch):
    from lms_magic import versions

    monkeypatch.setitem(versions.SUPPORTED, "keras", ("3.0", "3.1"))
    model = models.residual_bn_dropout()
    with pytest.raises(RuntimeError, match=r"keras 3\.\d+\.\d+ \(supported: 3\.0 to 3\.1\)\. Install a supported "
                                           r"version, or set LMS_MAGIC_SKIP_VERSION_CHECK=1"):
        fit(model, [LMS(**lms_options)])
    assert "train_step" not in model.__dict__
    monkeypatch.setenv("LMS_MAGIC_SKIP_VERSION_CHECK", "1")
    callback = LMS(**lms_options)
    fit(model, [callback])
    assert callback.stats.swapped_tensors > 0


def counted_traces(model, traces: list | None = None) -> list:
    """``traces`` (a new list by default), given an entry each time ``model``'s train step is traced."""
    traces, original = [] if traces is None else traces, model.train_step

    def counted(data):
        if not tf.executing_eagerly():
            traces.append(1)
        return original(data)

    object.__setattr__(model, "train_step", counted)
    return traces


def test_a_second_trace_of_the_step_swaps_the_same_tensors_without_planning_again(lms_options, costly_copies):
    """Keras traces the train step twice when the first trace creates variables: here the layers' own (a Sequential
    without an input shape is built in its first trace, which LMS leaves to Keras) and Adam's slots."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([layer for _ in range(4) for layer in (keras.layers.Conv2D(16, 3, padding="same"),
                                                                    keras.layers.BatchNormalization(),
                                                                    keras.layers.Activation("relu"))]
                             + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    traces = counted_traces(model)
    callback = LMS(**{**lms_options, "n_tensors": None})
    fit(model, [callback])
    assert len(traces) == 3  # the probe's two, and the plan's
    swap_ins = [node.name for graph in callback.stats.partition_graphs for node in graph.node
                if node.op == "Snapshot" and "lms_swap_in/" in node.name]
    assert len(swap_ins) == callback.stats.swapped_tensors > 0  # the graph that ran swaps what was planned
    assert all(any(name.endswith(record.swap_in) for name in swap_ins) for record in callback.stats.records)


def test_where_the_probes_copies_hide_in_the_steps_left_its_swaps_stand_and_the_step_is_traced_once(lms_options,
                                                                                                    free_copies):
    """A retrace of a large step takes seconds (a KerasHub causal LM's about as long as its first step), while
    copies that hide under the compute cost no step time: over a short fit the probe's swaps stand (every eligible
    tensor), said with both times, the step traced once, the training a plain fit's, the peak below no LMS."""
    plain, with_lms = models.residual_bn_dropout(), models.residual_bn_dropout()
    for model in (plain, with_lms):
        model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    traces = counted_traces(with_lms)
    callback = LMS(**{**lms_options, "n_tensors": None})
    expected, history = fit(plain), fit(with_lms, [callback])
    stats = callback.stats
    assert len(traces) == 1 and stats.plan_rule is Rule.LOWEST_PEAK
    kept = next(note for note in stats.notes if "swaps stand" in note)
    assert f"the first step's {stats.swapped_tensors} swaps stand" in kept and "steps left" in kept
    assert 0 < stats.device_peak_bytes < stats.device_peak_bytes_without_lms
    assert_same_training((plain, expected), (with_lms, history))


@pytest.mark.parametrize("link", ["copies hide", "copies cost"])
def test_in_a_fit_of_unknown_length_the_probes_swaps_stand_only_where_their_copies_cost_nothing_more(lms_options,
                                                                                                     request, link):
    """A generator Keras cannot count: no steps left to weigh the probe's extra copies over. Where they cost nothing
    more than the plan's (hidden under the compute), its swaps stand (said), else the plan is traced."""
    request.getfixturevalue("free_copies" if link == "copies hide" else "costly_copies")
    x, y = models.images(64, 32)
    model = models.residual_bn_dropout()
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = LMS(**{**lms_options, "n_tensors": None})
    batches = ((x[start:start + 16], y[start:start + 16]) for start in range(0, 64, 16))  # 4 steps, uncounted
    model.fit(batches, verbose=0, callbacks=[callback])
    stats = callback.stats
    kept = [note for note in stats.notes if "swaps stand" in note]
    assert stats.steps_left is None and stats.swapped_tensors > 0, stats.notes
    if link == "copies hide":
        assert kept and kept[0].endswith("in a fit of unknown length"), stats.notes
    else:
        assert not kept and any("swapped from the second step" in note for note in stats.notes), stats.notes


def test_the_model_state_is_built_before_the_first_trace_so_a_probing_fit_traces_once_per_plan(lms_options,
                                                                                               costly_copies):
    """Keras builds the optimizer's slots and the metrics inside the first trace, and TensorFlow then traces the
    step again; LMS builds them first (as Keras does under a distribution strategy): the probe is traced once, the
    plan once, and the fit trains as a plain one does."""
    plain, with_lms = models.residual_bn_dropout(), models.residual_bn_dropout()
    for model in (plain, with_lms):
        model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    plain_traces, traces = counted_traces(plain), counted_traces(with_lms)
    callback = LMS(**{**lms_options, "n_tensors": None})
    expected, history = fit(plain), fit(with_lms, [callback])
    assert callback.stats.swapped_tensors > 0 and callback.stats.plan_rule is Rule.LOWEST_PEAK
    assert len(plain_traces) == 2 and len(traces) == 2  # the probe and the plan: one trace each
    assert [v.shape for v in with_lms.optimizer.variables] == [v.shape for v in plain.optimizer.variables]
    assert_same_training((plain, expected), (with_lms, history))


@pytest.mark.parametrize("source, expected", [("arrays", "the fit call's batch_size"), ("tf.data", "the dataset's batch()"),
                                              ("generator", "the generator's first batch"),
                                              ("PyDataset", "the PyDataset's first batch")])
def test_a_batch_size_unknown_at_trace_time_is_found_in_the_fit(source, expected, lms_options):
    """64 rows in batches of 20: the last batch has 4, so Keras traces with an unknown batch dimension."""
    x, y = models.images(64, 32)
    if source == "arrays":
        make, options = (lambda: (x, y)), {"batch_size": 20, "shuffle": False}
    elif source == "tf.data":
        make, options = (lambda: (tf.data.Dataset.from_tensor_slices((x, y)).batch(20), None)), {}
    elif source == "generator":
        make, options = (lambda: (generator(x[:60], y[:60], 20), None)), {"steps_per_epoch": 3}
    else:
        make, options = (lambda: (Batches(x[:60], y[:60], 20), None)), {}
    callback = LMS(**lms_options)
    lms = train(models.residual_bn_dropout, make, [callback], epochs=1, **options)
    stats = callback.stats
    assert (stats.batch_size, stats.batch_size_source) == (20, expected)
    activations = [row["shape"] for row in stats.plan if len(row["shape"]) == 4]  # not BatchNorm's statistics
    assert stats.swapped_tensors > 0 and activations and all(shape[0] == 20 for shape in activations)
    if source in ("arrays", "tf.data"):  # the only two whose traced batch dimension is unknown here
        assert any(f"LMS planned for batches of 20 ({expected})" in note for note in stats.notes)
    assert_same_training(train(models.residual_bn_dropout, make, epochs=1, **options), lms)


def capacity_for(usable_bytes: int) -> int:
    """The capacity whose usable part (less the headroom) is ``usable_bytes``."""
    from lms_magic.lms.core.plan import CAPACITY_HEADROOM

    return int(usable_bytes / (1 - CAPACITY_HEADROOM)) + 1


def fit_reference(callbacks=(), steps=4, traces: list | None = None):
    """The small reference CNN trained ``steps`` steps; ``traces`` gets an entry each time its train step is traced."""
    x, y = models.images(16 * steps, 32)
    model = models.reference_cnn_small()
    if traces is not None:
        counted_traces(model, traces)
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=list(callbacks))
    return model, history


@pytest.fixture
def unmeasured_steps(monkeypatch):
    """Fits on the simulated device read no allocator around their first step: the budgets these tests set sit
    within a few percent of the replay's figure, and the allocator's reading of a step that moved nothing can lie
    above it (a first step can get larger chunks: ``test_measured_plan.py`` tests what LMS does with a reading)."""
    from lms_magic.lms import callback

    monkeypatch.setattr(callback, "_step_allocator", lambda device: None)


@pytest.fixture(scope="module")
def reference_peaks(devices):
    """The small reference CNN's executed peaks at batch 16: without LMS, and with every candidate swapped."""
    callback = LMS(device=devices.accelerator, host_device=devices.host, n_tensors=-1, verbose=0)
    fit_reference([callback], steps=1)
    return callback.stats.device_peak_bytes_without_lms, callback.stats.device_peak_bytes


def test_where_the_step_fits_the_device_with_room_nothing_is_probed_or_traced_again(accelerator_memory,
                                                                                      reference_peaks):
    """The traced step within TRUSTED_FIT of the usable capacity: no probe, no executed graphs, and the LMS train
    function, which holds the model's own step, runs every step (no second trace)."""
    plain_peak, _ = reference_peaks
    accelerator_memory(capacity_for(2 * plain_peak))
    backends = []

    def watched(model, options, stats):
        backends.append(TensorFlowBackend(model, options, stats))
        return backends[-1]

    callback = LMS(verbose=0, backend=watched)
    plain_traces, traces = [], []
    fit_reference(traces=plain_traces)
    model, history = fit_reference([callback], traces=traces)
    stats, (backend,) = callback.stats, backends
    # no second trace: one, where Keras's own first fit traces twice (its first trace makes the optimizer's slots,
    # and TensorFlow traces a function that made variables again); LMS builds them before it
    assert len(traces) == 1 < len(plain_traces)
    assert stats.plan_rule is Rule.FITS_DEVICE and stats.budget_bytes == 2 * plain_peak
    assert stats.swapped_tensors == 0 and stats.swapped_bytes_per_step == 0 and stats.predicted_step_ratio == 1.0
    assert stats.steps == 4 and stats.partition_graphs is None and backend.executed is None  # no probe, no replay
    assert stats.prediction_source == "traced graph"
    assert any("the step fits the device with room" in note and "no step was probed" in note for note in stats.notes)
    assert_same_training(fit_reference(), (model, history))


def test_where_the_step_fits_the_device_without_room_the_executed_graphs_check_it_first(accelerator_memory,
                                                                                          reference_peaks,
                                                                                          unmeasured_steps):
    """Within the usable capacity but above TRUSTED_FIT of it: the first step's executed graphs are replayed, and
    the step LMS traced, which moved nothing, runs on: the model's own step, not traced again."""
    from lms_magic.lms.core.plan import TRUSTED_FIT

    plain_peak, _ = reference_peaks
    usable = int(plain_peak / TRUSTED_FIT * 0.95)  # the step (traced or executed) fits, above TRUSTED_FIT of it
    accelerator_memory(capacity_for(usable))
    callback = LMS(verbose=0)
    traces = []
    model, history = fit_reference([callback], traces=traces)
    stats = callback.stats
    assert len(traces) == 1  # LMS's (the model's state built before it), and no other
    assert stats.plan_rule is Rule.FITS_DEVICE and stats.budget_bytes == usable
    assert stats.device_peak_bytes <= stats.budget_bytes
    assert stats.swapped_tensors == 0 and stats.swapped_bytes_per_step == 0 and stats.steps == 4
    assert stats.prediction_source.startswith("executed partition graphs")
    assert any("the step fits the device" in note and "nothing moves from the second step on" in note
               for note in stats.notes)
    assert_same_training(fit_reference(), (model, history))


def test_where_the_first_fit_stepped_out_the_second_steps_out_after_one_step_unprobed(accelerator_memory,
                                                                                     reference_peaks, monkeypatch,
                                                                                     unmeasured_steps):
    """A step that fits the device, above TRUSTED_FIT of it: the first fit checks its executed graphs and moves
    nothing from its second step on; the second fit likewise, with nothing probed, replayed or planned."""
    from lms_magic.lms.core.plan import TRUSTED_FIT

    plain_peak, _ = reference_peaks
    accelerator_memory(capacity_for(int(plain_peak / TRUSTED_FIT * 0.95)))
    model, (x, y) = models.reference_cnn_small(), models.images(64, 32)
    first, second = LMS(verbose=0), LMS(verbose=0)
    model.fit(x, y, batch_size=16, verbose=0, callbacks=[first])
    from lms_magic.lms.tensorflow.planner import TracePlanner

    searches, search = [], TracePlanner.search
    monkeypatch.setattr(TracePlanner, "search", lambda self, *args, **kw: searches.append(1) or search(self, *args, **kw))
    model.fit(x, y, batch_size=16, verbose=0, callbacks=[second])
    assert first.stats.steps == second.stats.steps == 4 and second.stats.swapped_tensors == 0
    assert not searches and second.stats.partition_graphs is None
    assert any("the plan an earlier fit of this model checked" in note for note in second.stats.notes)
    assert any("nothing moves from the second step on" in note for note in second.stats.notes)


def test_where_it_does_not_the_fewest_bytes_that_fit_move(accelerator_memory, reference_peaks, costly_copies):
    plain_peak, all_swapped_peak = reference_peaks
    usable = (plain_peak + all_swapped_peak) // 2
    accelerator_memory(capacity_for(usable))
    backends = []

    def watched(model, options, stats):  # the TensorFlow backend, kept to read the probe's graphs after the fit
        backends.append(TensorFlowBackend(model, options, stats))
        return backends[-1]

    callback = LMS(verbose=0, backend=watched)
    model, history = fit_reference([callback])
    stats, (backend,) = callback.stats, backends
    eligible = [item for item in backend.candidates if backend.executed.holds(item)]
    if stats.replanned:  # the device held more than allowed in the first plan's step: planned for less, said
        assert stats.plan_rule is Rule.BUDGET and stats.budget_bytes < usable, stats.notes
        usable = stats.budget_bytes
    else:
        assert stats.plan_rule is Rule.FITS_DEVICE and stats.budget_bytes == usable
    assert 0 < stats.swapped_tensors < len(eligible)
    # the graphs that ran after the retrace: within 1% of the budget (planned on the probe's graphs with the other
    # swaps undone, which differ a little from the graphs of the plan itself: 704 bytes over 17 MiB here)
    assert stats.device_peak_bytes <= 1.01 * usable
    # within 10% of the fewest bytes any subset of the candidates moves to fit, searched exhaustively on the
    # probe's executed graphs
    assert len(eligible) <= 14
    persistent = stats.persistent_bytes
    fewest = min(sum(item.candidate.nbytes for item in subset)
                 for size in range(len(eligible) + 1) for subset in itertools.combinations(eligible, size)
                 if persistent + backend.executed.transient_peak(list(subset)) <= usable)
    assert stats.swapped_bytes_per_step <= 1.1 * fewest, (stats.swapped_bytes_per_step, fewest)
    assert_same_training(fit_reference(), (model, history))


def test_a_budget_the_step_fits_moves_nothing(lms_options, reference_peaks):
    plain_peak, _ = reference_peaks
    callback = LMS(**{**lms_options, "n_tensors": None, "budget": 2 * plain_peak})
    fit_reference([callback])
    stats = callback.stats
    assert stats.plan_rule is Rule.BUDGET and stats.swapped_bytes_per_step == 0 and stats.steps == 4


def jit_compiled_reference():
    model = models.reference_cnn_small()
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    return model


def test_xla_is_off_while_lms_swaps_and_the_stats_say_so(lms_options):
    callback = LMS(**{**lms_options, "n_tensors": -1})
    x, y = models.images(32, 32)
    model = jit_compiled_reference()
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    stats = callback.stats
    assert stats.swapped_tensors > 0 and stats.jit_compile_off and model.jit_compile  # the model's setting is kept
    assert stats.prediction_source == "executed partition graphs, without XLA"
    assert any(note.startswith("XLA (jit_compile) is off while LMS trains") for note in stats.notes)
    plain = models.reference_cnn_small()  # the same math as a plain fit without XLA, bit for bit
    plain_history = plain.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert_same_training((plain, plain_history), (model, history))


def test_a_plan_that_moves_nothing_gives_xla_back_from_the_second_step(lms_options):
    callback = LMS(**{**lms_options, "n_tensors": None, "budget": "1GiB"})
    x, y = models.images(48, 32)
    model = jit_compiled_reference()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    stats = callback.stats
    assert stats.steps == 1 and not stats.jit_compile_off and model.jit_compile
    assert any("the model trains with its own train function (with XLA" in note for note in stats.notes)
    assert not any(note.startswith("XLA (jit_compile) is off") for note in stats.notes)
