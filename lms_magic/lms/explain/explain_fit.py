"""Why a fit does not fit, and what will, without training: ``explain_fit``.

The step's predictor for each way of training (:class:`~lms_magic.lms.explain.predictors.StepPredictors`, as
``%lms_tune``'s: on TensorFlow one trace per way, the batch asked for sized from it, every other batch size read
off those two; on JAX a jaxpr per batch size; on PyTorch the step run at two small batch sizes) gives the step's
predicted device peak explained: what fills it by kind (weights, optimizer state, gradients, activations) and the
Keras layers whose tensors hold the most at the peak. Against the device's capacity (given, the GPU's, or
``simulate_accelerator``'s), it finds the largest batch each way of training fits (``search.py``): without LMS,
with LMS's default plan, with ``recompute="only"`` and with ``lean_ops``, each with its predicted step time over a
plain step's, and the ``%%lms_fit`` line that trains the batch asked for where one does. The answer is a
:class:`~lms_magic.lms.explain.results.FitExplanation`.
"""

from __future__ import annotations

from dataclasses import replace

from ...units import parse_bytes
from ..core.plan import CAPACITY_HEADROOM, DEFAULT_MIN_BYTES, MEASURED_HEADROOM, usable_bytes
from ..core.prediction import StepPredictor
from ..core.simulate import collector_paused
from ..options import whole_number
from .confirm import Confirmed, confirm_largest
from .results import Correction, FitExplanation, FrontierPoint, ModeFit
from .search import largest_fitting

# name, the tuner's options, and the %%lms_fit line that trains that way
MODES = (("without LMS", {}, ""), ("LMS", {}, "%%lms_fit"),
         ("LMS, recompute", {"recompute": "only"}, "%%lms_fit --recompute only"),
         ("LMS, lean_ops", {"lean_ops": True}, "%%lms_fit --lean-ops"))
# beside lean_ops's figures where the model has no layer it changes: they are LMS's alone
NOTHING_LEAN = "the same as LMS alone: lean_ops changes BatchNormalization's gradient, and the model has none"
# beside LMS's figures where steps were confirmed on simulate_accelerator's device
NOT_MEASURABLE = ("not confirmed: the simulated device's allocator is TensorFlow's one CPU allocator, which also "
                  "holds what LMS moves to the host; a GPU confirms it")


class _Ways:
    """The predictor of the way of training being looked at, among a model's ``StepPredictors``."""

    def __init__(self, model, data, min_bytes: int = DEFAULT_MIN_BYTES, device: str | None = None,
                 host_device: str | None = None):
        from ..options import LmsOptions
        from .predictors import StepPredictors

        self.predictors = StepPredictors(model, data, LmsOptions(min_bytes=min_bytes, device=device,
                                                                 host_device=host_device), tuner=False)
        self.unavailable = self.predictors.unavailable
        self.predictor: StepPredictor = self.predictors.get()
        self._bandwidth = None

    def set_options(self, lean_ops: bool = False, recompute=False) -> None:
        """The way of training looked at; its first prediction is at the batch asked for (``explain_fit``), so that
        batch is one of the two steps TensorFlow reads the others off (``StepPredictors.get``)."""
        self.predictor = self.predictors.get(lean_ops, False, recompute)

    def step_cost(self, batch_size: int):
        """The step's estimated cost at ``batch_size`` (the host link measured once per process)."""
        from ...memory.bandwidth import host_link_bandwidth

        self._bandwidth = self._bandwidth or host_link_bandwidth()
        return self.predictors.step_cost(self.predictor, batch_size, self._bandwidth)


