"""A model's training state, captured and put back: the basis of fair comparisons."""

from __future__ import annotations

import numpy as np


class TrainingState:
    """The values of a model's variables (weights, seed-generator states) and its optimizer's.

    The optimizer is built first if it was not, so that even a fresh
    optimizer's state (zero moments, iteration 0) is captured.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile("adam", "mse")
        >>> state = TrainingState.capture(model)
        >>> _ = model.layers[0].kernel.assign([[5.0], [5.0]])
        >>> state.restore()
        >>> bool((model.layers[0].kernel.numpy() != 5.0).all())
        True
    """

    def __init__(self, pairs):
        self._pairs = pairs

    @classmethod
    def capture(cls, model) -> "TrainingState":
        variables = list(model.variables)
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None:
            if not optimizer.built:
                optimizer.build(model.trainable_variables)
            variables += list(optimizer.variables)
        seen, pairs = set(), []
        for variable in variables:
            if id(variable) not in seen:
                seen.add(id(variable))
                pairs.append((variable, np.array(variable.numpy(), copy=True)))
        return cls(pairs)

    def restore(self) -> None:
        for variable, value in self._pairs:
            variable.assign(value)
