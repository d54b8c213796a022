"""The largest batch to train at: ``largest_batch``, Keras's counterpart to Lightning's ``BatchSizeFinder``.

``explain_fit`` predicts each way's largest batch, corrected by a plain step measured on the device and confirmed
by steps there (``explain/largest.py``). Where LMS fits a larger batch than a plain step does, the batches between are
looked at on LMS's frontier (its predicted step time over a plain step's), and the largest at ``speed`` of plain
speed or better is chosen; else the largest plain batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..lms.explain.results import FitExplanation

LADDER_POINTS = 8  # batch sizes looked at between the largest plain batch and LMS's


class NoCapacityError(ValueError):
    """No device capacity is known (no GPU, no ``simulate_accelerator(memory=...)``) and none was passed."""


@dataclass(frozen=True)
class LargestBatch:
    """The batch chosen, how to train at it, and why.

    ``options`` are the ``LMS`` options to train with (None: without LMS); ``magic`` the ``%%lms_fit`` line.
    """

    batch_size: int
    options: dict | None
    magic: str
    why: str
    explanation: FitExplanation

    def __str__(self) -> str:
        how = f"with `{self.magic}`" if self.options is not None else "without LMS"
        return f"batch {self.batch_size}, {how}: {self.why}"

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))


def largest_batch(model, data, speed: float = 0.9, capacity=None, batch_size: int = 32, confirm=None,
                  budget=None, **options) -> LargestBatch:
    """The largest batch ``model`` trains at on the device, at ``speed`` of plain speed or better.

    Args:
        model: a compiled Keras model.
        data: ``(x, y)`` arrays or an unbatched ``tf.data.Dataset``.
        speed: the share of a plain step's speed a step with LMS may not fall below. Defaults to 0.9.
        capacity: the device's memory ("16GiB" or bytes). Defaults to the device LMS relieves.
        budget: the bytes every way of training may fill ("512MiB" or bytes; ``%%lms_fit --budget``), instead of
            the usable share of the device's capacity. Defaults to None.
        batch_size: the batch explained beside it (``explain_fit``'s). Defaults to 32.
        confirm: as for ``explain_fit``. Defaults to None: confirmed by steps wherever the device's allocator can
            be read (a GPU; ``simulate_accelerator``'s device, where a step with LMS is read as LMS reads its own).
        **options: ``min_bytes``, ``device``, ``host_device``, as for ``LMS``; ``epochs``, ``steps_per_epoch``,
            the fit's, as for ``explain_fit``.

    Returns:
        A :class:`LargestBatch` (``print`` it).

    Raises:
        NoCapacityError: no device capacity known, and no ``capacity`` or ``budget`` passed.
        ValueError: a bad option (the message says what to pass).

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((256,))] + [keras.layers.Dense(512, activation="relu")
        ...                           for _ in range(4)] + [keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> chosen = largest_batch(model, (np.ones((8, 256), "float32"), np.ones(8)), capacity="64MiB", min_bytes=0)
        >>> chosen.batch_size > 1000
        True
    """
    from ..lms.explain.replay import device_capacity
    from .explain_fit import explain_fit, measurable

    if not 0 < speed <= 1:
        raise ValueError(f"speed={speed!r}: a share of plain speed, above 0 and at most 1 (0.9: 90%)")
    if capacity is None and budget is None and device_capacity(options) is None:
        raise NoCapacityError("largest_batch: no device capacity known (no GPU, no "
                              "simulate_accelerator(memory=...)); pass capacity='16GiB' or budget='12GiB'")
    if confirm is None:  # confirmed wherever steps can be measured: it is the batch the fit will run at
        confirm = measurable(model, data, **options)
    found = explain_fit(model, data, batch_size=batch_size, capacity=capacity, modes=("without LMS", "LMS"),
                        speed_target=speed, confirm=confirm, budget=budget, **options)
    plain, lms = found.modes
    plain_best = _best(plain)
    lms_best = _best(lms) if not lms.unavailable else 0
    plain_words = _words(plain, plain_best)
    if lms_best <= plain_best:
        return LargestBatch(plain_best, None, "%%lms_fit --n-tensors 0", f"{plain_words}; LMS fits no larger "
                            f"batch ({lms_best})", found)
    ladder = sorted({int(plain_best + (lms_best - plain_best) * k / LADDER_POINTS) for k in range(1, LADDER_POINTS + 1)})
    budget = lms.magic.partition("--budget ")[2] or budget  # where a measured step corrected the plans
    # the ladder's step times predicted for the plans LMS will make: for what it plans to fill, in the replay's bytes
    planned = found.plan_budget_bytes if found.plan_budget_bytes is not None else budget
    frontier = explain_fit(model, data, batch_size=batch_size, capacity=found.capacity_bytes, modes=("LMS",),
                           batch_sizes=ladder, speed_target=speed, confirm=False, budget=planned or None, **options)
    fast = [point for point in frontier.frontier if point.batch_size <= lms_best and point.step_ratio is not None
            and point.step_ratio <= 1 / speed]
    if not fast:
        return LargestBatch(plain_best, None, "%%lms_fit --n-tensors 0", f"{plain_words}; with LMS every larger batch "
                            f"is predicted slower than {speed:.0%} of plain speed", found)
    chosen = max(fast, key=lambda point: point.batch_size)
    lms_options = {**options, **({"budget": budget} if budget else {})}
    return LargestBatch(chosen.batch_size, lms_options, lms.magic or "%%lms_fit",
                        f"with LMS, a step predicted at {chosen.step_ratio:.2f}x a plain step's time (at most "
                        f"{1 / speed:.2f}x); {_words(lms, lms_best)}; {plain_words}", found)


def _best(mode) -> int:
    """A way's largest batch: the confirmed one where steps confirmed it, else the predicted one."""
    if mode.confirmed is not None:
        return mode.confirmed.batch_size
    return mode.largest_batch or 0


def _words(mode, best: int) -> str:
    source = mode.confirmed.words if mode.confirmed is not None else "predicted"
    return f"{mode.mode}: largest batch {best} ({source})"


__all__ = ["LargestBatch", "NoCapacityError", "largest_batch"]