def explain_fit(model, data, batch_size: int = 32, capacity=None, modes=None, batch_sizes=(),
                speed_target: float = 0.9, budget=None, confirm: bool | None = None, **options) -> FitExplanation:
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
        confirm: run real steps on the device (``measured.py``): True measures a plain step at a batch predicted
            to fit, corrects every way's figures by what the allocator held beyond the graph's tensors, and
            confirms each way's largest batch by steps at it (backing off where a step does not fit); None (the
            default) does the same where the device is a real GPU, and only the correcting step on
            ``simulate_accelerator``'s device; False runs nothing. The model, its optimizer, metrics and the
            random state end as they were.
        **options: ``min_bytes``, ``device``, ``host_device``, as for ``LMS``.

    Returns:
        A :class:`FitExplanation` (``print`` it; in a notebook, with the extension loaded, it shows as tables; ``to_dict()`` has
        the figures).

    Raises:
        ValueError: the model is not compiled, no data, a bad option (the message says what to pass), or
            ``confirm=True`` where no allocator of the device can be read.

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
    meter, unmeasured = (None, "") if confirm is False or not capacity_bytes else \
        _meter(model, data, options, budget=usable if capacity is not None or budget is not None else None)
    if confirm and meter is None:
        raise ValueError(f"confirm=True: {unmeasured or 'no device capacity known: pass capacity=...'}; "
                         "leave confirm out for the predicted figures alone")
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
        # the closed loop: one plain step measured on the device, every way's figures corrected by it
        correction = None if meter is None else _correction(session, meter, batch_size, capacity_bytes, plain_usable)
        # LMS plans in the replay's bytes: where the allocator holds more, against a budget smaller by as much
        plan_budget = _plan_budget(session, usable, correction)
        plan_capacity = capacity_bytes if plan_budget is None else int(plan_budget / (1 - CAPACITY_HEADROOM))
        for name, tuned, magic in chosen:
            refused = next((session.unavailable[option] for option in tuned if option in session.unavailable), "")
            if refused:
                results.append(ModeFit(name, None, None, None, None, magic, refused))
                continue
            session.set_options(lean_ops=tuned.get("lean_ops", False), recompute=tuned.get("recompute", False))
            limit = usable if magic else plain_usable
            ratio = correction.ratio if correction is not None else 1.0
            if magic and plan_budget is not None:  # what the plans' budget holds on the device
                magic, tuned = f"{magic} --budget {plan_budget >> 20}MiB", {**tuned, "budget": plan_budget}
                limit = _corrected(session, plan_budget, ratio)
            results.append(_mode_fit(session, name, magic, batch_size, plan_capacity, limit, ratio))
            if meter is not None and (confirm or (confirm is None and meter.on_gpu)) and limit is not None:
                if magic and not meter.measures_lms:
                    results[-1] = replace(results[-1], note=NOT_MEASURABLE)
                else:
                    results[-1] = replace(results[-1], confirmed=_confirmed(session, meter, results[-1], tuned,
                                                                            plan_capacity, limit))
            if tuned.get("lean_ops") and not session.predictors.lean_changes():  # the step without it
                results[-1] = replace(results[-1], note=NOTHING_LEAN)
            for size in sizes:
                peak_bytes, step_ratio = _predicted(session, bool(magic), size, plan_capacity)
                peak_bytes = _corrected(session, peak_bytes, ratio)
                fits = None if limit is None else peak_bytes <= limit
                frontier.append(FrontierPoint(size, name, peak_bytes, step_ratio, fits))
        return FitExplanation(batch_size, capacity_bytes, usable, plain, results, frontier, speed_target,
                              session.predictor.caveat, plain_bytes, source, plain_usable, correction,
                              unmeasured)


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


def _corrected(session, peak_bytes: int, ratio: float) -> int:
    """``peak_bytes`` with the step's bytes (past the weights and optimizer state) times the measured ``ratio``."""
    persistent = session.predictor.persistent_bytes
    return peak_bytes if ratio == 1.0 else persistent + int(round((peak_bytes - persistent) * ratio))


