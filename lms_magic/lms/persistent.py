"""What a model holds on the device through every step, whatever LMS does: its weights, its optimizer's state
and its metrics' variables, counted one way for every backend, the tuner and the explained peak.

No framework is imported: Keras variables answer with their shape and dtype.
"""

from __future__ import annotations

import math

from .core.peak import LiveTensor


def persistent_tensors(model, shape_of=None) -> list[LiveTensor]:
    """The model's variables ("weights"), its optimizer's ("optimizer_state", sized on a built copy where the
    optimizer is not built yet: the model's own is untouched) and its metrics' ("other"), each once;
    ``shape_of`` (a variable -> the shape one device holds of it, under a distribution) sizes them, else their
    shapes do.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        >>> model.compile("adam", "mse")
        >>> sorted({tensor.kind for tensor in persistent_tensors(model)}), persistent_bytes(model)
        (['optimizer_state', 'other', 'weights'], 200)
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not getattr(optimizer, "built", True):
        optimizer = type(optimizer).from_config(optimizer.get_config())
        optimizer.build(model.trainable_variables)
    groups = [("weights", list(model.variables)), ("optimizer_state", list(getattr(optimizer, "variables", []))),
              ("other", list(getattr(model, "metrics_variables", [])))]
    tensors, seen = [], set()
    for kind, variables in groups:
        for variable in variables:
            if id(variable) in seen:
                continue
            seen.add(id(variable))
            shape = tuple(int(dim) for dim in (variable.shape if shape_of is None else shape_of(variable)))
            name = getattr(variable, "path", None) or variable.name
            tensors.append(LiveTensor(name, name.rsplit("/", 1)[0], shape,
                                      math.prod(shape) * _itemsize(variable.dtype), kind))
    return tensors


def persistent_bytes(model, shape_of=None) -> int:
    """The bytes of :func:`persistent_tensors`."""
    return sum(tensor.nbytes for tensor in persistent_tensors(model, shape_of))


def _itemsize(dtype) -> int:
    """Bytes per element of a Keras dtype ("float32", "bfloat16", a framework's dtype object)."""
    import numpy as np

    name = getattr(dtype, "name", None) or str(dtype)
    name = name.replace("torch.", "")
    try:
        return np.dtype(name).itemsize
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name)).itemsize
