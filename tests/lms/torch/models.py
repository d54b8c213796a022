"""Small models on Keras's PyTorch backend, and their training, for the PyTorch LMS tests."""

import keras
import numpy as np


def cnn(seed=1, layers=4, size=16):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((size, size, 3))]
                             + [keras.layers.Conv2D(8, 3, padding="same", activation="relu") for _ in range(layers)]
                             + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def residual_bn_dropout(seed=3):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, padding="same")(inputs)
    for _ in range(3):
        branch = keras.layers.Conv2D(8, 3, padding="same")(x)
        branch = keras.layers.BatchNormalization()(branch)
        branch = keras.layers.Dropout(0.2)(keras.layers.Activation("relu")(branch))
        x = keras.layers.Add()([x, branch])
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x)))
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def images(n=64, size=16):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, size, size, 3)).astype("float32"), rng.integers(0, 10, n)


def train(build, data, callback=None, epochs=2):
    """A fresh model of ``build`` trained on ``data``; returns (model, history dict)."""
    model = build()
    keras.utils.set_random_seed(7)
    history = model.fit(*data, batch_size=16, epochs=epochs, verbose=0, callbacks=[callback] if callback else [])
    return model, history.history
