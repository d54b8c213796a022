"""What a traced step builds first (``internals.build_before_trace``): the metrics, loss and optimizer state Keras's
own first ``fit`` builds, the same train step traced after it, and no forward pass of the model run for it where
the model's graph holds its outputs; the predictor sizes the optimizer state off the model's own, once built."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from lms_magic import internals
from lms_magic.lms.persistent import persistent_bytes
from lms_magic.lms.tensorflow.predictor import TensorFlowStepPredictor


class Counted(keras.layers.Layer):
    """Its input, counting the calls (a forward pass run symbolically calls it too)."""

    calls = 0

    def call(self, x):
        Counted.calls += 1
        return x


def two_heads():
    """A dict of two outputs, a loss and metrics per output."""
    inputs = keras.Input((8,), name="x")
    hidden = Counted()(keras.layers.Dense(6, activation="relu")(inputs))
    model = keras.Model(inputs, {"a": keras.layers.Dense(3, name="a")(hidden),
                                 "b": keras.layers.Dense(1, activation="sigmoid", name="b")(hidden)})
    model.compile("adam", {"a": "mse", "b": "binary_crossentropy"}, metrics={"a": ["mae"], "b": ["accuracy"]})
    return model, (np.zeros((5, 8), "float32"), {"a": np.zeros((5, 3), "float32"), "b": np.zeros((5, 1), "float32")})


def weighted_logits():
    """Logits, sample weights and weighted metrics ("accuracy" resolves by the output's last dimension)."""
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(4)(Counted()(inputs)))
    model.compile(keras.optimizers.SGD(momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy", "sparse_top_k_categorical_accuracy"], weighted_metrics=["accuracy"])
    return model, (np.zeros((5, 8), "float32"), np.zeros(5, "int32"), np.ones(5, "float32"))


def sequential():
    model = keras.Sequential([keras.Input((8,)), Counted(), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("rmsprop", "binary_crossentropy", metrics=["accuracy", "auc"])
    return model, (np.zeros((5, 8), "float32"), np.zeros((5, 1), "float32"))


def specs(data, batch=7):
    return tuple(tf.nest.map_structure(lambda a: tf.TensorSpec((batch,) + a.shape[1:], tf.as_dtype(a.dtype)), data))


def unnumbered(name: str) -> str:
    """A name without Keras's and TensorFlow's uniquifying numbers ("dense_3/" -> "dense/")."""
    return re.sub(r"_\d+(?=[/_:()]|$)", "", name)


def built_state(model, data) -> tuple:
    """What a fit's first build made (variables by name and shape) and the train step traced after it."""
    variables = sorted(f"{unnumbered(v.path)}{tuple(v.shape)}" for v in [*model.metrics_variables,
                                                                        *model.optimizer.variables])
    graph = tf.function(model.train_step, autograph=False).get_concrete_function(specs(data)).graph
    return variables, [(op.type, unnumbered(op.name)) for op in graph.get_operations()]


@pytest.mark.parametrize("build", [two_heads, weighted_logits, sequential])
def test_the_build_is_keras_s_own_without_a_forward_pass(build):
    keras.utils.set_random_seed(0)
    ours, data = build()
    keras.utils.set_random_seed(0)
    theirs, _ = build()
    Counted.calls = 0
    assert internals.build_before_trace(ours, specs(data))
    assert Counted.calls == 0  # the outputs' shapes were read off the model's graph
    theirs._symbolic_build(data_batch=specs(data))
    assert Counted.calls == 1
    assert built_state(ours, data) == built_state(theirs, data)


def test_a_model_with_its_own_call_is_built_by_keras():
    """A subclassed model's outputs are known only by calling it: Keras's build runs its forward pass."""

    class Own(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(Counted()(x))

    model = Own()
    model(np.zeros((1, 8), "float32"))
    model.compile("adam", "mse", metrics=["mae"])
    Counted.calls = 0
    assert internals.build_before_trace(model, specs((np.zeros((5, 8), "float32"), np.zeros((5, 2), "float32"))))
    assert Counted.calls == 1 and model.optimizer.built and model._compile_metrics.built


def test_the_predictor_sizes_the_optimizer_state_off_the_model_s_own(monkeypatch):
    """Predicting builds the model's optimizer (as its first trace, or fit, does) and counts its state from it,
    making no second optimizer (before it: a copy, its state allocated); the metrics' variables, built with it, count."""
    keras.utils.set_random_seed(0)
    model, data = weighted_logits()
    copies = []
    from_config = type(model.optimizer).from_config
    monkeypatch.setattr(type(model.optimizer), "from_config",
                        classmethod(lambda cls, config: copies.append(config) or from_config(config)))
    before = persistent_bytes(model)  # the optimizer not built: counted on a copy
    assert len(copies) == 1
    predictor = TensorFlowStepPredictor(model, data)
    predicted = predictor.predict(0, 1, 16)
    assert len(copies) == 1 and model.optimizer.built
    assert predicted.persistent_bytes == predictor.persistent_bytes == persistent_bytes(model) > before
