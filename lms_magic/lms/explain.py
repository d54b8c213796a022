"""Why a fit does not fit, and what will, without training: ``explain_fit``.

The traced step (``predictors.StepPredictors``, as ``%lms_tune``'s: on TensorFlow one trace per way of training and
the batch asked for sized from it, every other batch size read off those, ``StepPredictor.rescale_batches``; on JAX a jaxpr per batch size; on PyTorch
the step run at two small batch sizes, ``torch/predictor.py``) gives the step's predicted device peak explained: what fills it by kind (weights, optimizer state, gradients, activations)
and the Keras layers whose tensors hold the most at the peak. Against the device's capacity
(given, the GPU's, or ``simulate_accelerator``'s), it finds the largest batch each way of training
fits: without LMS, with LMS's default plan, with ``recompute="only"`` and with ``lean_ops``, each
with its predicted step time over a plain step's, and the ``%%lms_fit`` line that trains the
batch asked for where one does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from ..units import format_size, parse_bytes
from .core.plan import CAPACITY_HEADROOM, DEFAULT_MIN_BYTES, MEASURED_HEADROOM, usable_bytes
from .core.simulate import collector_paused
from .options import whole_number

# name, the tuner's options, and the %%lms_fit line that trains that way
MODES = (("without LMS", {}, ""), ("LMS", {}, "%%lms_fit"),
         ("LMS, recompute", {"recompute": "only"}, "%%lms_fit --recompute only"),
         ("LMS, lean_ops", {"lean_ops": True}, "%%lms_fit --lean-ops"))
MAX_BATCH = 1 << 16  # the largest batch looked for
# beside lean_ops's figures where the model has no layer it changes: they are LMS's alone
NOTHING_LEAN = "the same as LMS alone: lean_ops changes BatchNormalization's gradient, and the model has none"


def largest_fitting(fits: Callable[[int], bool], guess: int, limit: int = MAX_BATCH) -> int:
    """The largest batch size ``b`` in 1..``limit`` with ``fits(b)``, 0 where none fits, for a ``fits`` that holds
    up to some size and not past it; ``guess`` is where the search starts (each call of ``fits`` may trace).

    Example:
        >>> calls = []
        >>> def fits(batch):
        ...     calls.append(batch)
        ...     return batch <= 37
        >>> largest_fitting(fits, guess=36), largest_fitting(lambda b: False, 8), largest_fitting(lambda b: True, 8, 100)
        (37, 0, 100)
        >>> len(calls) <= 6
        True
    """
    known: dict[int, bool] = {}

    def check(batch: int) -> bool:
        if batch not in known:
            known[batch] = fits(batch)
        return known[batch]

    low, high = 0, limit + 1  # fits(low) holds (or low is 0), fits(high) does not (or high is past the limit)
    probe = min(max(1, guess), limit)
    if check(probe):
        low, step = probe, 1
        while low < limit and check(min(low + step, limit)):
            low, step = min(low + step, limit), step * 2
        high = min(low + step, limit + 1)
    else:
        high, step = probe, 1
        while high > 1 and not check(max(high - step, 1)):
            high, step = max(high - step, 1), step * 2
        low = max(high - step, 1) if check(max(high - step, 1)) else 0
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if check(middle) else (low, middle)
    return low


@dataclass(frozen=True)
class ModeFit:
    """One way of training, at the batch asked for and at its largest batch that fits."""

    mode: str
    peak_bytes: int | None  # predicted at the batch asked for
    fits: bool | None  # within the usable capacity (None: no capacity known)
    largest_batch: int | None  # the largest batch predicted to fit (0: none; None: no capacity known)
    step_ratio: float | None  # predicted step time over a plain step's, at the batch asked for
    magic: str  # the %%lms_fit line that trains this way ("" without LMS)
    unavailable: str = ""  # why this way is not offered on this backend
    note: str = ""  # said beside its figures (lean_ops on a model it changes nothing in)


@dataclass(frozen=True)
class FrontierPoint:
    """One way of training at one batch size: the predicted peak and step time."""

    batch_size: int
    mode: str
    peak_bytes: int
    step_ratio: float | None  # predicted step time over a plain step's at this batch
    fits: bool | None  # within the usable capacity (None: no capacity known)


@dataclass(frozen=True)
class FitExplanation:
    """What ``explain_fit`` found: the step's peak explained, and what fits. ``to_dict()`` has every figure."""

    batch_size: int
    capacity_bytes: int | None
    usable_bytes: int | None
    peak: dict  # stats["peak"]'s form (core/peak.py) of the step without LMS at batch_size
    modes: list[ModeFit] = field(default_factory=list)
    frontier: list[FrontierPoint] = field(default_factory=list)  # with explain_fit(..., batch_sizes=...)
    speed_target: float = 0.9  # the share of a plain step's speed that "at speed" asks for
    caveat: str = ""  # what the backend's prediction leaves out, where that matters to the answers
    # the peak without LMS where it is not the replay's (peak["bytes"]): its figure and source ("XLA's compiled
    # figure" on JAX)
    plain_peak_bytes: int | None = None
    plain_peak_source: str = ""
    plain_usable_bytes: int | None = None  # what the step without LMS may fill, where not usable_bytes

    @property
    def plain_limit_bytes(self) -> int | None:
        """What the step without LMS may fill where that differs from what LMS plans to (a peak the framework
        itself gives: 95% of the device, not 80%), else None."""
        differs = self.plain_usable_bytes and self.plain_usable_bytes != self.usable_bytes
        return self.plain_usable_bytes if differs else None

    def largest_at_speed(self) -> FrontierPoint | None:
        """The frontier's largest batch that fits at ``speed_target`` of plain speed or better (a step at most
        1 / ``speed_target`` of a plain step's time), the fastest way first where batches tie; None if none."""
        chosen = [point for point in self.frontier if point.fits and point.step_ratio is not None
                  and point.step_ratio <= 1 / self.speed_target]
        return max(chosen, key=lambda point: (point.batch_size, -point.step_ratio), default=None)

    @property
    def suggestion(self) -> str:
        """The first ``%%lms_fit`` line predicted to train ``batch_size``: "" where the step fits without LMS or
        nothing does."""
        if not self.modes or self.modes[0].fits is not False:
            return ""
        return next((mode.magic for mode in self.modes[1:] if mode.fits), "")

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """The explanation as plain lines, for a terminal."""
        peak = self.peak
        limit = self.plain_limit_bytes
        plain = f"; without LMS, its peak may fill {format_size(limit)}" if limit else ""
        device = (f"the device has {format_size(self.capacity_bytes)} (LMS plans to fill {format_size(self.usable_bytes)}, "
                  f"{1 - CAPACITY_HEADROOM:.0%}{plain})" if self.capacity_bytes else "no device capacity known")
        if self.plain_peak_source:
            lines = [f"batch {self.batch_size}: the step needs {format_size(self.plain_peak_bytes)} at its peak "
                     f"without LMS ({self.plain_peak_source}; {format_size(peak['bytes'])} in the replay of its "
                     f"operations, at its peak in the {peak['phase']} pass); {device}"]
        else:
            lines = [f"batch {self.batch_size}: the step needs {format_size(peak['bytes'])} at its peak in the "
                     f"{peak['phase']} pass without LMS; {device}"]
        kinds = ", ".join(f"{kind.replace('_', ' ')} {format_size(value)}" for kind, value in
                          sorted(peak["by_kind"].items(), key=lambda item: -item[1]) if value >= 1024)
        lines.append(f"what fills it{' in the replay' if self.plain_peak_source else ''}: {kinds}")
        if peak.get("layers"):
            lines.append("the layers holding the most at the peak: " + ", ".join(
                f"{row['layer']} {format_size(row['bytes'])}" for row in peak["layers"] if row["bytes"] >= 1024))
        for mode in self.modes:
            if mode.unavailable:
                lines.append(f"  {mode.mode}: {mode.unavailable}")
                continue
            largest = "" if mode.largest_batch is None else f", largest batch {mode.largest_batch}"
            ratio = "" if mode.step_ratio is None else f", step {mode.step_ratio:.2f}x a plain step's (predicted)"
            verdict = {True: "fits", False: "does not fit", None: "capacity unknown"}[mode.fits]
            note = f"; {mode.note}" if mode.note else ""
            lines.append(f"  {mode.mode}: {format_size(mode.peak_bytes)} at batch {self.batch_size}, {verdict}"
                         f"{largest}{ratio}{note}")
        if self.frontier:
            modes = list(dict.fromkeys(point.mode for point in self.frontier))
            lines.append("the frontier, predicted peak (and step time over plain) by batch: batch | " + " | ".join(modes))
            by_batch: dict[int, dict[str, FrontierPoint]] = {}
            for point in self.frontier:
                by_batch.setdefault(point.batch_size, {})[point.mode] = point
            for batch, points in sorted(by_batch.items()):
                cells = [f"{format_size(p.peak_bytes)}{'' if p.fits is not False else ' (no)'}"
                         f"{'' if p.step_ratio is None else f' {p.step_ratio:.2f}x'}" if p else "" for p in
                         (points.get(mode) for mode in modes)]
                lines.append(f"  {batch} | " + " | ".join(cells))
            best = self.largest_at_speed()
            if best is not None:
                lines.append(f"the largest batch at {self.speed_target:.0%} of plain speed or better: {best.batch_size}, "
                             f"{best.mode}")
        if self.caveat:
            lines.append(self.caveat)
        if self.suggestion:
            lines.append(f"to train batch {self.batch_size}: put `{self.suggestion}` on the cell's first line")
        elif self.modes and self.modes[0].fits is False:
            best = max(self.modes, key=lambda mode: (mode.largest_batch or 0, not mode.magic))
            how = f"with `{best.magic}` on the cell's first line" if best.magic else "without LMS"
            lines.append(f"no way predicted to train batch {self.batch_size}: the largest batch that fits is "
                         f"{best.largest_batch or 0}, {how}")
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))


