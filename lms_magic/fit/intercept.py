"""Routes every Keras ``fit`` (and the legacy ``fit_generator``) of a cell through a runner."""

from __future__ import annotations

from ..fit_interceptor import ModelFitReplaced
from .snapshot import TrainingState


class FitInterceptor(ModelFitReplaced):
    """While active, ``keras.Model.fit`` (or a subclass's own ``fit``: the outermost one called) and
    ``keras.Model.fit_generator`` call ``run(fit, model, args, kwargs)``, ``fit`` the one called, unreplaced
    (``fit_interceptor.ModelFitReplaced``, the one interceptor of ``fit``).

    Each model is captured at its first ``fit`` in the cell, so :meth:`restore_models` can put every model back as
    it was before the cell. ``keras.Model`` is as before on exit, whatever happened.
    """

    def __init__(self, run):
        self._run = run
        self._states: list[tuple[object, TrainingState]] = []

    def __enter__(self) -> "FitInterceptor":
        import keras  # noqa: F401  (imported, so that there is a fit to route)

        return super().__enter__()

    def methods(self) -> dict:
        from .legacy import fit_generator as legacy_fit_generator

        def fit_generator(model, generator, *args, **kwargs):
            return legacy_fit_generator(model, generator, *args, **kwargs)

        return {"fit_generator": fit_generator}

    def route(self, original, model, args, kwargs):
        if all(known is not model for known, _ in self._states):
            self._states.append((model, TrainingState.capture(model)))
        return self._run(original, model, args, kwargs)

    def restore_models(self) -> None:
        """Puts every model that trained in the cell back as it was before the cell."""
        for _, state in self._states:
            state.restore()
