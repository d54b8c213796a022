"""A few samples of a fit's data, as the step predictors take them (no framework import at module level)."""

from __future__ import annotations

from dataclasses import dataclass


def _is_arrays(data) -> bool:
    """Whether ``data`` is ``(x, ...)`` of arrays (or dicts / lists of arrays), not a dataset to iterate."""
    if not isinstance(data, (tuple, list)) or not 1 <= len(data) <= 3:
        return False
    import keras

    leaves = [leaf for leaf in keras.tree.flatten(data[0]) if leaf is not None]
    return bool(leaves) and all(hasattr(leaf, "shape") or isinstance(leaf, (list, int, float)) for leaf in leaves)


def take_samples(data, count: int):
    """The first ``count`` samples of ``data`` as a tuple ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)`` of
    arrays (``x`` may be a dict of arrays; cycled where there are fewer samples).

    ``data`` is what ``fit`` takes: ``(x, y)`` or ``(x, y, sample_weight)`` of arrays (or dicts of arrays), or a
    dataset of batches: ``tf.data``, ``keras.utils.PyDataset``, a grain dataset (read through Keras's own data
    adapter, yielding ``x``, ``(x, y)`` or ``(x, y, sample_weight)``).

    Raises:
        ValueError: no data, data that cannot be read again (a generator), or data without samples (the message
            says what to pass).

    Example:
        >>> import numpy as np
        >>> x, y = take_samples((np.arange(3.0)[:, None], np.arange(3)), 5)
        >>> x[:, 0].tolist(), y.tolist()
        ([0.0, 1.0, 2.0, 0.0, 1.0], [0, 1, 2, 0, 1])
        >>> x, y, weights = take_samples(({"ids": np.arange(4)}, np.arange(4), np.ones(4)), 2)
        >>> x["ids"].tolist(), weights.tolist()
        ([0, 1], [1.0, 1.0])
        >>> take_samples(["a b", "c"], 3)[0].tolist()  # text alone, for a model with a preprocessor
        ['a b', 'c', 'a b']
    """
    if data is None:
        raise ValueError("no data: pass the training data, e.g. --data (x_train, y_train)")
    if hasattr(data, "__next__"):
        raise ValueError("the data is a generator, which cannot be read again without taking batches from the "
                         "fit: pass arrays, a tf.data.Dataset or a keras.utils.PyDataset")
    import keras
    import numpy as np

    if hasattr(data, "shape") and hasattr(data, "dtype") or _is_texts(data):
        data = (data,)  # x alone: an array, a tensor, or a list of strings (a KerasHub task model's text)
    if isinstance(data, tuple) and data and _is_texts(data[0]):
        data = (np.asarray(data[0]),) + data[1:]

    if _is_arrays(data):
        arrays = keras.tree.map_structure(lambda leaf: None if leaf is None else np.asarray(leaf), tuple(data))
    else:
        arrays = _from_batches(data[0] if isinstance(data, (tuple, list)) and len(data) == 1 else data, count)
    while arrays and arrays[-1] is None:  # (x, y, None): no sample weights
        arrays = arrays[:-1]
    leaves = [leaf for leaf in keras.tree.flatten(arrays) if leaf is not None]
    if not leaves or leaves[0].ndim == 0 or len(leaves[0]) == 0:
        raise ValueError("the data holds no samples")
    index = np.arange(count) % len(leaves[0])
    return keras.tree.map_structure(lambda a: None if a is None else a[index], arrays)


def sample_count(x) -> int | None:
    """How many samples a fit's ``x`` holds (an array, a dict or list of arrays, a list of text); None where it is
    not arrays (a dataset, a generator).

    Example:
        >>> import numpy as np
        >>> sample_count({"ids": np.zeros((5, 3))}), sample_count(["a b", "c"]), sample_count(iter([]))
        (5, 2, None)
    """
    if _is_texts(x):
        return len(x)
    import keras

    leaves = [leaf for leaf in keras.tree.flatten(x) if leaf is not None]
    shape = getattr(leaves[0], "shape", None) if leaves else None
    return int(shape[0]) if shape and shape[0] is not None else None


def fit_length(rest: dict) -> tuple[int, int | None]:
    """A fit call's epochs to run (``epochs`` less ``initial_epoch``; Keras's 1 where none given) and its
    ``steps_per_epoch``, from its arguments by name (``fit_call``'s ``rest``).

    Example:
        >>> fit_length({"epochs": 5, "initial_epoch": 2, "steps_per_epoch": 10}), fit_length({})
        ((3, 10), (1, None))
    """
    return max(1, (rest.get("epochs") or 1) - (rest.get("initial_epoch") or 0)), rest.get("steps_per_epoch")