class _Ways:
    """The predictor of the way of training being looked at, among a model's ``StepPredictors``."""

    def __init__(self, model, data, min_bytes: int = DEFAULT_MIN_BYTES, device: str | None = None,
                 host_device: str | None = None):
        from .options import LmsOptions
        from .predictors import StepPredictors

        self.predictors = StepPredictors(model, data, LmsOptions(min_bytes=min_bytes, device=device,
                                                                 host_device=host_device), tuner=False)
        self.unavailable = self.predictors.unavailable
        self.predictor = self.predictors.get()
        self._bandwidth = None

    def set_options(self, lean_ops: bool = False, recompute=False) -> None:
        """The way of training looked at; its first prediction is at the batch asked for (``explain_fit``), so that
        batch is one of the two steps TensorFlow reads the others off (``StepPredictors.get``)."""
        self.predictor = self.predictors.get(lean_ops, False, recompute)

    def step_cost(self, batch_size: int):
        """The step's estimated cost at ``batch_size`` (the host link measured once per process)."""
        from ..memory.bandwidth import host_link_bandwidth

        self._bandwidth = self._bandwidth or host_link_bandwidth()
        return self.predictors.step_cost(self.predictor, batch_size, self._bandwidth)


def explain_fit(model, data, batch_size: int = 32, capacity=None, modes=None, batch_sizes=(),
                speed_target: float = 0.9, budget=None, **options) -> FitExplanation:
    """Why a fit of ``model`` on ``data`` at ``batch_size`` does not fit the device, and what will: no training.

    Traces the train step (on TensorFlow once per way of training, the batch asked for sized from that trace by
    TensorFlow's shape inference, every other batch size read off those two; on
    JAX at each batch size the search needs; on PyTorch runs it, without updating anything, at two small batch
    sizes and reads the others off) and predicts its device peak; explains the peak without LMS by kind
    and by Keras layer; and, against the device's capacity, finds the largest batch without LMS, with LMS's default plan, with
    ``recompute="only"`` and with ``lean_ops`` (where the backend offers them).

    Args:
        model: a compiled Keras model (TensorFlow, JAX or PyTorch backend).
        data: ``(x, y)`` arrays or a ``tf.data.Dataset``, as for ``fit``.
        batch_size: the batch the user asks for.
        capacity: the device's memory ("16GiB" or bytes). Defaults to the device LMS relieves (the first
            GPU, or the accelerator ``lms_magic.simulate_accelerator(memory=...)`` made); None where there is none.
        modes: the names of ``MODES`` to consider. Defaults to all.
        batch_sizes: batch sizes for the frontier: each way's predicted peak and step time at each. Defaults to
            none.
        speed_target: the share of plain speed the frontier's "largest batch at speed" asks for. Defaults to 0.9.
        budget: the bytes every way of training may fill ("512MiB" or bytes; ``%lms_tune``'s budget), instead of
            the device's share (80%, or 95% for a peak without LMS read from the framework itself). Defaults to None.
        **options: ``min_bytes``, ``device``, ``host_device``, as for ``LMS``.

    Returns:
        A :class:`FitExplanation` (``print`` it; in a notebook, with the extension loaded, it shows as tables; ``to_dict()`` has
        the figures).

    Raises:
        ValueError: the model is not compiled, no data, or a bad option (the message says what to pass).

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((256,))] + [keras.layers.Dense(512, activation="relu")
        ...                           for _ in range(4)] + [keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> found = explain_fit(model, (np.ones((8, 256), "float32"), np.ones(8)), batch_size=6000, capacity="64MiB",
        ...                     modes=("without LMS", "LMS"), min_bytes=0)
        >>> found.modes[0].fits, found.modes[1].fits, found.suggestion
        (False, True, '%%lms_fit')
        >>> found.modes[0].largest_batch < 6000 < found.modes[1].largest_batch
        True
    """
    if not 0 < speed_target <= 1:
        raise ValueError(f"speed_target={speed_target!r}: a share of plain speed, above 0 and at most 1 (0.9: 90%)")
    sizes = sorted({whole_number("batch_sizes", size, 1) for size in batch_sizes})
    unknown = set(() if modes is None else modes) - {mode[0] for mode in MODES}
    if unknown:
        raise ValueError(f"modes: {sorted(unknown)} unknown; the ways of training are {[mode[0] for mode in MODES]}")
    if budget is not None:  # the same limit for every way of training; the capacity it is the usable share of
        usable = parse_bytes(budget)
        capacity_bytes = parse_bytes(capacity) if capacity is not None else int(usable / (1 - CAPACITY_HEADROOM))
    else:
        capacity_bytes = parse_bytes(capacity) if capacity is not None else _device_capacity(options)
        usable = usable_bytes(capacity_bytes) if capacity_bytes else None
    # the collector paused throughout: the traces and replays make millions of short-lived objects, and each full
    # collection walks the whole process; what they leave is collected after
    with collector_paused():
        session = _Ways(model, data, **options)
        chosen = [mode for mode in MODES if modes is None or mode[0] in modes]
        plain = session.predictor.explain(0, 1, batch_size)
        source = session.predictor.plain_peak_source
        plain_bytes = session.predictor.plain_peak_bytes(batch_size) if source else None
        results, frontier = [], []
        # without LMS, a peak read from the framework itself (``plain_peak_source``) may fill all but the
        # allocator's share
        plain_usable = int(capacity_bytes * (1 - MEASURED_HEADROOM)) if capacity_bytes and source and budget is None \
            else usable
        for name, tuned, magic in chosen:
            refused = next((session.unavailable[option] for option in tuned if option in session.unavailable), "")
            if refused:
                results.append(ModeFit(name, None, None, None, None, magic, refused))
                continue
            session.set_options(lean_ops=tuned.get("lean_ops", False), recompute=tuned.get("recompute", False))
            limit = usable if magic else plain_usable
            results.append(_mode_fit(session, name, magic, batch_size, capacity_bytes, limit))
            if tuned.get("lean_ops") and not session.predictors.lean_changes():  # the step without it
                results[-1] = replace(results[-1], note=NOTHING_LEAN)
            for size in sizes:
                peak_bytes, ratio = _predicted(session, bool(magic), size, capacity_bytes)
                fits = None if limit is None else peak_bytes <= limit
                frontier.append(FrontierPoint(size, name, peak_bytes, ratio, fits))
        return FitExplanation(batch_size, capacity_bytes, usable, plain, results, frontier, speed_target,
                              getattr(session.predictor, "caveat", ""), plain_bytes, source, plain_usable)


