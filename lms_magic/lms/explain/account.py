"""An out-of-memory error explained where it happens: what the step needed, what filled it, and what would fit.

:func:`out_of_memory_account` is the text, ``explain_fit``'s account of the step at the fit's batch size; the
``LMS`` callback prints it above an out-of-memory error of its own step. :class:`OutOfMemoryExplained` is a context
manager the magics put around a cell: while it is active, a Keras ``fit`` that dies of an out-of-memory error
(TensorFlow's ``ResourceExhaustedError``, PyTorch's ``OutOfMemoryError``, JAX's ``RESOURCE_EXHAUSTED``) is
remembered, and once the cell's measuring is over the account is printed, then the original error shows
unchanged. Before the account, the library frames of the error's traceback let go of the failed step's tensors
(``memory.errors.release_library_frames``), so the device is free for it and for the next cell.
:class:`FitsExplained` (``%%gpumem --explain``) gives the account instead of training. The account traces the step
and trains nothing: the model, its weights and the optimizer state stay as the error left them. Both catch ``fit``
through ``fit_interceptor.ModelFitReplaced``, the one interceptor of ``fit``.
"""

from __future__ import annotations

from typing import Callable

from ...fit_interceptor import ModelFitReplaced
from ...memory.errors import explained, is_out_of_memory, release_library_frames

DEFAULT_BATCH_SIZE = 32  # Keras's, where a fit of arrays names none


def fit_data(args: tuple, kwargs: dict, fit=None):
    """The data and batch size of a ``fit(x, y, batch_size, ...)`` call, as ``explain_fit`` takes them: ``(x, y)``
    or ``(x, y, sample_weight)`` for arrays (batch size as given, else Keras's 32), or the dataset with the batch
    size of its first batch. ``fit`` names the positional arguments (Keras's ``fit`` by default).

    Example:
        >>> import numpy as np
        >>> data, batch = fit_data((np.ones((10, 3)), np.ones(10)), {"batch_size": 4, "sample_weight": np.ones(10)})
        >>> len(data), batch
        (3, 4)
    """
    import keras
    import numpy as np

    from ..samples import fit_call

    data, batch_size, _ = fit_call(fit or keras.Model.fit, args, kwargs)
    if data[0] is None:
        raise ValueError("the fit was given no data")
    if len(data) > 1 or hasattr(data[0], "shape"):
        return data, int(batch_size or DEFAULT_BATCH_SIZE)
    dataset = data[0]
    if batch_size is None:  # a dataset of batches: the leading dimension of its first batch
        from ...internals import numpy_batches

        leaves = [leaf for leaf in keras.tree.flatten(next(iter(numpy_batches(dataset)), None)) if leaf is not None]
        batch_size = np.shape(leaves[0])[0] if leaves and np.ndim(leaves[0]) else None
    return dataset, int(batch_size or DEFAULT_BATCH_SIZE)


def fit_steps_of(args: tuple, kwargs: dict, fit=None):
    """The steps a ``fit(x, y, ...)`` call runs at each batch size (``samples.fit_steps``): a way with LMS is
    predicted as the step a fit that long keeps."""
    import keras

    from ..samples import fit_call, fit_length, fit_steps

    data, _, rest = fit_call(fit or keras.Model.fit, args, kwargs)
    return fit_steps(data, *fit_length(rest))


def not_explained(why: str) -> str:
    """The one line said above an out-of-memory error whose step cannot be explained: ``why``, then what to run.

    Example:
        >>> not_explained("its data could not be read again").startswith("lms_magic: the fit ran out of device "
        ...                                                               "memory; its data could not be read again. ")
        True
    """
    return (f"lms_magic: the fit ran out of device memory; {why}. lms_magic.explain_fit(model, data, batch_size=...) "
            "says what filled the step and the largest batch each way of training fits")


def out_of_memory_account(model, data, batch_size: int, fit_steps=None) -> str:
    """The lines said above an out-of-memory error of a fit of ``model`` on ``data`` at ``batch_size``
    (``fit_steps``: its steps at a batch size, as ``explain_fit``'s ``epochs`` count them): what the step needed,
    what filled it, what would fit. Never raises: where the step cannot be explained, one line says why (the user's
    own error must come through whatever happens here)."""
    from .replay import explained

    try:
        found = explained(model, data, batch_size=batch_size, fit_steps=fit_steps)
    except Exception as error:
        return not_explained(f"the step could not be explained ({error})")
    return "lms_magic: the fit ran out of device memory. Why, and what fits (predicted, nothing trained):\n" + \
        "\n".join("  " + line for line in found.lines())


def explain_out_of_memory(model, args: tuple, kwargs: dict, fit=None) -> str:
    """The lines printed above an out-of-memory error of ``fit(model, *args, **kwargs)`` (``fit``: Keras's where
    None); never raises (where the step cannot be explained, one line says why)."""
    try:
        data, batch_size = fit_data(args, kwargs, fit)
        fit_steps = fit_steps_of(args, kwargs, fit)
    except Exception as error:
        return not_explained(f"its data could not be read again ({error})")
    return out_of_memory_account(model, data, batch_size, fit_steps)


class OutOfMemoryExplained(ModelFitReplaced):
    """While active, a Keras ``fit`` that runs out of memory is remembered, and :meth:`say_why` prints its
    explanation (call it once the measuring is over, before the error shows); the error is raised as it was.

    Args:
        say: where the explanation goes. Defaults to ``print``.
        explain: ``(model, args, kwargs, fit) -> text``. Defaults to :func:`explain_out_of_memory`.
    """

    def __init__(self, say: Callable[[str], None] = print, explain=explain_out_of_memory):
        self._say, self._explain = say, explain
        self._pending: list[tuple] = []

    def route(self, original, model, args, kwargs):
        __tracebackhide__ = True  # noqa: F841
        try:
            history = original(model, *args, **kwargs)
            _wait_for_the_device(model)
            return history
        except Exception as error:
            if is_out_of_memory(error) and not explained(error) and \
                    not any(error is pending[0] for pending in self._pending):
                self._pending.append((error, model, args, kwargs, original))
            raise

    def say_why(self) -> None:
        """Prints the explanation of each out-of-memory error seen so far (once each). First frees what the failed
        step's frames still hold (``release_library_frames``): the explanation needs the device too."""
        pending, self._pending = self._pending, []
        for error, model, args, kwargs, fit in pending:
            release_library_frames(error)
            self._say(self._explain(model, args, kwargs, fit))


def _wait_for_the_device(model) -> None:
    """The fit's framework waits for its last step (``Framework.wait_for_the_device``: JAX runs steps
    asynchronously); nothing on a Keras backend LMS does not run on."""
    import keras

    from ..framework import NAMES, framework

    name = keras.backend.backend()
    if name in NAMES:
        framework(name).wait_for_the_device(model)


class FitsExplained(ModelFitReplaced):
    """While active, a Keras ``fit`` trains nothing: it prints ``explain_fit``'s account of its step at its batch
    size and returns the :class:`~lms_magic.lms.explain.results.FitExplanation` (``%%gpumem --explain``)."""

    def __init__(self, say: Callable[[str], None] = print):
        self._say = say

    def route(self, original, model, args, kwargs):
        from .replay import explained

        data, batch_size = fit_data(args, kwargs, original)
        found = explained(model, data, batch_size=batch_size, fit_steps=fit_steps_of(args, kwargs, original))
        self._say(str(found))
        return found


__all__ = ["FitsExplained", "OutOfMemoryExplained", "explain_out_of_memory", "fit_data", "not_explained",
           "out_of_memory_account"]
