"""The model the tests of several devices and processes train under a mesh (imported by their fresh processes)."""

import keras


def mlp(optimizer: str = "adam"):
    """Dense 256 ("wide"), Dense 256 ("wider"), Dense 10 over 64 features: kernels a LayoutMap can split."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu", name="wide"),
                              keras.layers.Dense(256, activation="relu", name="wider"), keras.layers.Dense(10)])
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
