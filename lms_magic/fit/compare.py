"""Runs a Keras ``fit`` call with LMS and, on request, without it, from the same start.

Each variant starts from the same weights, optimizer state and random seed
(shuffling, dropout), trains the same number of steps on the same batches,
and is measured the same way (``MemoryProfiler``). The LMS variant runs last,
so the model ends as the LMS variant left it. A one-shot Python generator is
recorded during the first variant and replayed for the second.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator

import keras
import numpy as np

from .. import internals
from ..lms.options import LmsOptions
from .results import VariantResult
from ..memory.profile import MemoryProfiler
from .runs import OOM_ADVICE, FairStart

class _Recording:
    """A one-shot iterator's batches as the first variant draws them (all, or only the first)."""

    def __init__(self, source, keep_all: bool):
        self.source, self.keep_all, self.batches = source, keep_all, []

    def __iter__(self):
        for batch in self.source:
            if self.keep_all or not self.batches:
                self.batches.append(batch)
            yield batch

    def batch_size(self) -> int | None:
        if not self.batches:
            return None
        first = self.batches[0]
        leaf = first[0] if isinstance(first, (tuple, list)) else first
        return int(leaf.shape[0]) if getattr(leaf, "shape", None) else None


def _one_shot(data) -> bool:
    if isinstance(data, (keras.utils.PyDataset, np.ndarray, list, tuple, dict)):
        return False
    if type(data).__module__.startswith("tensorflow"):
        return False
    return inspect.isgenerator(data) or isinstance(data, Iterator)


def _batch_size(data, kwargs) -> int | None:
    """The samples a step of the fit takes: its ``batch_size``, Keras's 32 for arrays (at most the arrays' samples:
    a larger batch trains them all in one step), or the leading dimension of a dataset's first batch (tf.data,
    PyDataset, grain: read again, not consumed); None where not known."""
    leaves = [leaf for leaf in keras.tree.flatten(data) if leaf is not None] if isinstance(data, (dict, list)) else [data]
    arrays = bool(leaves) and all(isinstance(leaf, np.ndarray) and leaf.ndim for leaf in leaves)
    if kwargs.get("batch_size") or arrays:
        batch = int(kwargs.get("batch_size") or 32)  # Keras's default
        return min(batch, len(leaves[0])) if arrays else batch
    if data is None or _one_shot(data):
        return None
    try:
        first = next(iter(internals.numpy_batches(data)))
    except Exception:  # a kind of data Keras's adapters cannot read again
        return None
    leaves = [leaf for leaf in keras.tree.flatten(first) if leaf is not None]
    return int(np.shape(leaves[0])[0]) if leaves and np.ndim(leaves[0]) else None


