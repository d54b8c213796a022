"""The one interceptor of ``keras.Model.fit`` (``fit_interceptor.py``): the fit the user called is the one
routed, Keras's or a subclass's own, whenever that subclass was defined."""

import keras
import numpy as np

from lms_magic.fit_interceptor import ModelFitReplaced


class Recorded(ModelFitReplaced):
    """Routes each fit as it is, and keeps which ``fit`` was routed and with what arguments."""

    def __init__(self):
        self.routed = []

    def route(self, original, model, args, kwargs):
        self.routed.append((original.__qualname__, args))
        return original(model, *args, **kwargs)


def batching_model_class():
    """A model whose own ``fit`` batches the user's arrays into a dataset, then calls Keras's (as KerasHub's task
    models do)."""

    class Batching(keras.Sequential):
        def fit(self, x=None, y=None, batch_size=None, **kwargs):
            import tensorflow as tf

            dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size or 4)
            return super().fit(dataset, **kwargs)

    return Batching


def test_a_model_class_defined_inside_the_block_has_its_own_fit_routed_with_the_users_arrays():
    x, y = np.ones((8, 3), "float32"), np.ones((8, 1), "float32")
    with Recorded() as interceptor:
        model_class = batching_model_class()  # as a cell that imports KerasHub and builds its task model
        model = model_class([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        model.fit(x, y, batch_size=4, verbose=0)
    ((routed, args),) = interceptor.routed  # the outer fit only: Keras's, called inside it, runs as it is
    assert routed.endswith("Batching.fit") and args[0] is x and args[1] is y
    assert "fit" in model_class.__dict__ and model_class.fit.__qualname__.endswith("Batching.fit")  # its own again
    assert "__init_subclass__" not in keras.Model.__dict__ and "fit" not in keras.Model.__dict__
