"""A few samples of a fit's data, as the step predictors take them (no framework import at module level)."""

from __future__ import annotations


def _is_dataset(data) -> bool:
    return type(data).__module__.startswith("tensorflow") and hasattr(data, "element_spec")


def take_samples(data, count: int):
    """The first ``count`` samples of ``data`` as a tuple of arrays (cycled when there are fewer).

    ``data`` is ``(x, y)`` or ``(x, y, sample_weight)`` of arrays (or dicts of
    arrays), or a ``tf.data.Dataset`` of batches or samples.

    Raises:
        ValueError: no data, or data of another kind (the message says what to pass).

    Example:
        >>> import numpy as np
        >>> x, y = take_samples((np.arange(3.0)[:, None], np.arange(3)), 5)
        >>> x[:, 0].tolist(), y.tolist()
        ([0.0, 1.0, 2.0, 0.0, 1.0], [0, 1, 2, 0, 1])
    """
    if data is None:
        raise ValueError("no data: pass the training data, e.g. --data (x_train, y_train)")
    if _is_dataset(data):  # only a tf.data.Dataset brings TensorFlow in
        import tensorflow as tf

        leaf = tf.nest.flatten(data.element_spec)[0]
        samples = data.unbatch() if leaf.shape.rank and leaf.shape[0] is None else data
        data = next(iter(samples.take(count).batch(count).as_numpy_iterator()))
    if not isinstance(data, (tuple, list)) or not 1 <= len(data) <= 3:
        raise ValueError("data must be (x, y) or (x, y, sample_weight) arrays, or a tf.data.Dataset; "
                         f"got {type(data).__name__}")
    import keras
    import numpy as np

    arrays = keras.tree.map_structure(np.asarray, tuple(data))
    first = keras.tree.flatten(arrays)[0]
    if first.ndim == 0 or len(first) == 0:
        raise ValueError("the data holds no samples")
    index = np.arange(count) % len(first)
    return keras.tree.map_structure(lambda a: a[index], arrays)


def batch_shapes(data):
    """The ``(shape, dtype)`` of each tensor of a batch (symbolic or not), in tuples as the batch nests them; None
    where the batch holds something else (a dict of inputs).

    Example:
        >>> import numpy as np
        >>> batch_shapes((np.zeros((8, 4), "float32"), np.zeros(8, "int32")))
        (((8, 4), dtype('float32')), ((8,), dtype('int32')))
    """
    try:
        if data is None:  # no sample weights
            return None
        if isinstance(data, (tuple, list)):
            return tuple(batch_shapes(item) for item in data)
        dims = data.shape.as_list() if hasattr(data.shape, "as_list") else list(data.shape)
        dtype = getattr(data.dtype, "as_numpy_dtype", data.dtype)
        return tuple(dims), str(dtype).replace("torch.", "") if "torch" in str(dtype) else dtype  # torch's by name
    except AttributeError:
        return None


def zeros_like_batch(shapes, count: int = 2):
    """``count`` samples of zeros shaped as a batch's ``(shape, dtype)`` leaves (any nesting of tuples; a shape's
    first dimension, the batch, is replaced; a missing part, such as no sample weights at the end, is left out).

    Example:
        >>> x, y = zeros_like_batch(((( 8, 4), "float32"), ((8,), "int32")))
        >>> x.shape, y.dtype.name
        ((2, 4), 'int32')
    """
    import numpy as np

    def zeros(leaf):
        if leaf is None:
            return None
        if len(leaf) == 2 and isinstance(leaf[0], tuple) and all(isinstance(d, int) or d is None for d in leaf[0]):
            return np.zeros((count,) + tuple(leaf[0][1:]), dtype=leaf[1])
        return tuple(zeros(item) for item in leaf)

    made = zeros(shapes)
    while isinstance(made, tuple) and made and made[-1] is None:  # (x, y, None): no sample weights
        made = made[:-1]
    return made
