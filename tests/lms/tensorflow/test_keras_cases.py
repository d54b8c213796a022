"""Fits Keras's own tests make that LMS once refused or broke (each passed without LMS): an eager model, a model
with nothing to train (Keras never builds its optimizer), an optional input passed as None, and a strategy over
CPUs alone. LMS trains each, or steps aside with a note where it cannot help; the fit is a plain fit's.
The whole of Keras's trainer, model and callback tests with LMS in every fit: ``make test-keras``."""

import keras
import numpy as np
import tensorflow as tf

from lms_magic import LMS


def dense_model(**compile_options):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile("adam", "mse", **compile_options)
    return model


def data(n=32):
    rng = np.random.default_rng(0)
    return rng.random((n, 8), dtype="float32"), rng.random((n, 1), dtype="float32")


def test_an_eager_model_trains_without_lms_and_is_told_why(lms_options):
    callback = LMS(**lms_options)
    plain = dense_model(run_eagerly=True).fit(*data(), batch_size=8, verbose=0).history["loss"]
    losses = dense_model(run_eagerly=True).fit(*data(), batch_size=8, verbose=0, callbacks=[callback]).history["loss"]
    assert losses == plain
    assert not callback.stats.active and "eagerly" in callback.stats.reason


def test_a_model_whose_optimizer_keras_never_builds_trains_with_lms(lms_options):
    """Nothing to train, ragged data (no state built before the trace): LMS sizes the optimizer's state eagerly
    from inside the trace, not with a call that needs eager execution there."""

    class Identity(keras.layers.Layer):
        def call(self, x):
            return x

    model = keras.Sequential([Identity()])
    model.compile("adam", loss=lambda y, y_pred, sample_weight=None: 0.0)
    x = tf.ragged.constant([[1.0], [2.0, 3.0]])
    callback = LMS(**lms_options)
    history = model.fit(x, x, verbose=0, callbacks=[callback])
    assert history.history["loss"] == [0.0] and callback.stats.persistent_bytes is not None


def test_an_optional_input_passed_as_none_trains_with_lms(lms_options):
    keras.utils.set_random_seed(0)
    x_in, extra_in = keras.Input((8,), name="x"), keras.Input((8,), name="extra", optional=True)

    class AddIfGiven(keras.layers.Layer):
        def call(self, x, extra=None):
            return x if extra is None else x + extra

    model = keras.Model({"x": x_in, "extra": extra_in}, keras.layers.Dense(1)(AddIfGiven()(x_in, extra_in)))
    model.compile("adam", "mse")
    x, y = data()
    callback = LMS(**lms_options)
    model.fit({"x": x, "extra": None}, y, batch_size=8, verbose=0, callbacks=[callback])
    assert callback.stats.batch_size == 8


def test_a_strategy_over_cpus_alone_trains_without_lms_and_is_told_why(devices):
    strategy = tf.distribute.MirroredStrategy([devices.accelerator, devices.host])
    with strategy.scope():
        model = dense_model()
    callback = LMS(verbose=0)
    model.fit(*data(), batch_size=8, verbose=0, callbacks=[callback])
    assert not callback.stats.active and callback.stats.reason == "no GPU"
