"""recompute on Keras's PyTorch backend (lms/torch/recompute.py): cheap layers run under torch.utils.checkpoint,
their saved activations dropped after the forward pass and computed again, to the bit."""

import keras
import numpy as np
import pytest

from lms_magic import LMS
from lms_magic.lms.torch.backend import TorchBackend

from tests.models import small_images as images, small_residual_bn_dropout as residual_bn_dropout, train


def counted_lms(**options):
    """An LMS callback and the list its PyTorch engine lands in (to read what the offloader saw)."""
    engines = []
    callback = LMS(backend=lambda *made: engines.append(TorchBackend(*made)) or engines[-1], verbose=0, **options)
    return callback, engines


def assert_same_variables(a, b):
    """Weights, moving statistics and seed generator states alike."""
    for x, y in zip(a.variables, b.variables, strict=True):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=x.path)


def test_recompute_only_trains_to_the_bit_moves_nothing_and_lowers_the_predicted_peak(data):
    plain, plain_history = train(residual_bn_dropout, data)
    callback, engines = counted_lms(recompute="only", min_bytes=0)
    model, history = train(residual_bn_dropout, data, callback)
    stats = callback.stats
    assert history == plain_history
    assert_same_variables(plain, model)
    # the three BatchNormalizations: their centred copies and statistics are computed again
    assert stats.recomputed_tensors >= 3 and stats.recomputed_bytes_per_step > 0
    assert {row["layer_type"] for row in stats.plan if row["action"] == "recompute"} == {"BatchNormalization"}
    assert stats.swapped_tensors == 0 and engines[-1].offloader.pool.allocations == 0  # not in the first step either
    assert stats.device_peak_bytes < stats.device_peak_bytes_without_lms
    assert "recompute='only': 3 of 9 cheap layers" in " ".join(stats.notes)
    assert f"recomputing {stats.recomputed_tensors} saved activations in 3 layers" in callback.summary()
    assert "nothing offloaded to host memory" in callback.summary()
    assert not any("call" in vars(layer) for layer in model.layers)


def test_what_autograd_keeps_is_what_the_plan_modelled_and_less_than_without(data, monkeypatch):
    """From the second step on the offloader is made to watch every saved activation (as in the first step), so
    the step's saves are counted: they are the plan's model of them, in order, and fewer bytes than the first
    step's, which ran without recomputes."""
    from lms_magic.lms.torch import backend

    choices, choose = [], backend.choose_recomputes
    monkeypatch.setattr(backend, "choose_recomputes", lambda *args: choices.append(choose(*args)) or choices[-1])
    callback, engines = counted_lms(recompute="only", min_bytes=0)

    class WatchAll(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            engines[-1].offloader.watch_all = batch > 0

    model = residual_bn_dropout()
    model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[callback, WatchAll()])
    offloader = engines[-1].offloader
    # the layers' saves: the loss's, outside any layer, are two tensors in the first step (watched) and one later
    real = [c for c in offloader.last_candidates if c.layer]
    modelled = [c for c in choices[-1].saved if c.layer]
    assert [(c.layer, c.shape) for c in real] == [(c.layer, c.shape) for c in modelled]
    kept = sum(c.nbytes for c in real)
    assert kept == sum(c.nbytes for c in modelled) < sum(c.nbytes for c in offloader.candidates if c.layer)


def test_the_hybrid_plan_fits_a_budget_with_less_traffic_than_swaps_alone(data):
    """recompute=True: the budget is met recomputing instead of offloading (fewer bytes over the link)."""
    plain, plain_history = train(residual_bn_dropout, data)
    probe = LMS(min_bytes=0, verbose=0)
    train(residual_bn_dropout, data, probe, epochs=1)
    budget = int(0.8 * probe.stats.device_peak_bytes_without_lms)
    swaps, hybrid = LMS(budget=budget, min_bytes=0, verbose=0), LMS(budget=budget, recompute=True, min_bytes=0,
                                                                    verbose=0)
    train(residual_bn_dropout, data, swaps)
    model, history = train(residual_bn_dropout, data, hybrid)
    assert hybrid.stats.recomputed_tensors > 0 and hybrid.stats.device_peak_bytes <= budget
    assert hybrid.stats.swapped_bytes_per_step < swaps.stats.swapped_bytes_per_step
    assert history == plain_history
    assert_same_variables(plain, model)


def test_where_recomputing_would_raise_the_peak_swaps_alone_stand_and_it_is_said(data):
    """Every activation offloaded, one read ahead: a recomputed BatchNormalization brings its tensors back
    together with its input, above what swapping them one by one holds."""
    swaps, hybrid = LMS(n_tensors=-1, min_bytes=0, verbose=0), LMS(n_tensors=-1, recompute=True, min_bytes=0,
                                                                   verbose=0)
    train(residual_bn_dropout, data, swaps, epochs=1)
    train(residual_bn_dropout, data, hybrid, epochs=1)
    assert hybrid.stats.recomputed_tensors == 0
    assert hybrid.stats.device_peak_bytes == swaps.stats.device_peak_bytes
    assert any(note.endswith("is above swaps alone (" + note.split("(")[-1]) for note in hybrid.stats.notes)
    assert any("swaps alone" in note for note in hybrid.stats.notes)


class Block(keras.Model):
    """A subclassed model: its layers are attributes, called in ``call``."""

    def __init__(self):
        super().__init__()
        self.conv = keras.layers.Conv2D(8, 3, padding="same")
        self.norm = keras.layers.BatchNormalization()
        self.act = keras.layers.Activation("relu")
        self.drop = keras.layers.Dropout(0.3)
        self.head = keras.layers.Dense(10)

    def call(self, x, training=None):
        x = self.drop(self.act(self.norm(self.conv(x), training=training)), training=training)
        return self.head(keras.ops.mean(x, axis=(1, 2)))


def subclassed():
    keras.utils.set_random_seed(3)
    model = Block()
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_a_subclassed_model_recomputes_to_the_bit(data):
    plain, plain_history = train(subclassed, data)
    callback = LMS(recompute="only", min_bytes=0, verbose=0)
    model, history = train(subclassed, data, callback)
    assert callback.stats.recomputed_tensors > 0
    assert history == plain_history
    assert_same_variables(plain, model)


def test_a_step_that_fails_leaves_every_layer_as_keras_made_it(data):
    calls = {"loss": 0}

    def failing_loss(y_true, y_pred):
        calls["loss"] += 1
        if calls["loss"] == 2:  # the second step: the recomputing one
            raise KeyboardInterrupt
        return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)

    model = residual_bn_dropout()
    model.compile("sgd", failing_loss)
    with pytest.raises(KeyboardInterrupt):
        model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[LMS(recompute="only", min_bytes=0,
                                                                             verbose=0)])
    assert not any("call" in vars(layer) for layer in model.layers)
    model.fit(*data, batch_size=16, epochs=1, verbose=0)  # and it trains plainly after it


@pytest.mark.release
def test_densenet121_recomputes_to_the_bit_at_a_lower_predicted_peak():
    def densenet():
        keras.utils.set_random_seed(5)
        model = keras.applications.DenseNet121(weights=None, input_shape=(32, 32, 3), classes=10,
                                               classifier_activation=None)
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    data = images(n=8, size=32)
    plain, plain_history = train(densenet, data, epochs=1)
    callback = LMS(recompute="only", min_bytes=0, verbose=0)
    model, history = train(densenet, data, callback, epochs=1)
    stats = callback.stats
    assert history == plain_history
    assert stats.recomputed_tensors > 100
    assert stats.device_peak_bytes < 0.95 * stats.device_peak_bytes_without_lms
