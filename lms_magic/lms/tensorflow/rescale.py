"""A traced train step's sizes at another batch size, with no trace of its own.

Tracing Keras's train step takes seconds (ResNet-50: about 2.5 s on 2 cores), and ``explain_fit``'s searches ask
for a dozen batch sizes or more. Two ways read them off traces instead, by the rules ``docs/design.md`` states
(what breaks each, and what the code does then):

- **Two steps, every size a line in the batch** (:class:`Rescaled`): a dimension that differs between two traces of
  the same step grows linearly with the batch (the batch itself, or the batch merged with another dimension by a
  reshape); one that does not is the model's. ``dims_sized`` and ``static_bytes`` size a traced tensor at an int
  batch (an unknown dimension is the batch) or at a :class:`Rescaled` one.
- **TensorFlow's shape inference** (:func:`dims_at`): importing the traced GraphDef into a new graph, where
  TensorFlow's C++ shape inference sizes every tensor, takes a fraction of a trace. Traced at a prime batch size
  that divides no dimension of the model's variables, layers' outputs or inputs (:func:`prime_batch`), every
  integer constant that is a multiple of it holds the batch (a shape TensorFlow baked into a gradient, a reshape's
  target, a range's end): scaled to another batch, with the inputs' batch dimension, the imported graph has every
  tensor's shape at that batch. Each variable the step reads is a handle of its own shape in the new graph, so its
  reads and gathers are sized too.

The imported shapes are checked before they are used: each dimension is the model's (not a multiple of the traced
batch, and unchanged) or grows with the batch exactly (``k * traced`` became ``k * batch``). An import that fails,
a shape left unknown, or a dimension off that pattern gives None, and the caller traces instead. What the check
cannot see: a dimension computed from the batch in Python other than as a multiple of it (half the batch, say),
which the trace holds as a plain number.

Example:
    >>> prime_batch(64, [3, 7, 64, 1000]), prime_batch(7, [7, 1000]), suits(67, [3, 7, 64])
    (67, 11, True)
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Iterable

from ..core.batch_lines import TwoBatches
from . import internals as tf_internals


@dataclass(frozen=True)
class Rescaled:
    """The sizes of a step traced at batch ``traced``, read as at batch ``to``, from a second trace of the same
    step at batch ``other`` (``other_dims``: each tensor's dimensions there, by name). A dimension that differs
    between the two traces grows linearly with the batch (the batch itself, or the batch merged with another
    dimension by a reshape); one that does not is the model's. Exact for every dimension linear in the batch.

    Example:
        >>> rescaled = Rescaled(8, 20, 16, {"x:0": [16, 224, 16 * 24]})
        >>> rescaled.dims("x:0", [8, 224, 8 * 24]), rescaled.dims("y:0", [8, None])
        ([20, 224, 480], [20, 20])
    """

    traced: int
    to: int
    other: int
    other_dims: dict = field(repr=False, compare=False)

    def dims(self, name: str, dims: list) -> list:
        return TwoBatches(self.traced, self.other).each_at(self._pairs(name, dims), self.to)

    def linear(self, name: str, dims: list) -> bool:
        """Whether the tensor's bytes are a line in the batch: at most one dimension grows with it, by a whole
        number per sample.

        Example:
            >>> rescaled = Rescaled(8, 20, 16, {"x:0": [16 * 24, 224], "y:0": [16, 16], "z:0": [7]})
            >>> rescaled.linear("x:0", [8 * 24, 224]), rescaled.linear("y:0", [8, 8]), rescaled.linear("z:0", [3])
            (True, False, False)
        """
        two = TwoBatches(self.traced, self.other)
        slopes = [two.slope(first, again) for first, again in self._pairs(name, dims)]
        return None not in slopes and sum(1 for slope in slopes if slope) <= 1

    def _pairs(self, name: str, dims: list) -> list[tuple[int, int]]:
        """Each dimension as (its size at the traced batch, its size at the other)."""
        second = self.other_dims.get(name)
        if second is None or len(second) != len(dims):
            second = [None] * len(dims)
        pairs = []
        for first, again in zip(dims, second):
            if first is None:  # unknown: the batch
                pairs.append((self.traced, self.other))
            elif again is None:  # not known in the other trace: the batch where it equals the traced one
                pairs.append((first, self.other if first == self.traced else first))
            else:
                pairs.append((first, again))
        return pairs


def dims_sized(name: str, dims: list, batch_size) -> list:
    """A tensor's dimensions as traced (``name``'s ``dims``, None where unknown) at ``batch_size``: an int or None
    fills the unknown ones; a :class:`Rescaled` reads them as at its batch."""
    if isinstance(batch_size, Rescaled):
        return batch_size.dims(name, dims)
    return [batch_size if dim is None else dim for dim in dims]


def bytes_of(dims: list, itemsize: int) -> int | None:
    """The bytes of a tensor of ``dims`` and ``itemsize``; None where a dimension is unknown."""
    count = itemsize
    for dim in dims:
        if dim is None:
            return None
        count *= dim
    return count


def sized_dims(tensor, batch_size) -> list:
    """``tensor``'s dimensions at ``batch_size`` (:func:`dims_sized`)."""
    return dims_sized(tensor.name, tensor.shape.as_list(), batch_size)


