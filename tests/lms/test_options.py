"""LMS options, budgets, messages, and the model left as it was in every case."""

import keras
import numpy as np
import pytest

from lms_magic import LMS, LMSKerasCallback, fit_generator
from lms_magic.lms.plan import BudgetError

from . import models


def fit(model, callbacks=(), epochs=1, **options):
    x, y = models.images(64, 32)
    return model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, shuffle=False, callbacks=list(callbacks),
                     **options)




def test_n_tensors_swaps_the_first_n(lms_options):
    everything = LMS(**lms_options)
    fit(models.residual_bn_dropout(), [everything])
    first_two = LMS(**{**lms_options, "n_tensors": 2})
    fit(models.residual_bn_dropout(), [first_two])
    assert first_two.stats["swapped_tensors"] == 2
    def where(plan):  # tensor names differ between two model instances; layer types and shapes do not
        return [(row["layer_type"], row["shape"]) for row in plan]

    assert where(first_two.stats["plan"]) == where(everything.stats["plan"])[:2]


def test_n_tensors_zero_is_off(lms_options, capsys):
    callback = LMS(**{**lms_options, "n_tensors": 0, "verbose": 1})
    model = models.residual_bn_dropout()
    fit(model, [callback])
    assert callback.stats["active"] is False and "n_tensors=0" in callback.stats["reason"]
    assert "train_step" not in model.__dict__


def test_min_bytes_and_layer_filters(lms_options):
    big_only = LMS(**{**lms_options, "min_bytes": 64 * 1024})
    fit(models.residual_bn_dropout(), [big_only])
    assert big_only.stats["plan"] and all(row["bytes"] >= 64 * 1024 for row in big_only.stats["plan"])
    no_conv = LMS(exclude_types=("Conv2D",), **lms_options)
    fit(models.residual_bn_dropout(), [no_conv])
    assert no_conv.stats["plan"] and all(row["layer_type"] != "Conv2D" for row in no_conv.stats["plan"])


def test_budget_swaps_the_fewest_that_fit(lms_options):
    everything = LMS(**lms_options)
    fit(models.reference_cnn_small(), [everything])
    low, high = everything.stats["device_peak_bytes"], everything.stats["device_peak_bytes_without_lms"]
    budget = (low + high) // 2
    callback = LMS(budget=budget, **lms_options)
    fit(models.reference_cnn_small(), [callback])
    assert 0 < callback.stats["swapped_tensors"] < everything.stats["swapped_tensors"]
    assert callback.stats["device_peak_bytes"] <= budget * 1.1  # executed graph; planned on the traced one


@pytest.mark.parametrize("above_weights, words", [
    (None, "weights and optimizer state alone take .* LMS swaps activations, not weights"),  # as %lms_tune says
    (1024, "lowest predicted device peak of any plan tried is .* above the budget"),
])
def test_impossible_budget_fails_before_training_and_keeps_the_model(lms_options, above_weights, words):
    from lms_magic.lms.predict import variables_bytes

    model = models.reference_cnn_small()
    weights = [w.copy() for w in model.get_weights()]
    budget = 1024 if above_weights is None else variables_bytes(model) + above_weights
    with pytest.raises(BudgetError, match=words):
        fit(model, [LMS(budget=budget, **lms_options)])
    assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
    assert "train_step" not in model.__dict__
    fit(model)  # plain training still works


def test_no_gpu_and_no_device_does_nothing_and_says_so_once(capsys):
    from lms_magic.lms import callback as callback_module

    callback_module._said_no_gpu = False
    first, second = LMS(), LMS()
    fit(models.residual_bn_dropout(), [first])
    fit(models.residual_bn_dropout(), [second])
    assert capsys.readouterr().out.count("no GPU found") == 1
    assert first.stats["active"] is False and first.stats["reason"] == "no GPU"


def test_summary_line_at_the_start_of_training(lms_options, capsys):
    fit(models.residual_bn_dropout(), [LMS(**{**lms_options, "verbose": 1})], epochs=2)
    out = capsys.readouterr().out
    assert out.count("LMS: swapping") == 1
    assert "predicted /CPU:0 peak" in out and "MiB without" in out


