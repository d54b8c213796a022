"""The one interceptor of ``keras.Model.fit``: the magics and the out-of-memory account route each fit call
through it. It replaces public attributes only (``fit``, ``__init_subclass__``), so it is not in ``internals.py``."""

from __future__ import annotations

import inspect
import sys
from typing import Callable

from .internals import MISSING


class ModelFitReplaced:
    """The one interceptor of Keras's ``fit``: inside a ``with`` block, a ``fit(model, *args, **kwargs)`` call is
    ``self.route(original_fit, model, args, kwargs)``, and each of ``self.methods()`` (``fit_generator``, say) is
    set on ``keras.Model``; after it, every class is exactly as before (its own attribute, or none), however the
    block ends. Where Keras is not imported yet, nothing is replaced (a cell that imports nothing of Keras imports
    nothing here) and ``original_fit`` is None. Subclasses say what a fit does: ``fit/intercept.py`` routes a cell's
    fits through fair runs, ``lms/explain/account.py`` explains the ones that run out of memory.

    The ``fit`` routed is the outermost one the user called: a subclass of ``keras.Model`` with a ``fit`` of its
    own (KerasHub's task models batch arrays into a dataset there, then call Keras's), imported before the block or
    inside it, is replaced too, ``route``
    gets that class's ``fit`` as ``original`` and the user's own arguments, and any ``fit`` called while a routed
    one runs (the subclass's call of Keras's, or a fit a route makes) runs as it is.

    Example:
        >>> import keras
        >>> class Routed(ModelFitReplaced):
        ...     def route(self, original, model, args, kwargs):
        ...         return "routed", args
        >>> with Routed():
        ...     inside = keras.Sequential().fit(1, 2)
        >>> inside, "fit" in keras.Model.__dict__
        (('routed', (1, 2)), False)
    """

    original_fit: Callable | None = None

    def route(self, original: Callable, model, args: tuple, kwargs: dict):
        """What a ``fit`` of ``model`` does inside the block. Defaults to Keras's own."""
        return original(model, *args, **kwargs)

    def methods(self) -> dict[str, Callable]:
        """Other attributes of ``keras.Model`` to set inside the block. Defaults to none."""
        return {}

    def __enter__(self):
        keras = sys.modules.get("keras")
        model_class = getattr(keras, "Model", None)
        self._model_class, self._saved, self._routing = model_class, [], 0
        if model_class is None:
            return self
        methods = self.methods()
        self._saved = [(model_class, name, model_class.__dict__.get(name, MISSING)) for name in methods]
        self.original_fit = model_class.fit
        for owner in [model_class] + _overriding_fit(model_class):
            self._route_fit_of(owner)
        for name, method in methods.items():
            setattr(model_class, name, method)
        # a subclass defined inside the block (the cell imports KerasHub, say) has its own fit routed too
        self._saved.append((model_class, "__init_subclass__", model_class.__dict__.get("__init_subclass__", MISSING)))
        routing, base = self, model_class

        def routed_subclass(cls, **kwargs):
            super(base, cls).__init_subclass__(**kwargs)
            if inspect.isfunction(cls.__dict__.get("fit")):
                routing._route_fit_of(cls)

        model_class.__init_subclass__ = classmethod(routed_subclass)
        return self

    def _route_fit_of(self, owner) -> None:
        """``owner``'s ``fit`` (its own, or Keras's for ``keras.Model``) routed, restored at the block's end."""
        self._saved.append((owner, "fit", owner.__dict__.get("fit", MISSING)))
        owner.fit = self._routed(owner.__dict__["fit"] if owner is not self._model_class else owner.fit)

    def _routed(self, original: Callable) -> Callable:
        def fit(model, *args, **kwargs):
            __tracebackhide__ = True  # noqa: F841
            if self._routing:  # inside a routed fit: as it is
                return original(model, *args, **kwargs)
            self._routing += 1
            try:
                return self.route(original, model, args, kwargs)
            finally:
                self._routing -= 1

        fit.__doc__, fit.__wrapped__ = original.__doc__, original
        return fit

    def __exit__(self, *exc_info) -> None:
        saved, self._saved = self._saved, []
        for owner, name, value in reversed(saved):
            if value is MISSING:
                if name in owner.__dict__:
                    delattr(owner, name)
            else:
                setattr(owner, name, value)


def _overriding_fit(model_class) -> list:
    """The subclasses of ``model_class`` (imported so far) that define a ``fit`` of their own."""
    found, pending, seen = [], list(model_class.__subclasses__()), set()
    while pending:
        owner = pending.pop()
        if owner in seen:
            continue
        seen.add(owner)
        if inspect.isfunction(owner.__dict__.get("fit")):  # a method of its own (not a static one)
            found.append(owner)
        pending.extend(owner.__subclasses__())
    return found
