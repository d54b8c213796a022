"""A trace's shapes at another batch size from TensorFlow's shape inference (``rescale.dims_at``): what a trace at that
batch size gives, or nothing where it cannot be trusted, never a wrong shape."""

import keras
import pytest
import tensorflow as tf

from lms_magic import internals
from lms_magic.lms.tensorflow.rescale import dims_at, fixed_dims, prime_batch
from tests import models

from .test_predictor import attention
from .real_models import reduced


def embedding():
    """Token ids through an Embedding (a gather from a variable: its shape read through the variable's handle)."""
    keras.utils.set_random_seed(3)
    inputs = keras.Input((12,), dtype="int32")
    x = keras.layers.Embedding(500, 16)(inputs)
    x = keras.layers.MultiHeadAttention(2, 8)(x, x)
    return keras.Model(inputs, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(x)))


def traced(model, batch: int):
    dtype = model.inputs[0].dtype
    specs = (tf.TensorSpec((batch,) + tuple(model.input_shape[1:]), dtype), tf.TensorSpec((batch,), tf.int32))
    internals.build_before_trace(model, specs)
    return tf.function(model.train_step, autograph=False).get_concrete_function(specs).graph


def shapes(graph) -> dict:
    return {tensor.name: tensor.shape.as_list() for op in graph.get_operations() for tensor in op.outputs
            if tensor.shape.rank is not None and tensor.dtype not in (tf.resource, tf.variant)}


def compiled(build):
    model = build()
    model.compile(keras.optimizers.Adam(), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.parametrize("build", [models.residual_bn_dropout, reduced("resnet"), reduced("efficientnet"), attention,
                                   embedding], ids=["residual", "resnet", "efficientnet", "attention", "embedding"])
def test_the_shapes_imported_are_a_trace_at_that_batch(build):
    """ResNet's 7x7 stem and 10 classes, EfficientNet's squeeze-excite zeros (a constant of the batch's shape), the
    attention block's (batch * 12, 16) reshapes, the embedding's gather: each tensor's shape at 40 as traced (a
    batch below the one traced: test_predictor.py)."""
    model = compiled(build)
    first = prime_batch(8, fixed_dims(model, [model.input_shape[1:]]))
    assert dims_at(traced(model, first), first, 40) == shapes(traced(model, 40))


def test_a_batch_that_divides_the_model_s_dimensions_is_refused():
    """Traced at 7, ResNet's 7x7 kernels' shapes are multiples of the batch: the import scales them too, and what it
    gets is refused rather than used."""
    model = compiled(reduced("resnet"))
    assert dims_at(traced(model, 7), 7, 11) is None
    assert prime_batch(7, [7, 3, 64]) == 11


def similarities(flat: bool):
    """Each sample's similarity to every other (batch x batch), or those flattened (batch * batch) and summed."""
    keras.utils.set_random_seed(4)
    inputs = keras.Input((6,))
    x = keras.layers.Dense(6)(inputs)
    if flat:
        x = keras.layers.Lambda(lambda x: x + tf.reduce_sum(tf.reshape(tf.matmul(x, x, transpose_b=True), [-1])))(x)
    else:
        x = keras.layers.Lambda(lambda x: tf.matmul(x, x, transpose_b=True) @ x)(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def test_a_dimension_that_grows_as_the_batch_s_square_is_refused():
    """batch x batch: each dimension is the batch, as a trace gives it; batch * batch in one dimension is not a
    multiple of the batch traced: refused, not scaled as one."""
    model = compiled(lambda: similarities(flat=False))
    assert dims_at(traced(model, 11), 11, 13) == shapes(traced(model, 13))
    assert dims_at(traced(compiled(lambda: similarities(flat=True)), 11), 11, 13) is None


def test_the_swaps_lms_adds_after_an_inference_get_the_dimensions_a_new_inference_finds():
    """A step traced at an unknown batch is inferred once: the swap ops LMS adds to it later take their input's
    dimensions, as inferring the rewritten graph again finds them (a sequence length read off the input is not the
    batch)."""
    from lms_magic.lms.tensorflow.rescale import dims_inferred

    def traced():
        def step(x):
            return tf.zeros(tf.stack([tf.shape(x)[0], tf.shape(x)[1], 7]))
        return tf.function(step).get_concrete_function(tf.TensorSpec([None, 5], tf.float32)).graph

    def swapped(graph):
        zeros = next(op for op in graph.get_operations() if op.type == "Fill").outputs[0]
        with graph.as_default():
            out = tf.raw_ops.EnsureShape(input=zeros, shape=zeros.shape)
            return tf.raw_ops.Snapshot(input=out).name

    inferred_first, rewritten = traced(), traced()
    dims_inferred(inferred_first, 8)  # the plan's inference, before the rewrite
    name_first, name_rewritten = swapped(inferred_first), swapped(rewritten)
    assert dims_inferred(inferred_first, 8)[name_first] == dims_inferred(rewritten, 8)[name_rewritten] == [8, 5, 7]