def test_stats_keys_and_plan_rows(lms_options):
    callback = LMS(**lms_options)
    fit(models.residual_bn_dropout(), [callback])
    stats = callback.stats
    assert stats["swapped_bytes_per_step"] == sum(row["bytes"] for row in stats["plan"])
    assert stats["device_peak_bytes"] < stats["device_peak_bytes_without_lms"]
    assert set(stats["plan"][0]) >= {"layer", "shape", "bytes", "lb"}
    # typed: attributes and the keys users read agree, the peak says it is a prediction, the export is plain
    assert stats.swapped_tensors == stats["swapped_tensors"] == len(stats.plan)
    assert stats.backend == "tensorflow" and stats.peak_source == "predicted" and stats.lb_counts == "backward ops"
    assert stats.predicted_device_peak_bytes == stats.device_peak_bytes and stats.measured_device_peak_bytes is None
    exported = stats.to_dict()
    assert {"swapped_tensors", "swapped_bytes_per_step", "device_peak_bytes", "device_peak_bytes_without_lms",
            "peak_source", "lb_counts", "plan", "notes"} <= set(exported)
    assert "records" not in exported and "partition_graphs" not in exported  # graph objects stay behind
    with pytest.raises(KeyError, match="swapped_tensors"):  # a misspelt key names the real ones
        stats["swaped_tensors"]
    with pytest.raises(AttributeError):
        stats.update(swaped_tensors=1)


def test_second_fit_works_and_removing_the_callback_restores_plain_training(lms_options):
    model = models.residual_bn_dropout()
    callback = LMS(**lms_options)
    fit(model, [callback])
    fit(model, [callback])
    assert callback.stats["swapped_tensors"] > 0
    fit(model)
    assert "train_step" not in model.__dict__
    assert type(model.train_function).__name__ != "_LmsTrainFunction"


class InterruptAt(keras.callbacks.Callback):
    def __init__(self, batch, error=KeyboardInterrupt):
        super().__init__()
        self.batch, self.error = batch, error

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            raise self.error()


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_interrupted_fit_leaves_no_lms_behind(lms_options, error):
    model = models.residual_bn_dropout()
    with pytest.raises(error):
        fit(model, [LMS(**lms_options), InterruptAt(1, error)])
    history = fit(model)  # the next plain fit heals the model before its first step
    assert len(history.history["loss"]) == 1
    assert "train_step" not in model.__dict__
    assert type(model.train_function).__name__ != "_LmsTrainFunction"


@pytest.mark.parametrize("options, words", [
    ({"lb": 0}, "lb must be a whole number >= 1"), ({"n_tensors": -3}, "-1 \\(all\\)"),
    ({"budget": "lots"}, "not a memory size"),
    ({"device": "/GPU:7"}, "device='/GPU:7' is not a device of this process, which has /CPU:0, /CPU:1"),
    ({"device": "banana"}, "device='banana' is not a device of this process, which has /CPU:0, /CPU:1: pass one"),
    ({"device": "/CPU:0", "host_device": "/CPU:9"}, "host_device='/CPU:9' is not a device"),
])
def test_bad_options_say_what_to_do(options, words):
    with pytest.raises(ValueError, match=words):
        fit(models.residual_bn_dropout(), [LMS(verbose=0, **options)])


@pytest.mark.parametrize("options, words", [
    ({"device": 0}, "device takes a device name such as '/GPU:0'"),
    ({"include_layers": 3}, "include_layers takes a layer name or a list of them"),
    ({"exclude_types": ["Dense", 7]}, "exclude_types takes names \\(strings\\) or layer classes, got 7"),
])
def test_bad_arguments_are_refused_at_construction(options, words):
    with pytest.raises(ValueError, match=words):
        LMS(verbose=0, **options)


def test_one_name_as_a_string_is_one_name_not_its_letters(lms_options):
    model = models.residual_bn_dropout()
    conv = next(layer.name for layer in model.layers if isinstance(layer, keras.layers.Conv2D))
    by_string, by_list = LMS(include_layers=conv, **lms_options), LMS(include_layers=[conv], **lms_options)
    assert by_string.selection == by_list.selection
    fit(model, [by_string])
    assert by_string.stats["swapped_tensors"] > 0
    assert {row["layer"] for row in by_string.stats["plan"]} == {conv}
    by_class = LMS(include_types=keras.layers.Dense, **lms_options)
    assert by_class.selection.include_types == ("Dense",)


def test_names_that_match_no_layer_are_said(lms_options):
    callback = LMS(include_layers="dense_x", exclude_types=["Conv2d"], **lms_options)
    fit(models.residual_bn_dropout(), [callback])
    assert "include_layers names no layer of the model: 'dense_x'" in callback.stats["notes"]
    assert "exclude_types names no layer type of the model: 'Conv2d'" in callback.stats["notes"]


