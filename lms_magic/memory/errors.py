"""The frameworks' out-of-memory errors, told apart from the rest (no framework import)."""

from __future__ import annotations


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