def _prediction(session, with_lms: bool, batch: int, capacity_bytes: int | None):
    """The prediction at ``batch``: without LMS, or with its default plan for the capacity."""
    if not with_lms:
        return session.predictor.predict(0, 1, batch)
    return session.predictor.planned(1, batch, capacity_bytes)


def _predicted(session, with_lms: bool, batch: int, capacity_bytes: int | None) -> tuple[int, float | None]:
    """The predicted peak and step ratio at ``batch`` (the step ratio 1.0 without LMS)."""
    if not with_lms:
        return session.predictor.plain_peak_bytes(batch), 1.0
    prediction = _prediction(session, with_lms, batch, capacity_bytes)
    return prediction.peak_bytes, session.step_cost(batch).ratio(prediction.swapped_bytes_per_step)


def _mode_fit(session, name: str, magic: str, batch_size: int, capacity_bytes: int | None,
              usable: int | None) -> ModeFit:
    with_lms = bool(magic)

    def peak_at(batch: int) -> int:
        if not with_lms:
            return session.predictor.plain_peak_bytes(batch)
        return _prediction(session, with_lms, batch, capacity_bytes).peak_bytes

    peak_bytes, ratio = _predicted(session, with_lms, batch_size, capacity_bytes)
    if usable is None:
        return ModeFit(name, peak_bytes, None, None, ratio, magic)
    # the peak grows about linearly with the batch: the guess from the batch asked for, past the weights
    persistent = session.predictor.persistent_bytes
    per_sample = max(1.0, (peak_bytes - persistent) / batch_size)
    guess = max(1, int((usable - persistent) / per_sample))

    def fits(batch: int) -> bool:
        if with_lms and session.predictor.predict(-1, 1, batch).peak_bytes <= usable:
            return True  # every eligible tensor moved fits: so does the plan, the fewest bytes that fit (one replay)
        return peak_at(batch) <= usable

    largest = largest_fitting(fits, guess)
    return ModeFit(name, peak_bytes, peak_bytes <= usable, largest, ratio, magic)


