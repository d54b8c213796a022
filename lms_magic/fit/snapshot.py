"""A model's training state, captured and put back: the basis of fair comparisons."""

from __future__ import annotations

import contextlib
import copy

import numpy as np


class TrainingState:
    """The values of a model's variables (weights, seed-generator states), its metrics' and its optimizer's.

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
        variables = list(model.variables) + list(getattr(model, "metrics_variables", []))
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None:
            if not optimizer.built:  # in the model's distribution strategy, as Keras's fit builds it (TensorFlow)
                strategy = getattr(model, "distribute_strategy", None)
                with strategy.scope() if strategy is not None else contextlib.nullcontext():
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


def _plain_data(value, depth: int = 0) -> bool:
    """Numbers, strings, None, NumPy values, and lists/tuples/dicts of them: state safe to copy."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, np.generic, np.ndarray)):
        return True
    if depth > 4:
        return False
    if isinstance(value, (list, tuple)):
        return all(_plain_data(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(_plain_data(k, depth + 1) and _plain_data(v, depth + 1) for k, v in value.items())
    return False


class CallbackState:
    """The plain-data attributes of callbacks (a checkpoint's best value, a patience counter), put back.

    Keras callbacks keep such state across ``fit`` calls (``ModelCheckpoint``
    sets ``best`` once, in its constructor), so a second variant would start
    where the first ended. Only plain data is copied: the model, files,
    writers and functions a callback holds are left as they are.

    Example:
        >>> import keras
        >>> checkpoint = keras.callbacks.ModelCheckpoint("best.keras", save_best_only=True)
        >>> state = CallbackState.capture([checkpoint])
        >>> checkpoint.best = 0.25
        >>> state.restore()
        >>> checkpoint.best != 0.25
        True
    """

    def __init__(self, saved):
        self._saved = saved

    @classmethod
    def capture(cls, callbacks) -> "CallbackState":
        saved = []
        for callback in callbacks or []:
            plain = {name: copy.deepcopy(value) for name, value in vars(callback).items() if _plain_data(value)}
            saved.append((callback, plain))
        return cls(saved)

    def restore(self) -> None:
        for callback, plain in self._saved:
            for name in [name for name in vars(callback) if name not in plain and _plain_data(vars(callback)[name])]:
                del vars(callback)[name]  # plain state that training added (Keras adds it in on_train_begin)
            vars(callback).update(copy.deepcopy(plain))