def test_tflms_and_lms_names_both_work_and_must_agree():
    assert LMSKerasCallback(host_device="/CPU:1").host_device == "/CPU:1"
    assert LMSKerasCallback(cpu_device="/cpu:1").host_device == "/cpu:1"
    assert LMSKerasCallback(cpu_device="/cpu:1", host_device="/device:CPU:1").host_device == "/device:CPU:1"
    assert LMSKerasCallback(incl_scopes="dense_a").selection.include_layers == ("dense_a",)
    with pytest.raises(ValueError, match="cpu_device='/CPU:0' and host_device='/CPU:1' say different things"):
        LMSKerasCallback(cpu_device="/CPU:0", host_device="/CPU:1")
    with pytest.raises(ValueError, match="excl_types=.* and exclude_types=.* say different things"):
        LMSKerasCallback(excl_types=["Dense"], exclude_types=["Conv2D"])


def test_tflms_names_work_through_the_alias(lms_options):
    callback = LMSKerasCallback(n_tensors=3, lb=2, excl_types=("Dense",), cpu_device="/CPU:1", device="/CPU:0",
                                min_bytes=0, verbose=0, starting_scope="conv")
    fit(models.residual_bn_dropout(), [callback])
    assert callback.stats["swapped_tensors"] == 3 and callback.lb == 2
    assert all(row["layer_type"] != "Dense" for row in callback.stats["plan"])
    assert any("ignored TFLMS option(s) starting_scope" in note for note in callback.stats["notes"])


def test_fit_generator_runs_old_code_with_lms(lms_options):
    x, y = models.images(64, 32)

    def batches():
        while True:
            for start in range(0, 64, 16):
                yield x[start:start + 16], y[start:start + 16]

    callback = LMS(**lms_options)
    history = fit_generator(models.residual_bn_dropout(), batches(), steps_per_epoch=4, epochs=2, verbose=0,
                            callbacks=[callback])
    assert len(history.history["loss"]) == 2 and callback.stats["swapped_tensors"] > 0
    with pytest.warns(UserWarning, match="workers are ignored"):
        fit_generator(models.residual_bn_dropout(), batches(), steps_per_epoch=1, verbose=0, workers=4)


def test_fit_generator_shuffles_a_pydataset_and_does_not_warn_about_a_generator():
    """Keras 2's fit_generator shuffled only Sequences (now PyDataset); Keras 3 warns when fit gets shuffle=True
    with a generator, which the old default would have passed on every legacy call."""
    import warnings

    x, y = models.images(64, 32)

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return x[16 * index:16 * index + 16], y[16 * index:16 * index + 16]

    def batches():
        while True:
            yield x[:16], y[:16]

    model = models.reference_cnn_small()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_generator(model, batches(), steps_per_epoch=2, verbose=0)
    assert not [w for w in caught if "shuffle" in str(w.message)], [str(w.message) for w in caught]
    seen = []

    class Recording(Batches):
        def __getitem__(self, index):
            seen.append(index)
            return super().__getitem__(index)

    keras.utils.set_random_seed(3)
    fit_generator(model, Recording(), epochs=3, verbose=0)
    assert sorted(seen[-12:]) == sorted([0, 1, 2, 3] * 3)
    assert seen[-12:] != [0, 1, 2, 3] * 3  # the batches came in a shuffled order, as Keras 2 shuffled a Sequence


def test_outside_the_supported_versions_lms_refuses_before_changing_anything(lms_options, monkeypatch):
    from lms_magic import compat

    monkeypatch.setitem(compat.SUPPORTED, "keras", ("3.0", "3.1"))
    model = models.residual_bn_dropout()
    with pytest.raises(RuntimeError, match=r"keras 3\.\d+\.\d+ \(supported: 3\.0 to 3\.1\)\. Install a supported "
                                           r"version, or set LMS_MAGIC_SKIP_VERSION_CHECK=1"):
        fit(model, [LMS(**lms_options)])
    assert "train_step" not in model.__dict__
    monkeypatch.setenv("LMS_MAGIC_SKIP_VERSION_CHECK", "1")
    callback = LMS(**lms_options)
    fit(model, [callback])
    assert callback.stats["swapped_tensors"] > 0
