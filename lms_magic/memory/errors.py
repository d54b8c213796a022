"""The frameworks' out-of-memory errors, told apart from the rest (no framework import)."""

from __future__ import annotations

import inspect


def is_out_of_memory(error: BaseException) -> bool:
    """TensorFlow's ResourceExhaustedError, PyTorch's OutOfMemoryError, JAX's RESOURCE_EXHAUSTED.

    Example:
        >>> is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")), is_out_of_memory(KeyError())
        (True, False)
    """
    name = type(error).__name__
    text = str(error)
    return name in ("ResourceExhaustedError", "OutOfMemoryError") or "RESOURCE_EXHAUSTED" in text \
        or "out of memory" in text.lower()


_EXPLAINED = "lms_magic_explained"  # set on an error whose account was printed


def mark_explained(error: BaseException) -> None:
    """Notes on ``error`` that its out-of-memory account was printed: the magics around the fit do not say it again.

    Example:
        >>> error = MemoryError("out of memory"); mark_explained(error); explained(error), explained(KeyError())
        (True, False)
    """
    try:
        setattr(error, _EXPLAINED, True)
    except AttributeError:  # an error type that takes no attributes: said twice at worst
        pass


def explained(error: BaseException) -> bool:
    """Whether ``error``'s out-of-memory account was printed already (:func:`mark_explained`)."""
    return getattr(error, _EXPLAINED, False)


_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
# the libraries whose frames an out-of-memory error's traceback keeps with the step's tensors in their locals
_LIBRARIES = ("keras", "torch", "jax", "jaxlib", "tensorflow", "optree", "lms_magic")


def release_library_frames(error: BaseException) -> int:
    """Clears the locals of the library frames (Keras, PyTorch, JAX, TensorFlow, this package) in ``error``'s
    traceback, so the tensors they hold (a failed step's activations) are freed; returns how many were cleared.

    An out-of-memory error keeps every frame it passed through, and with them the step's tensors: the device
    stays as full as when it failed, so nothing (an explanation, the user's next cell at a smaller batch) can use
    it. The user's own frames, the traceback's lines and the error's message are kept: ``%debug`` still opens the
    cell's frames with their variables. Frames still running, and generators' frames, are left as they are.

    """
    cleared, seen = 0, set()
    for frame in _frames_of(error):
        if id(frame) in seen:
            continue
        seen.add(id(frame))
        if str(frame.f_globals.get("__name__", "")).split(".")[0] in _LIBRARIES and \
                not frame.f_code.co_flags & _SUSPENDABLE:  # clearing a generator's frame would close it
            try:
                frame.clear()
                cleared += 1
            except RuntimeError:  # still running (the frame that is explaining the error, say)
                pass
    return cleared


def _frames_of(error: BaseException):
    """The frames ``error`` keeps alive: its traceback's, and their callers' (Keras drops its own frames from the
    traceback it shows, but the frames below still point to them), for the error and what it was raised from."""
    errors = set()
    while error is not None and id(error) not in errors:
        errors.add(id(error))
        traceback = error.__traceback__
        while traceback is not None:
            frame = traceback.tb_frame
            while frame is not None:
                yield frame
                frame = frame.f_back
            traceback = traceback.tb_next
        error = error.__cause__ or error.__context__
