"""Attributes replaced inside a block and exactly restored after it: an instance's attribute over its class's
(a layer's ``call``, a model's ``train_step``), past Keras's attribute tracking."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

MISSING = object()  # an attribute the owner did not have


@contextlib.contextmanager
def instance_attribute_replaced(owner, name: str, value) -> Iterator[None]:
    """Inside the block ``owner.name`` is ``value``, an attribute of the instance over its class's (set past
    Keras's tracking); after it, exactly as before (the instance's own value, or none), however the block ends.

    Example:
        >>> import types
        >>> box = types.SimpleNamespace()
        >>> with instance_attribute_replaced(box, "call", print):
        ...     inside = box.call is print
        >>> inside, hasattr(box, "call")
        (True, False)
    """
    saved = owner.__dict__.get(name, MISSING)
    object.__setattr__(owner, name, value)
    try:
        yield
    finally:
        if saved is MISSING:
            owner.__dict__.pop(name, None)
        else:
            object.__setattr__(owner, name, saved)


@contextlib.contextmanager
def train_step_replaced(model, train_step: Callable, jit_off: bool = True) -> Iterator[None]:
    """``model.train_step`` is ``train_step`` and XLA is off (``jit_off``) inside the block; exactly as before
    after it.

    Keras reads ``train_step`` when it makes the train function (Keras 3.15) or
    when it traces it (Keras 3.5), and ``jit_compile`` when it makes it, so
    both are set for the making and for every call of an LMS train function.
    """
    saved_jit = model._jit_compile
    if jit_off:
        model._jit_compile = False
    try:
        with instance_attribute_replaced(model, "train_step", train_step):
            yield
    finally:
        model._jit_compile = saved_jit


@contextlib.contextmanager
def layer_calls_replaced(layers: list, make: Callable) -> Iterator[None]:
    """Inside the block each layer's ``call`` is ``make(layer, call)`` (an attribute of the instance, over its
    class's); after it, each is exactly as before, however the block ends.

    Example:
        >>> import keras
        >>> layer = keras.layers.ReLU()
        >>> with layer_calls_replaced([layer], lambda layer, call: (lambda *args, **kwargs: "replaced")):
        ...     inside = layer.call(None)
        >>> inside, "call" in vars(layer)
        ('replaced', False)
    """
    with contextlib.ExitStack() as stack:
        for layer in layers:
            stack.enter_context(instance_attribute_replaced(layer, "call", make(layer, layer.call)))
        yield