def static_bytes(tensor, batch_size) -> int | None:
    """The tensor's bytes, its unknown dimensions sized as ``batch_size`` (see :func:`sized_dims`); None where
    its shape is not known."""
    if tensor.shape.rank is None:
        return None
    return bytes_of(sized_dims(tensor, batch_size), tensor.dtype.size)


def is_prime(number: int) -> bool:
    """Whether ``number`` is a prime.

    Example:
        >>> [n for n in range(20) if is_prime(n)]
        [2, 3, 5, 7, 11, 13, 17, 19]
    """
    if number < 2:
        return False
    divisor = 2
    while divisor * divisor <= number:
        if number % divisor == 0:
            return False
        divisor += 1
    return True


def suits(batch: int, fixed_dims: Iterable[int]) -> bool:
    """Whether a trace at ``batch`` can be imported at other batch sizes: a prime that divides none of
    ``fixed_dims`` (the model's variables' and the inputs' dimensions other than the batch)."""
    return is_prime(batch) and not any(dim % batch == 0 for dim in fixed_dims if dim)


def fixed_dims(model, shapes: Iterable = ()) -> set[int]:
    """The dimensions of ``model`` that are not the batch: its variables' and its layers' outputs' (where Keras
    knows them: a functional model's), and those of ``shapes`` (the inputs', past the batch).

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5), keras.layers.Reshape((1, 5))])
        >>> sorted(fixed_dims(model, [(6,)]))
        [1, 5, 6]
    """
    import keras

    from ... import internals

    dims = {int(dim) for variable in model.variables for dim in variable.shape}
    dims.update(int(dim) for shape in shapes for dim in shape if dim)
    for layer in internals.layers_of(model):
        try:
            outputs = keras.tree.flatten(layer.output)
        except (AttributeError, ValueError, RuntimeError):  # not called, or called more than once
            continue
        dims.update(int(dim) for output in outputs for dim in getattr(output, "shape", ())[1:] if dim)
    return dims - {0}


def described_by_keras(model) -> bool:
    """Whether every dimension of ``model``'s step is one Keras knows of: the model and each of its layers is one
    of Keras's own classes, so each constant in the step is a variable's or a layer output's dimension
    (:func:`fixed_dims`), or the batch. A subclassed model, a custom layer, a ``Lambda`` or a KerasHub backbone may
    hold others inside its ``call``.

    Example:
        >>> import keras
        >>> described_by_keras(keras.Sequential([keras.Input((6,)), keras.layers.Dense(5)]))
        True
        >>> described_by_keras(keras.Sequential([keras.Input((6,)), keras.layers.Lambda(lambda x: x * 2)]))
        False
    """
    from ... import internals

    def keras_own(layer) -> bool:
        return type(layer).__module__.startswith("keras.") and type(layer).__name__ != "Lambda"

    return keras_own(model) and all(keras_own(layer) for layer in internals.layers_of(model))


def unseen_dims(model, sample) -> set[int] | None:
    """Every dimension ``model``'s forward pass fixes: each static dimension of its tensors when traced at an unknown
    batch (a constant inside a ``call``, such as a tile's count or a reshape's target, shows there; the batch does
    not). None where the forward cannot be traced so.

    Example:
        >>> import keras, numpy as np
        >>> class Tiled(keras.Model):
        ...     def call(self, x):
        ...         return keras.ops.mean(keras.ops.reshape(keras.ops.tile(x, (1, 67)), (-1, 67, 3)), axis=1)
        >>> 67 in unseen_dims(Tiled(), (np.zeros((2, 3), "float32"),))
        True
    """
    import tensorflow as tf

    def spec(value):
        tensor = tf.convert_to_tensor(value)
        return tf.TensorSpec([None] + tensor.shape.as_list()[1:], tensor.dtype)

    def forward(inputs):
        with tf.name_scope("forward"):  # the model's own scope below a root one, as in the train step
            return model(inputs, training=True)

    try:
        graph = tf.function(forward, autograph=False).get_concrete_function(
            tf.nest.map_structure(spec, tuple(sample)[0])).graph
    except Exception:  # a model that cannot run at an unknown batch: its dimensions are not known
        return None
    return {int(dim) for op in graph.get_operations() for tensor in op.outputs if tensor.shape.rank
            for dim in tensor.shape.as_list() if dim}