class VariantRunner:
    """Runs one ``fit`` call as the variants asked for.

    Args:
        fit: the original, unpatched ``fit`` function.
        lms_options: the LMS options, checked (``LmsOptions``).
        compare: also run without LMS.
        max_steps: stop each variant after this many steps.
        interval_s: memory sampling interval.
        announce: prints a line as each variant starts.
        notes: where to add notes on the comparison (the result's notes).
        explain_out_of_memory: ``(model, args, kwargs, fit) -> text``, announced after a variant ran out of memory
            (what filled the step, what would fit), or None.
    """

    def __init__(self, fit, lms_options: LmsOptions, compare: bool, max_steps: int | None, interval_s: float,
                 announce=print, notes: list | None = None, explain_out_of_memory=None):
        self._fit = fit
        self._explain_out_of_memory = explain_out_of_memory
        self.lms_options = lms_options
        self.compare = compare
        self.max_steps = max_steps
        self.interval_s = interval_s
        self._announce = announce
        self.notes = notes if notes is not None else []  # what the user should know about the comparison

    def _note_unfair_data(self, data) -> None:
        if internals.reshuffles_each_iteration(data):
            note = ("--compare: the tf.data pipeline shuffles in a new order for each pass over it, so the variants "
                    "trained on different batches (their losses differ for that reason alone); for the same "
                    "batches, shuffle with .shuffle(n, seed=..., reshuffle_each_iteration=False) or pass arrays "
                    "(x, y) with shuffle=True, which %%lms_fit seeds alike for both variants")
            if note not in self.notes:
                self.notes.append(note)

    def run(self, model, args: tuple, kwargs: dict, fit=None) -> tuple[object, list[VariantResult]]:
        """Runs ``fit(model, *args, **kwargs)`` (``fit``: the runner's own where None) as each variant; the
        history the cell gets, and each variant's result."""
        from ..lms.callback import LMS

        args, kwargs = list(args), dict(kwargs)
        _check_callbacks(kwargs.get("callbacks"))
        data = args[0] if args else kwargs.get("x")
        if self.compare and _one_shot(kwargs.get("validation_data")):
            raise ValueError("%%lms_fit --compare cannot replay a one-shot validation generator; pass a list of "
                             "batches, a keras.utils.PyDataset or a tf.data.Dataset as validation_data")
        recording = _Recording(data, keep_all=self.compare) if _one_shot(data) else None
        if self.compare:
            _build_for_training(model, args, kwargs)
        if self.compare:
            self._note_unfair_data(data)
        start = FairStart(model, kwargs.get("callbacks"), reseed=self.compare)  # one run: the user's random state
        names = ["no_lms", "lms"] if self.compare else ["lms"]
        results, histories = [], {}
        for name in names:
            if recording is not None:
                # Keras reads generators (not other iterators): replay through one
                source = iter(recording) if name == names[0] else (batch for batch in list(recording.batches))
                args, kwargs = _replace_data(args, kwargs, source)
            hint = recording.batch_size if recording is not None else None
            lms = LMS.from_options(self.lms_options.replace(batch_size_hint=hint)) if name == "lms" else None
            self._announce(f"--- %%lms_fit: {'with LMS' if lms else 'without LMS'} ({name}) ---")
            profiler = MemoryProfiler(interval_s=self.interval_s).start()
            outcome = start.run(functools.partial(fit or self._fit, model), args, kwargs, [lms] if lms else [], self.max_steps, profiler)
            error = None
            if outcome.status == "oom":
                error = f"out of memory: {OOM_ADVICE}"
                self._announce(f"--- {name} ran out of memory; {OOM_ADVICE} ---")
                if self._explain_out_of_memory is not None and not outcome.explained:
                    self._announce(self._explain_out_of_memory(model, args, kwargs, fit))
            histories[name] = outcome.history
            batch_size = _batch_size(data, kwargs) or (recording.batch_size() if recording else None)
            results.append(VariantResult.from_run(name, outcome.status, error, outcome.recorder, profiler.report,
                                                  outcome.history, lms, batch_size,
                                                  internals.jit_compile_requested(model)))
        chosen = next((histories[r.name] for r in reversed(results) if histories[r.name] is not None), None)
        return chosen if chosen is not None else keras.callbacks.History(), results


def _check_callbacks(callbacks) -> None:
    """Refuses, before anything is trained or saved, a ``callbacks`` that Keras's fit would fail on later.

    Raises:
        TypeError: ``callbacks`` is not a list of ``keras.callbacks.Callback`` (the message says which item).
    """
    if callbacks is None:
        return
    if isinstance(callbacks, keras.callbacks.Callback) or not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"fit(callbacks=...) takes a list of keras.callbacks.Callback objects, got "
                        f"{type(callbacks).__name__}: write callbacks=[...]")
    for position, callback in enumerate(callbacks):
        if not isinstance(callback, keras.callbacks.Callback):
            raise TypeError(f"fit(callbacks=...): item {position} is {callback!r}, not a keras.callbacks.Callback; "
                            "remove it (for a function, wrap it: keras.callbacks.LambdaCallback(on_epoch_end=...))")


def _build_for_training(model, args: list, kwargs: dict) -> None:
    """Builds the model's metrics and loss on one batch of array data, as a first ``fit`` does.

    A first fit draws that batch from its own (shuffling) iterator, which on
    the PyTorch backend moves the random state that the shuffling of the
    *first* variant alone would then see. Built beforehand, both variants
    start from the same random state.
    """
    x = args[0] if args else kwargs.get("x")
    y = args[1] if len(args) > 1 else kwargs.get("y")
    if not isinstance(x, np.ndarray):
        return
    take = kwargs.get("batch_size") or 32
    try:
        internals.build_for_training(model, (x[:take], None if y is None else np.asarray(y)[:take]))
    except Exception:  # a best effort: the fit itself builds what this did not
        pass


def _replace_data(args: list, kwargs: dict, data):
    if args:
        return [data] + args[1:], kwargs
    return args, {**kwargs, "x": data}
