"""The LMS train function: in the model's ``train_function`` for one batch at a time.

``LMS.on_train_batch_begin`` arms it, for the ``fit`` that called the callback; its call puts the
model's own train function back first, then runs the LMS step inside the callback's step scope.
Where a fit ends between the two (an exception in a later callback's batch begin), it stays
behind inert: a call from any other fit puts the model's own function back and trains plainly, and
the next LMS ``fit`` removes it before it starts. So nothing of the model is changed between steps,
whatever ends a fit.
"""

from __future__ import annotations

from typing import Callable, ContextManager

from .. import internals


class LmsTrainFunction:
    """A train function that runs ``function`` (the LMS step) once armed by the fit it belongs to.

    Args:
        function: the LMS train function (made with the rewritten train step).
        plain: the model's own train function, put back at every call.
        model: the model whose ``train_function`` this takes the place of.
        step_scope: entered around each LMS step.

    Example:
        >>> import contextlib, types
        >>> calls = []
        >>> model = types.SimpleNamespace(train_function=None)
        >>> lms = LmsTrainFunction(lambda: calls.append("lms"), lambda: calls.append("plain"), model,
        ...                        contextlib.nullcontext)
        >>> def fit():  # as Keras's fit: the callbacks' batch begin, then the train function
        ...     lms.arm()
        ...     model.train_function()
        >>> fit(); calls, model.train_function is lms.plain
        (['lms'], True)
        >>> def other_fit():
        ...     model.train_function()
        >>> lms.arm(); other_fit()  # armed, then called by a fit other than the one that armed it: plain
        >>> calls
        ['lms', 'plain']
    """

    def __init__(self, function: Callable, plain: Callable, model, step_scope: Callable[[], ContextManager[None]]):
        self._function = function
        self.plain = plain
        self._model = model
        self._step_scope = step_scope
        self._armed_by: tuple = ()  # the frames of the fit that armed it, until its call

    def arm(self) -> None:
        """Takes the model's train function for the next step of the fit that calls this."""
        self._armed_by = internals.calling_frames()
        self._model.train_function = self

    @staticmethod
    def remove_from(model) -> None:
        """Puts the model's own train function back if an LMS train function is there."""
        current = getattr(model, "train_function", None)
        if isinstance(current, LmsTrainFunction):
            current._armed_by = ()
            model.train_function = current.plain

    @staticmethod
    def is_in(model) -> bool:
        """Whether an LMS train function (armed or left inert) is the model's train function.

        Example:
            >>> import types
            >>> LmsTrainFunction.is_in(types.SimpleNamespace(train_function=print))
            False
        """
        return isinstance(getattr(model, "train_function", None), LmsTrainFunction)

    def __call__(self, *args, **kwargs):
        self._model.train_function = self.plain
        armed, self._armed_by = internals.called_from(self._armed_by), ()
        if not armed:
            return self.plain(*args, **kwargs)
        with self._step_scope():
            return self._function(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._function, name)