def prime_batch(batch: int, fixed_dims: Iterable[int]) -> int:
    """The smallest batch size from ``batch`` up that :func:`suits`."""
    fixed = {int(dim) for dim in fixed_dims if dim}
    candidate = max(2, batch)
    while not suits(candidate, fixed):
        candidate += 1
    return candidate


def scaled(size: int, traced: int, batch: int) -> int:
    """A dimension at ``batch`` as the import reads it: a multiple of the prime ``traced`` is the same multiple of
    ``batch``, any other the model's.

    Example:
        >>> scaled(67 * 24, 67, 64), scaled(3, 67, 64), scaled(-1, 67, 64)
        (1536, 3, -1)
    """
    return size // traced * batch if size > 0 and size % traced == 0 else size


def traced_dims(graph) -> dict[str, list]:
    """Each sized tensor's dimensions (by name) in ``graph``, as traced (None where unknown)."""
    import tensorflow as tf

    return {tensor.name: tensor.shape.as_list() for op in graph.get_operations() for tensor in op.outputs
            if tensor.dtype not in (tf.resource, tf.variant) and tensor.shape.rank is not None}


def dims_at(graph, traced: int, batch: int) -> dict[str, list[int]] | None:
    """Each tensor's dimensions (by name) of ``graph``, a train step traced at the prime ``traced``, at
    ``batch``: from TensorFlow's shape inference on its GraphDef with the batch scaled; None where they cannot
    be had that way (the import fails, a shape is unknown, or a dimension is not :func:`scaled`'s)."""
    before = traced_dims(graph)
    graph_def = graph.as_graph_def()
    _scale_batch(graph_def, traced, batch)
    after = _inferred_shapes(graph, graph_def)
    if after is None:
        return None  # a constant scaled that was not the batch: shapes that cannot meet
    dims = {}
    for name, first in before.items():
        shape = after.get(name)
        if shape is None or shape.rank is None or not _grows_with_batch(first, shape.as_list(), traced, batch):
            return None
        dims[name] = shape.as_list()
    return dims


def dims_inferred(graph, batch: int) -> dict[str, list[int]]:
    """The dimensions TensorFlow's shape inference finds for the tensors of ``graph``, a train step traced at an
    unknown batch, once its input batches are ``batch`` samples: a dimension a layer computes from its input's
    shape (a sequence's length read with ``ops.shape``, as KerasHub's attention masks do) is unknown at the trace
    and known here. Only the tensors this makes fully known, by name; empty where the import fails.

    Example:
        >>> import tensorflow as tf
        >>> spec = tf.TensorSpec([None, 5], tf.float32)
        >>> def step(x):
        ...     return tf.zeros(tf.stack([tf.shape(x)[0], tf.shape(x)[1], 7]))
        >>> graph = tf.function(step).get_concrete_function(spec).graph
        >>> [dims for name, dims in dims_inferred(graph, 8).items() if name.startswith("zeros")]
        [[8, 5, 7]]
    """
    before = {name: dims for name, dims in traced_dims(graph).items() if None in dims}
    if not before:
        return {}
    key = (batch, tuple(before))
    known = _INFERRED.get(graph)
    if known is None or known[0] != key:
        earlier = set(known[0][1]) if known is not None and known[0][0] == batch else None
        passed_on = None if earlier is None else \
            _passed_on(graph, known[1], [name for name in before if name not in earlier], before)
        known = (key, passed_on if passed_on is not None else _dims_inferred(graph, batch, before))
        _INFERRED[graph] = known
    return dict(known[1])


def _passed_on(graph, inferred: dict, added: list[str], before: dict) -> dict | None:
    """``inferred`` grown by the ``added`` tensors of unknown dimensions, where LMS's swap ops made them since (each
    its input's dimensions); None where another op did (the graph is then inferred again)."""
    from .graph import SWAP_OPS

    grown, waiting = dict(inferred), added
    while waiting:
        left = []
        for name in waiting:
            op = graph.get_tensor_by_name(name).op
            if op.type not in SWAP_OPS or not op.inputs:
                return None
            source = op.inputs[0].name
            if source in grown:
                grown[name] = grown[source]
            elif source in waiting:
                left.append(name)
            elif source not in before:  # an input of known dimensions: the swap's are those too
                return None
        if len(left) == len(waiting):
            return None
        waiting = left
    return grown