def _device_capacity(options: dict) -> int | None:
    """The capacity of the device LMS would relieve with these options, or None where there is none."""
    from .core.stats import LmsStats
    from .framework import framework
    from .options import LmsOptions

    chosen, stats = framework(), LmsStats()
    prepared = chosen.prepare(LmsOptions(device=options.get("device"), host_device=options.get("host_device")), stats)
    return None if chosen.off_reason(prepared) is not None else stats.capacity_bytes


def out_of_memory_account(model, data, batch_size: int) -> str:
    """The lines said above an out-of-memory error of a fit of ``model`` on ``data`` at ``batch_size``: what the
    step needed, what filled it, what would fit. Never raises: where the step cannot be explained, one line says
    why (the user's own error must come through whatever happens here)."""
    try:
        found = explain_fit(model, data, batch_size=batch_size)
    except Exception as error:
        return (f"lms_magic: the fit ran out of device memory; the step could not be explained ({error}). "
                "Try %%lms_fit over the cell, or a smaller batch.")
    return "lms_magic: the fit ran out of device memory. Why, and what fits (predicted, nothing trained):\n" + \
        "\n".join("  " + line for line in found.lines())


__all__ = ["explain_fit", "out_of_memory_account", "FitExplanation", "FrontierPoint", "ModeFit", "largest_fitting"]
