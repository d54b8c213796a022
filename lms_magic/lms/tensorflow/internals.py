"""TensorFlow's private API, in one place for the TensorFlow backend: the executed graphs collected, the graph
surgery of the rewrite (control inputs, inputs replaced, ops cloned and placed), a variable read through its handle,
a GPU's memory limit, and the Keras model's layer tree its scopes are read against.

The rest of the folder calls these helpers, never a private attribute, so a TensorFlow release that moves one of
them breaks here (``lms_magic/versions.py`` holds the tested range).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator


@contextlib.contextmanager
def collected_function_graphs(collected: Callable) -> Iterator[None]:
    """Calls ``collected`` with the RunMetadata of the functions instantiated inside the block, where there is one.

    Uses the eager context's graph collection, not ``enable_run_metadata``:
    once that has been enabled, disabling it does not stop TensorFlow from
    keeping every later function's graphs in memory (4,079 graphs, +108 MiB
    after 120 plain fit/predict/evaluate calls). Graph collection stops when
    disabled, and exporting drains what it kept.
    """
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_graph_collection()
    try:
        yield
    finally:
        try:
            metadata = ctx.export_run_metadata()
        finally:
            ctx.disable_graph_collection()
        if metadata is not None:
            collected(metadata)


def graph_collection_stopped() -> None:
    """Stops the graph collection ``collected_function_graphs`` started (inside its block): nothing more is kept."""
    from tensorflow.python.eager import context

    context.context().disable_graph_collection()


def tensorflow_memory_limit(gpu_index: int) -> int | None:
    """The memory limit (bytes) set on the ``gpu_index``-th GPU's logical device, or None where none was set."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpu_index >= len(gpus):
        return None
    configured = tf.config.get_logical_device_configuration(gpus[gpu_index]) or []
    limit = getattr(configured[0], "memory_limit", None) if configured else None
    return None if limit is None else int(limit) * 2**20  # TensorFlow takes it in MiB


def in_function_graph() -> bool:
    """Whether code runs while TensorFlow traces a ``tf.function`` (not eagerly)."""
    import tensorflow as tf
    from tensorflow.python.framework import func_graph

    return isinstance(tf.compat.v1.get_default_graph(), func_graph.FuncGraph)


def add_control_input(op, trigger) -> None:
    """``op`` runs only after ``trigger`` (in a graph still being built)."""
    op._add_control_input(trigger)


def remove_control_input(op, trigger) -> None:
    """``op`` no longer waits for ``trigger`` (its other control inputs stay)."""
    kept = [control for control in op.control_inputs if control is not trigger]
    op._remove_all_control_inputs()
    op._add_control_inputs(kept)


def replace_input(op, index: int, tensor) -> None:
    """``op``'s input ``index`` becomes ``tensor``."""
    op._update_input(index, tensor)


def clone_op(graph, op, inputs, name: str):
    """A copy of ``op`` in ``graph`` (its type, attributes and device) that reads ``inputs``."""
    attrs = {key: value for key, value in op.node_def.attr.items() if not key.startswith("_")}
    clone = graph._create_op_internal(op.type, list(inputs), dtypes=[t.dtype for t in op.outputs], name=name,
                                      attrs=attrs, op_def=op.op_def)
    if op.device:
        clone._set_device(op.device)
    return clone


def pass_through_op(graph, op_type: str, tensor, name: str, shape=None):
    """``tf.raw_ops.<op_type>(input=tensor, name=name)`` (and ``shape=shape``: ``EnsureShape``) in ``graph``, made
    without the op-definition library's argument handling (most of the swap ops' making, under a profiler): the
    same node, device and name. Its output."""
    from tensorflow.core.framework import attr_value_pb2

    attrs = {"T": attr_value_pb2.AttrValue(type=tensor.dtype.as_datatype_enum)}
    if shape is not None:
        attrs["shape"] = attr_value_pb2.AttrValue(shape=shape.as_proto())
    return graph._create_op_internal(op_type, [tensor], [tensor.dtype], name=name, attrs=attrs).outputs[0]


def variable_of_handle(tensor):
    """The (dtype, shape) of the variable a resource ``tensor`` of a traced graph holds (a captured variable's
    placeholder), or None where the graph did not record it."""
    import tensorflow as tf
    from tensorflow.python.ops import handle_data_util

    data = handle_data_util.get_resource_handle_data(tensor)
    if not data.shape_and_type:
        return None
    shape_and_type = data.shape_and_type[0]
    return tf.dtypes.as_dtype(shape_and_type.dtype), tf.TensorShape(shape_and_type.shape)


def set_op_device(op, device: str) -> None:
    """Places ``op`` on ``device``."""
    op._set_device(device)


def layer_tree(model) -> tuple[str, dict]:
    """``model``'s name and its layers as a tree: ``{name: (class name, {child name: ...})}``, each layer's
    direct sublayers under it (a name is unique among a parent's children, not across the model)."""
    def children(layer) -> dict:
        found: dict = {}
        for child in layer._flatten_layers(include_self=False, recursive=False):
            found.setdefault(child.name, (type(child).__name__, children(child)))
        return found

    return model.name, children(model)
