"""Keras's private API (and tf.data's, which Keras's data adapters hand on), the one interceptor of
``keras.Model.fit``, and the checks of whether TensorFlow's and JAX's runtimes have started: the package's private
framework access outside the backend folders, whose own is in ``lms/tensorflow/internals.py`` (graph collection,
graph surgery, the model's layer tree), ``lms/torch/internals.py`` (the layers being called) and
``lms/jax/internals.py`` (a jaxpr equation bound again).

One module a job: ``patching`` (attributes replaced and restored), ``fit_interceptor`` (``fit``), ``model`` (the
layer tree, XLA, the state built before tracing), ``graph_release`` (intermediates freed after their last
reader), ``frames`` (the calling ``fit``'s batch size), ``data`` (a fit's batches as Keras reads them) and
``runtimes``. The rest of the package calls these helpers, never a private attribute, so a framework release
that moves one of them breaks here (``versions.py`` holds the tested range). Importing this package imports no
framework: each helper imports what it needs.
"""

from .data import numpy_batches, reshuffles_each_iteration
from .fit_interceptor import ModelFitReplaced
from .frames import called_from, calling_frames, fit_batch_size
from .graph_release import graph_intermediates_released, graph_release_plan
from .model import build_before_trace, build_for_training, jit_compile_requested, layer_types, layers_of
from .patching import instance_attribute_replaced, layer_calls_replaced, train_step_replaced
from .runtimes import jax_started, tensorflow_started

__all__ = ["ModelFitReplaced", "build_before_trace", "build_for_training", "called_from", "calling_frames",
           "fit_batch_size", "graph_intermediates_released", "graph_release_plan", "instance_attribute_replaced",
           "jax_started", "jit_compile_requested", "layer_calls_replaced", "layer_types", "layers_of",
           "numpy_batches", "reshuffles_each_iteration", "tensorflow_started", "train_step_replaced"]
