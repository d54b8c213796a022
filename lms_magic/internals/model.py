"""A Keras model's private parts the package reads: its layer tree, whether XLA was asked for, and its state
built before the train step is traced."""

from __future__ import annotations

def layers_of(model) -> list:
    """Every layer of ``model``, nested ones included."""
    return list(model._flatten_layers(include_self=False, recursive=True))


def layer_types(model) -> dict[str, str]:
    """Every layer of ``model``, nested ones included: layer name -> class name (the first of a name wins)."""
    found: dict[str, str] = {}
    for layer in layers_of(model):
        found.setdefault(layer.name, type(layer).__name__)
    return found


def jit_compile_requested(model) -> bool:
    """Whether the model would compile its train step with XLA / torch.compile."""
    return bool(model.jit_compile)


def build_for_training(model, data_batch) -> bool:
    """Builds the model's metrics and loss on ``data_batch`` as a first ``fit`` does; False where Keras can't."""
    build = getattr(model, "_symbolic_build", None)
    if build is None:
        return False
    build(data_batch=data_batch)
    return True


def build_before_trace(model, element_spec) -> bool:
    """Builds the model's metrics, loss and optimizer state on the batch's ``element_spec`` (the train function's
    iterator's) before its first trace, as Keras does itself under a distribution strategy. Without one, Keras builds
    them inside the first trace, and TensorFlow traces a function whose first trace made variables a second time.

    False where nothing was built: nothing left to build, a distribution strategy (Keras builds them in its scope
    before a fit's first trace), a layer not built yet (its initial weights are drawn in the trace, as Keras draws
    them), a batch not of dense tensors, or a build that failed (the trace builds what this did not, as without it).
    """
    import tensorflow as tf

    if getattr(model, "_distribute_strategy", None) is not None:
        return False
    leaves = tf.nest.flatten(element_spec) if element_spec is not None else []
    if not leaves or not all(type(leaf) is tf.TensorSpec for leaf in leaves):
        return False
    parts = (getattr(model, "optimizer", None), getattr(model, "_compile_metrics", None),
             getattr(model, "_compile_loss", None))
    if all(part is None or part.built for part in parts):
        return False
    if not all(layer.built for layer in model._flatten_layers()):
        return False
    try:
        return _built_from_outputs(model, element_spec) or build_for_training(model, element_spec)
    except Exception:  # a best effort: the first trace builds what this did not
        return False


def _built_from_outputs(model, element_spec) -> bool:
    """``Trainer._symbolic_build`` without the symbolic forward pass: the metrics and loss built on the outputs
    a Functional (or a Sequential's) graph holds; False (nothing built) for any other model, or outputs whose
    dimensions past the first are not all known."""
    import keras
    from keras.src.models.functional import Functional
    from keras.src.trainers import data_adapters

    graph = model._functional if type(model).call is keras.Sequential.call else model
    if not isinstance(graph, Functional) or type(graph).call is not Functional.call:
        return False
    outputs = graph._outputs_struct
    flat = keras.tree.flatten(outputs)
    if not all(None not in tuple(tensor.shape)[1:] for tensor in flat):
        return False
    batch = keras.tree.map_structure(lambda spec: keras.KerasTensor(spec.shape, spec.dtype.name), element_spec)
    x, y, sample_weight = data_adapters.data_adapter_utils.unpack_x_y_sample_weight(batch)
    first = keras.tree.flatten(x)[0].shape[0]
    y_pred = keras.tree.map_structure(
        lambda tensor: keras.KerasTensor((first if tensor.shape[0] is None else tensor.shape[0], *tensor.shape[1:]),
                                         tensor.dtype), outputs)
    compute_output_spec = keras.src.backend.compute_output_spec
    if model._compile_metrics is not None and not model._compile_metrics.built:
        compute_output_spec(model.compute_metrics, x, y, y_pred, sample_weight=sample_weight)
    if model._compile_loss is not None and not model._compile_loss.built:
        compute_output_spec(model._compute_loss, x, y, y_pred, sample_weight=sample_weight, training=False)
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    getattr(model, "_post_build", lambda: None)()
    return True
