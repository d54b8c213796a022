"""The LMS callback on Keras 3 / TensorFlow, proven on two logical CPU devices."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from lms_magic import LMS

from . import models



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
    "sequential cnn, numpy": (models.reference_cnn, lambda: models.images(64, 64), dict(batch_size=32, shuffle=False)),
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
    assert callback.stats["swapped_tensors"] > 0
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
    assert callback.stats["swapped_tensors"] > 0
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
    def elements(shape):
        return int(np.prod(shape))

    # activations were swapped at 2 bytes per element: the float16 compute dtype, not float32
    assert any(row["bytes"] == 2 * elements(row["shape"]) for row in callback.stats["plan"])
    assert_same_training(plain, lms)


def test_mirrored_strategy_on_two_logical_cpus(lms_options):
    strategy = tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"])

    def build():
        with strategy.scope():
            return models.residual_bn_dropout()

    callback = LMS(**lms_options)
    lms = train(build, lambda: models.images(64, 32), [callback], batch_size=16, shuffle=False)
    records = callback.stats["records"]
    assert {r.swap_out.split("/")[0] for r in records} >= {"lms_swap_out"}
    assert len(records) == callback.stats["swapped_tensors"] > 0
    assert_same_training(train(build, lambda: models.images(64, 32), batch_size=16, shuffle=False), lms)


def test_recurrent_layer_is_named_and_left_alone(lms_options):
    def build():
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((12, 8)), keras.layers.Dense(32, activation="relu", name="embed"),
                                  keras.layers.LSTM(16, name="memory"), keras.layers.Dense(10)])
        return models.compiled(model)

    data = (np.random.default_rng(0).random((32, 12, 8), dtype="float32"), np.arange(32) % 10)
    callback = LMS(**lms_options)
    lms = train(build, data, [callback], batch_size=8, shuffle=False)
    assert any("'memory'" in note for note in callback.stats["notes"])
    assert all(row["layer"] != "memory" for row in callback.stats["plan"])
    assert_same_training(train(build, data, batch_size=8, shuffle=False), lms)