def fit_steps(data, epochs: int, steps_per_epoch: int | None = None):
    """The steps a fit of ``epochs`` over ``data`` runs at a batch size, as Keras counts them: ``steps_per_epoch``
    an epoch where given, else the samples in whole batches and a last, shorter one; None at every batch size where
    neither is known (a dataset, a generator: its own batches).

    Example:
        >>> import numpy as np
        >>> steps = fit_steps((np.zeros((100, 3)), np.zeros(100)), epochs=2)
        >>> steps(32), steps(100), fit_steps(iter([]), 3, steps_per_epoch=10)(32), fit_steps(iter([]), 3)(32)
        (8, 2, 30, None)
    """
    samples = sample_count(data[0]) if _is_arrays(data) else None

    def at(batch_size: int) -> int | None:
        if steps_per_epoch is not None:
            return epochs * steps_per_epoch
        return None if samples is None else epochs * -(-samples // batch_size)

    return at


def _is_texts(data) -> bool:
    """Whether ``data`` is a list of strings (what a KerasHub task model with a preprocessor takes as ``x``)."""
    return isinstance(data, list) and bool(data) and all(isinstance(item, (str, bytes)) for item in data)


def preprocessed(model, samples: tuple) -> tuple:
    """``samples`` as ``model``'s own ``fit`` hands them to Keras's: a KerasHub task model with a preprocessor
    turns text into token ids (and makes the labels of a causal LM) in its ``fit``; any other model takes them as
    they are. Arrays each (numpy).

    Example:
        >>> import numpy as np
        >>> preprocessed(object(), (np.zeros(2), np.ones(2)))[1].tolist()
        [1.0, 1.0]
    """
    preprocess = getattr(model, "preprocess_samples", None)
    if getattr(model, "preprocessor", None) is None or not callable(preprocess):
        return samples
    import keras
    import numpy as np

    x, y, weights = (tuple(samples) + (None, None))[:3]
    try:
        import tensorflow as tf
    except ImportError:  # a preprocessor of numbers, on a backend without TensorFlow: called as it is
        made = preprocess(x, y, weights)
    else:  # as KerasHub's fit runs it: mapped over a tf.data batch (text only goes through TensorFlow's ops)
        batch = tf.data.Dataset.from_tensor_slices(keras.utils.pack_x_y_sample_weight(x, y, weights))
        made = next(iter(batch.batch(len(keras.tree.flatten(x)[0])).map(_unpacked(preprocess))))
    made = keras.tree.map_structure(lambda leaf: None if leaf is None else np.asarray(leaf),
                                    tuple(keras.utils.unpack_x_y_sample_weight(made)))
    while made and made[-1] is None:
        made = made[:-1]
    return made


def _unpacked(preprocess):
    """``preprocess(x, y, sample_weight)`` over a dataset element, which is ``x`` alone or a tuple of them."""
    import keras

    return lambda *element: preprocess(*keras.utils.unpack_x_y_sample_weight(
        element[0] if len(element) == 1 else element))


def _from_batches(dataset, count: int) -> tuple:
    """At least ``count`` samples of a dataset of batches, its batches joined."""
    import keras
    import numpy as np

    from ..internals import numpy_batches

    try:
        batches, taken = [], 0
        for batch in numpy_batches(dataset):
            x, y, weights = keras.utils.unpack_x_y_sample_weight(batch)
            batches.append((x, y, weights))
            taken += len(next(leaf for leaf in keras.tree.flatten(x) if leaf is not None))
            if taken >= count:
                break
    except (ValueError, TypeError) as error:
        raise ValueError("data must be (x, y) or (x, y, sample_weight) arrays, or a dataset fit() takes "
                         f"(tf.data, PyDataset); got {type(dataset).__name__} ({error})") from None
    if not batches:
        raise ValueError("the data holds no samples")
    if len(batches) == 1:
        return batches[0]
    return keras.tree.map_structure(lambda *parts: None if parts[0] is None else np.concatenate(parts), *batches)


def tile_batch(sample, batch_size: int):
    """``sample``'s arrays (any nesting; None kept) repeated to ``batch_size`` samples each.

    Example:
        >>> import numpy as np
        >>> x, y = tile_batch(({"ids": np.arange(2)}, np.arange(2)), 3)
        >>> x["ids"].tolist(), y.tolist()
        ([0, 1, 0], [0, 1, 0])
    """
    import keras
    import numpy as np

    def tiled(leaf):
        if leaf is None:
            return None
        leaf = np.asarray(leaf)
        return leaf[np.arange(batch_size) % len(leaf)]

    return keras.tree.map_structure(tiled, tuple(sample))


def fit_arguments(arrays) -> tuple[tuple, dict]:
    """``fit``'s positional and keyword arguments for ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)``: the
    weights by name (``fit``'s third positional argument is ``batch_size``).

    Example:
        >>> fit_arguments(("x", "y", "w"))
        (('x', 'y'), {'sample_weight': 'w'})
    """
    arrays = tuple(arrays)
    if len(arrays) == 3 and arrays[2] is not None:
        return arrays[:2], {"sample_weight": arrays[2]}
    return arrays[:2], {}


def fit_call(fit, args: tuple, kwargs: dict) -> tuple[tuple, int | None, dict]:
    """What a call ``fit(*args, **kwargs)`` trains on: ``(data, batch_size, rest)``, where ``data`` is ``(x,)``,
    ``(x, y)`` or ``(x, y, sample_weight)`` (arrays), or ``(dataset,)``; ``batch_size`` the one given (None where
    none was); ``rest`` the other arguments by name. ``fit`` gives the names of positional arguments (Keras's, or a
    subclass's own, such as KerasHub's).

    Example:
        >>> import keras
        >>> data, batch, rest = fit_call(keras.Model.fit, ("x", "y", 4), {"sample_weight": "w", "epochs": 2})
        >>> data, batch, rest
        (('x', 'y', 'w'), 4, {'epochs': 2})
    """
    import inspect

    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    parameters = [name for name, parameter in inspect.signature(fit).parameters.items()
                  if name != "self" and parameter.kind in positional]
    named = dict(zip(parameters, args))
    if len(args) > len(parameters):
        raise TypeError(f"fit() takes {len(parameters)} positional arguments, got {len(args)}")
    named.update(kwargs)
    x, y, weights = named.pop("x", None), named.pop("y", None), named.pop("sample_weight", None)
    batch_size = named.pop("batch_size", None)
    data = (x, y, weights) if weights is not None else (x, y) if y is not None else (x,)
    return data, batch_size, named


@dataclass(frozen=True)
class Leaf:
    """The shape and dtype of one tensor of a batch (``batch_shapes``)."""

    shape: tuple
    dtype: object


def batch_shapes(data):
    """A batch's structure (tuples, dicts of inputs; None kept) with a :class:`Leaf` for each tensor (symbolic
    or not); None where the batch holds something without a shape.

    Example:
        >>> import numpy as np
        >>> batch_shapes(({"ids": np.zeros((8, 4), "int32")}, np.zeros(8, "float32")))
        ({'ids': Leaf(shape=(8, 4), dtype=dtype('int32'))}, Leaf(shape=(8,), dtype=dtype('float32')))
    """
    import keras

    def leaf(tensor):
        if tensor is None:
            return None
        dims = tensor.shape.as_list() if hasattr(tensor.shape, "as_list") else list(tensor.shape)
        dtype = getattr(tensor.dtype, "as_numpy_dtype", tensor.dtype)
        return Leaf(tuple(dims), str(dtype).replace("torch.", "") if "torch" in str(dtype) else dtype)  # torch's by name

    try:
        return None if data is None else keras.tree.map_structure(leaf, data)
    except (AttributeError, TypeError):
        return None


def zeros_like_batch(shapes, count: int = 2):
    """``count`` samples of zeros shaped as ``batch_shapes``'s leaves (the batch dimension replaced; a missing
    part, such as no sample weights at the end, left out).

    Example:
        >>> import numpy as np
        >>> x, y = zeros_like_batch(batch_shapes((np.zeros((8, 4), "float32"), np.zeros(8, "int32"))))
        >>> x.shape, y.dtype.name
        ((2, 4), 'int32')
    """
    import keras
    import numpy as np

    made = keras.tree.map_structure(
        lambda leaf: None if leaf is None else np.zeros((count,) + tuple(leaf.shape[1:]), dtype=leaf.dtype), shapes)
    while isinstance(made, tuple) and made and made[-1] is None:  # (x, y, None): no sample weights
        made = made[:-1]
    return made