# The last inference of each traced graph (LMS's plan and its figures ask it of the same step).
_INFERRED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _dims_inferred(graph, batch: int, before: dict) -> dict[str, list[int]]:
    import tensorflow as tf

    graph_def = graph.as_graph_def()
    for node in graph_def.node:
        if node.op in ("IteratorGetNext", "OptionalGetValue"):
            shapes = node.attr["output_shapes"].list.shape
        elif node.op == "Placeholder" and node.attr["dtype"].type != tf.resource.as_datatype_enum:
            shapes = [node.attr["shape"].shape]
        else:
            continue
        for shape in shapes:
            if shape.dim and shape.dim[0].size == -1:
                shape.dim[0].size = batch
    after = _inferred_shapes(graph, graph_def) or {}
    return {name: after[name].as_list() for name, dims in before.items()
            if name in after and after[name].rank == len(dims) and after[name].is_fully_defined()}


def _inferred_shapes(graph, graph_def) -> dict | None:
    """Each tensor's shape (by name) as TensorFlow's shape inference finds it on importing ``graph_def`` (``graph``
    changed: its variables read as handles of their own shapes); None where the import fails."""
    import tensorflow as tf

    _variables_as_handles(graph, graph_def)
    imported = tf.Graph()
    try:
        with imported.as_default():
            tf.graph_util.import_graph_def(graph_def, name="imported")
    except (ValueError, TypeError, tf.errors.OpError):
        return None
    return {tensor.name[len("imported/"):]: tensor.shape for op in imported.get_operations()
            if op.name.startswith("imported/") for tensor in op.outputs}


def dims_scaled(graph, traced: int, batch: int) -> dict[str, list[int]] | None:
    """What :func:`dims_at` gives where its check holds, without the import: each dimension :func:`scaled`. For a
    step whose every op but those of a gradient written to follow the batch (``lean.lean_batch_norm``'s) is in a
    step :func:`dims_at` sized at this batch. None where a dimension is unknown at the trace."""
    dims = traced_dims(graph)
    if any(None in shape for shape in dims.values()):
        return None
    return {name: [scaled(size, traced, batch) for size in shape] for name, shape in dims.items()}


def _grows_with_batch(first: list, second: list, traced: int, batch: int) -> bool:
    """Whether each dimension is :func:`scaled`'s: the model's (not a multiple of ``traced``, unchanged) or the
    batch's (``k * traced`` at the trace, ``k * batch`` after); one unknown at the trace is read as the batch,
    whatever it is after (``rewrite.Rescaled``)."""
    return len(first) == len(second) and all(before is None or after == scaled(before, traced, batch)
                                             for before, after in zip(first, second))


def _scale_batch(graph_def, traced: int, batch: int) -> None:
    """Scales, in place, each placeholder's dimensions, each constant's dimensions where it holds one value
    (zeros of a gradient's shape), and each integer constant's elements, that are multiples of ``traced``, to the
    same multiple of ``batch``."""
    import numpy as np
    import tensorflow as tf

    for node in graph_def.node:
        if node.op == "Placeholder":
            for dim in node.attr["shape"].shape.dim:
                dim.size = scaled(dim.size, traced, batch)
        elif node.op == "Const":
            proto = node.attr["value"].tensor
            if not proto.tensor_content and all(len(values) <= 1 for field, values in proto.ListFields()
                                                    if field.name.endswith("_val")):
                for dim in proto.tensor_shape.dim:  # one value, repeated: its shape is free to change
                    dim.size = scaled(dim.size, traced, batch)
            if tf.dtypes.as_dtype(node.attr["dtype"].type) in (tf.int32, tf.int64):
                value = tf.make_ndarray(proto)
                hit = (value % traced == 0) & (value != 0)
                if hit.any():
                    value = np.where(hit, value // traced * batch, value).astype(value.dtype)
                    proto.CopyFrom(tf.make_tensor_proto(value))


def _variables_as_handles(graph, graph_def) -> None:
    """Makes each resource placeholder of ``graph_def`` (a captured variable of ``graph``) a ``VarHandleOp`` of
    the same variable's shape and dtype, in place: what the import's shape inference reads the variable through."""
    import tensorflow as tf

    variables = {}
    for op in graph.get_operations():
        if op.type == "Placeholder" and op.outputs[0].dtype == tf.resource:
            variables[op.name] = tf_internals.variable_of_handle(op.outputs[0])
    for node in graph_def.node:
        variable = variables.get(node.name) if node.op == "Placeholder" else None
        if variable is None:
            continue
        dtype, shape = variable
        node.op = "VarHandleOp"
        node.ClearField("attr")
        node.attr["dtype"].type = dtype.as_datatype_enum
        node.attr["shape"].shape.CopyFrom(shape.as_proto())
        node.attr["shared_name"].s = node.name.encode()
        node.attr["container"].s = b""
