"""The Keras ``fit`` that called a callback, read from its stack frames: whether it is the same fit, and the
batch size it was given or its data adapter chose."""

from __future__ import annotations

import sys


def calling_frames(depth: int = 8) -> tuple:
    """The frames that called the caller (a callback's hook: Keras's fit among them).

    The frames themselves, not their ids: a frame of a fit that ended is
    freed, and a later fit's frame can take its address (a plain fit was
    once taken for the LMS fit that way). Holding them keeps that from
    happening; the holder lets go of them at the next call.
    """
    frame, found = sys._getframe(2), []
    while frame is not None and len(found) < depth:
        found.append(frame)
        frame = frame.f_back
    return tuple(found)


def called_from(frames: tuple) -> bool:
    """Whether the caller's caller is one of ``frames`` (the same fit that armed a train function)."""
    caller = sys._getframe(2)
    return any(frame is caller for frame in frames)


def fit_batch_size(frames) -> tuple[int | None, str]:
    """The batch size of the Keras ``fit`` among ``frames`` (a callback's callers), and where it was read.

    The largest batch the data yields: the fit call's ``batch_size`` for arrays, the leading dimension of
    the first batch of a generator (which Keras has already drawn) or of a PyDataset (read once here),
    the batch of a ``tf.data`` pipeline's ``batch()``. ``(None, "")`` where none is found.
    """
    for frame in frames:
        iterator = frame.f_locals.get("epoch_iterator") if frame.f_code.co_name == "fit" else None
        adapter = getattr(iterator, "data_adapter", None)
        if adapter is not None:
            return _adapter_batch_size(adapter)
    return None, ""


def _leading_dimension(batch) -> int | None:
    leaf = batch
    while isinstance(leaf, (tuple, list, dict)) and leaf:
        leaf = next(iter(leaf.values())) if isinstance(leaf, dict) else leaf[0]
    shape = getattr(leaf, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) and shape[0] is not None else None


def _adapter_batch_size(adapter) -> tuple[int | None, str]:
    try:
        size = adapter.batch_size
    except Exception:  # an adapter kind that cannot say
        size = None
    if size:
        kind = type(adapter).__name__
        source = "the dataset's batch" if "TFDataset" in kind else "the fit call's batch_size"
        return int(size), source
    first_batches = getattr(adapter, "_first_batches", None)  # a generator: Keras drew these already
    if first_batches:
        return _leading_dimension(first_batches[0]), "the generator's first batch"
    py_dataset = getattr(adapter, "py_dataset", None)
    if py_dataset is not None:
        try:
            return _leading_dimension(py_dataset[0]), "the PyDataset's first batch"
        except Exception:
            return None, ""
    dataset = getattr(adapter, "_dataset", None)
    while dataset is not None:  # a tf.data pipeline: the batch() that made its batches
        size = getattr(dataset, "_batch_size", None)
        if size is not None:
            try:
                return int(size), "the dataset's batch()"
            except (TypeError, ValueError):
                return None, ""
        dataset = getattr(dataset, "_input_dataset", None)
    return None, ""
