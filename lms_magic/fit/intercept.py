"""Routes every Keras ``fit`` (and the legacy ``fit_generator``) of a cell through a runner."""

from __future__ import annotations

from .snapshot import TrainingState

_MISSING = object()


class FitInterceptor:
    """While active, ``keras.Model.fit`` and ``keras.Model.fit_generator`` call ``run(model, args, kwargs)``.

    Each model is captured at its first ``fit`` in the cell, so
    :meth:`restore_models` can put every model back as it was before the cell.
    The class attributes are restored on exit, whatever happened.
    """

    def __init__(self, run):
        self._run = run
        self._states: list[tuple[object, TrainingState]] = []
        self._saved: dict[str, object] = {}
        self._busy = False
        self.original_fit = None

    def __enter__(self) -> "FitInterceptor":
        import keras

        from .legacy import fit_generator as legacy_fit_generator

        model_class = keras.Model
        for name in ("fit", "fit_generator"):
            self._saved[name] = model_class.__dict__.get(name, _MISSING)
        self.original_fit = model_class.fit
        interceptor = self

        def fit(model, *args, **kwargs):
            if interceptor._busy:  # a fit inside a fit: leave it alone
                return interceptor.original_fit(model, *args, **kwargs)
            if all(known is not model for known, _ in interceptor._states):
                interceptor._states.append((model, TrainingState.capture(model)))
            interceptor._busy = True
            try:
                return interceptor._run(model, args, kwargs)
            finally:
                interceptor._busy = False

        def fit_generator(model, generator, *args, **kwargs):
            return legacy_fit_generator(model, generator, *args, **kwargs)

        fit.__doc__ = self.original_fit.__doc__
        model_class.fit = fit
        model_class.fit_generator = fit_generator
        return self

    def __exit__(self, *exc_info) -> None:
        import keras

        for name, value in self._saved.items():
            if value is _MISSING:
                if name in keras.Model.__dict__:
                    delattr(keras.Model, name)
            else:
                setattr(keras.Model, name, value)

    def restore_models(self) -> None:
        """Puts every model that trained in the cell back as it was before the cell."""
        for _, state in self._states:
            state.restore()