def _mode_fit(session, name: str, magic: str, batch_size: int, capacity_bytes: int | None,
              usable: int | None, correction: float = 1.0) -> ModeFit:
    with_lms = bool(magic)

    def peak_at(batch: int) -> int:
        if not with_lms:
            return _corrected(session, session.predictor.plain_peak_bytes(batch), correction)
        return _corrected(session, _prediction(session, with_lms, batch, capacity_bytes).peak_bytes, correction)

    peak_bytes, ratio = _predicted(session, with_lms, batch_size, capacity_bytes)
    peak_bytes = _corrected(session, peak_bytes, correction)
    if usable is None:
        return ModeFit(name, peak_bytes, None, None, ratio, magic)
    # the peak grows about linearly with the batch: the guess from the batch asked for, past the weights
    persistent = session.predictor.persistent_bytes
    per_sample = max(1.0, (peak_bytes - persistent) / batch_size)
    guess = max(1, int((usable - persistent) / per_sample))

    def fits(batch: int) -> bool:
        if with_lms and _corrected(session, session.predictor.predict(-1, 1, batch).peak_bytes, correction) <= usable:
            return True  # every eligible tensor moved fits: so does the plan, the fewest bytes that fit (one replay)
        return peak_at(batch) <= usable

    largest = largest_fitting(fits, guess)
    return ModeFit(name, peak_bytes, peak_bytes <= usable, largest, ratio, magic)


def measurable(model, data, **options) -> bool:
    """Whether steps of ``model`` can be measured on the device LMS relieves (``explain_fit(..., confirm=True)``)."""
    return _meter(model, data, options, None)[0] is not None


def _meter(model, data, options: dict, budget: int | None):
    """The meter of the device LMS relieves (``measured.step_meter``), and why there is none."""
    from ..core.stats import LmsStats
    from ..framework import framework
    from ..options import LmsOptions
    from .measured import step_meter

    prepared = framework().prepare(LmsOptions(device=options.get("device"), host_device=options.get("host_device")),
                                   LmsStats())
    lms_options = {**options, **({"budget": budget} if budget is not None else {})}
    return step_meter(model, data, prepared.device, lms_options)


def _correction(session, meter, batch_size: int, capacity_bytes: int | None, limit: int | None) -> Correction:
    """One plain step measured at the batch asked for, or at the largest predicted to fit where that is smaller:
    its allocator peak over the replay's step bytes (at least 1: a replay above the allocator is kept)."""
    persistent = session.predictor.persistent_bytes
    plain = _mode_fit(session, "", "", batch_size, capacity_bytes, limit) if limit is not None else None
    batch = max(1, min(batch_size, plain.largest_batch if plain is not None and plain.largest_batch else batch_size))
    predicted = session.predictor.plain_peak_bytes(batch) - persistent
    step = meter.measure(batch)
    measured = step.step_bytes
    ratio = 1.0 if measured is None else max(1.0, measured / max(1, predicted))
    return Correction(batch, measured, predicted, ratio, meter.where)


def _plan_budget(session, usable: int | None, correction: Correction | None) -> int | None:
    """The budget, in the replay's bytes and whole MiB, whose plans the allocator holds within ``usable``, where a
    measured step corrected the figures up; else None."""
    if usable is None or correction is None or correction.ratio <= 1.0:
        return None
    persistent = session.predictor.persistent_bytes
    return (persistent + int((usable - persistent) / correction.ratio)) >> 20 << 20


def _confirmed(session, meter, found: ModeFit, tuned: dict, capacity_bytes: int | None, limit: int) -> Confirmed:
    """``found``'s largest batch confirmed by steps on the device (``confirm.py``)."""
    with_lms = bool(found.magic)
    persistent = session.predictor.persistent_bytes

    def predicted_step_bytes(batch: int) -> int:
        peak = session.predictor.plain_peak_bytes(batch) if not with_lms else \
            _prediction(session, True, batch, capacity_bytes).peak_bytes
        return peak - persistent

    return confirm_largest(lambda batch: meter.measure(batch, with_lms, tuned), predicted_step_bytes, persistent,
                           limit, max(1, found.largest_batch or 1))


def _device_capacity(options: dict) -> int | None:
    """The capacity of the device LMS would relieve with these options, or None where there is none."""
    from ..core.stats import LmsStats
    from ..framework import framework
    from ..options import LmsOptions

    chosen, stats = framework(), LmsStats()
    prepared = chosen.prepare(LmsOptions(device=options.get("device"), host_device=options.get("host_device")), stats)
    return None if chosen.off_reason(prepared) is not None else stats.capacity_bytes


__all__ = ["MODES", "explain_fit"]
