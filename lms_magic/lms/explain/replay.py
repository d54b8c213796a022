"""What ``explain_fit`` finds from the step's replay (its predictors), with a closed loop's measured steps where it is
given one: the step's peak by kind and by layer, and each way of training at the batch asked for and at its largest
batch (``largest.py``), against the device's capacity or a budget.

``sizing/explain_fit.py`` is the public entry, which gives the closed loop (steps on the device, with LMS where
asked: so it sits above the LMS callback); the out-of-memory account (``account.py``), which the callback prints,
asks the replay alone, here.
"""

from __future__ import annotations

from dataclasses import replace

from ...units import format_size, parse_bytes
from ..core.costs import probe_stands
from ..core.device_model import Correction
from ..core.plan import CAPACITY_HEADROOM, DEFAULT_MIN_BYTES, MEASURED_HEADROOM, usable_bytes
from ..core.prediction import StepPredictor
from ..core.simulate import collector_paused
from ..framework import framework
from ..options import whole_number
from .results import FitExplanation, FrontierPoint, ModeFit
from .largest import MAX_BATCH, largest_fitting

# name, the tuner's options, and the %%lms_fit line that trains that way
MODES = (("without LMS", {}, ""), ("LMS", {}, "%%lms_fit"),
         ("LMS, recompute", {"recompute": "only"}, "%%lms_fit --recompute only"),
         ("LMS, lean_ops", {"lean_ops": True}, "%%lms_fit --lean-ops"))
# beside lean_ops's figures where the model has no layer it changes: they are LMS's alone
NOTHING_LEAN = "the same as LMS alone: lean_ops changes BatchNormalization's gradient, and the model has none"


class _Ways:
    """The predictor of the way of training being looked at, among a model's ``StepPredictors``."""

    def __init__(self, model, data, min_bytes: int = DEFAULT_MIN_BYTES, device: str | None = None,
                 host_device: str | None = None, fit_steps=None):
        from ..options import LmsOptions
        from .predictors import StepPredictors

        self.predictors = StepPredictors(model, data, LmsOptions(min_bytes=min_bytes, device=device,
                                                                 host_device=host_device), tuner=False)
        self.unavailable = self.predictors.unavailable
        self.predictor: StepPredictor = self.predictors.get()
        self._bandwidth = None
        self.fit_steps = fit_steps  # batch size -> the fit's steps there (None: a fit of unknown length)
        self.measured_retrace_s = lambda: None  # the closed loop's: LMS's first step as its steps timed it

    def fit_left(self, batch_size: int) -> tuple[int | None, float | None]:
        """The fit's steps after its first at ``batch_size`` (None: a fit of unknown length) and what a retrace of
        its step costs: LMS's first step where the closed loop timed one, else the predictor's own trace of the
        step (less than LMS's: Keras's trace of the fit's function, LMS's rewrite and a run add to it)."""
        steps = None if self.fit_steps is None else self.fit_steps(batch_size)
        if steps is None:
            return None, None
        measured = self.measured_retrace_s()
        return steps - 1, measured if measured is not None else getattr(self.predictor, "trace_s", None)

    def set_options(self, lean_ops: bool = False, recompute=False) -> None:
        """The way of training looked at; its first prediction is at the batch asked for (``explain_fit``), so that
        batch is one of the two steps TensorFlow reads the others off (``StepPredictors.get``)."""
        self.predictor = self.predictors.get(lean_ops, False, recompute)

    def step_cost(self, batch_size: int):
        """The step's estimated cost at ``batch_size`` (the host link measured once per process)."""
        from ...memory.bandwidth import host_link_bandwidth

        self._bandwidth = self._bandwidth or host_link_bandwidth()
        return self.predictors.step_cost(self.predictor, batch_size, self._bandwidth)


def explained(model, data, batch_size: int = 32, capacity=None, modes=None, batch_sizes=(),
              speed_target: float = 0.9, budget=None, closed_loop=None, fit_steps=None, **options) -> FitExplanation:
    """``explain_fit``'s answer (its arguments but ``confirm``; ``fit_steps``: the fit's steps at a batch size,
    from ``epochs``), from the replay; ``closed_loop(capacity_bytes, usable_bytes, given)`` (``given``: a capacity
    or budget was passed) makes the loop that corrects it by measured steps (``correct``), confirms each way's
    largest batch (``confirm``) and times LMS's first step (``retrace_s``), or None."""
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
        capacity_bytes = parse_bytes(capacity) if capacity is not None else device_capacity(options)
        usable = usable_bytes(capacity_bytes) if capacity_bytes else None
    loop = None if closed_loop is None else closed_loop(capacity_bytes, usable,
                                                        capacity is not None or budget is not None)
    # the collector paused throughout: the traces and replays make millions of short-lived objects, and each full
    # collection walks the whole process; what they leave is collected after
    with collector_paused():
        session = _Ways(model, data, fit_steps=fit_steps, **options)
        if loop is not None:
            session.measured_retrace_s = loop.retrace_s
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
        correction = None if loop is None else loop.correct(session, batch_size, capacity_bytes, plain_usable)
        if session.predictors.scratch is not None:  # the measured steps' kernel scratch, now in the replay
            plain = session.predictor.explain(0, 1, batch_size)
        # LMS plans in the replay's bytes: where the allocator holds more, against a budget smaller by as much
        plan_budget = _plan_budget(session, usable, correction)
        # LMS itself plans so (TensorFlow's reads the same measured steps): its line carries the device's bytes
        by_device_model = plan_budget is not None and framework().plans_by_device_model
        # a capacity LMS would not find by itself, or the budget asked for: its lines carry the budget it leaves
        # (in whole MiB, at or under)
        carried = _whole_units(usable) if (plan_budget is None or by_device_model) and usable and (
            budget is not None and by_device_model
            or budget is None and capacity is not None and capacity_bytes != device_capacity(options)) else None
        if by_device_model and carried:  # what LMS will plan for: the carried budget as the steps correct it
            plan_budget = correction.replay_budget(carried[0], session.predictor.persistent_bytes)
            by_device_model = plan_budget is not None
        elif plan_budget is not None and not by_device_model:  # the line carries it: whole MiB
            plan_budget = plan_budget >> 20 << 20
        plan_capacity = capacity_bytes if plan_budget is None else int(plan_budget / (1 - CAPACITY_HEADROOM))
        for name, tuned, magic in chosen:
            refused = next((session.unavailable[option] for option in tuned if option in session.unavailable), "")
            if refused:
                results.append(ModeFit(name, None, None, None, None, magic, refused))
                continue
            session.set_options(lean_ops=tuned.get("lean_ops", False), recompute=tuned.get("recompute", False))
            limit, capacity_here = (usable if magic else plain_usable), plan_capacity
            if magic and plan_budget is not None:  # what the plans' budget holds on the device
                limit, capacity_here = _corrected(session, _within(plan_budget), correction), _capacity(plan_budget)
                if by_device_model and carried:  # in the device's bytes: LMS corrects it as these steps do
                    magic, tuned = f"{magic} --budget {carried[1]}", {**tuned, "budget": carried[0]}
                elif not by_device_model:
                    magic, tuned = f"{magic} --budget {plan_budget >> 20}MiB", {**tuned, "budget": plan_budget}
            elif magic and carried:  # the budget LMS is told, in whole units
                magic, tuned = f"{magic} --budget {carried[1]}", {**tuned, "budget": carried[0]}
                limit, capacity_here = _within(carried[0]), _capacity(carried[0])
            results.append(mode_fit(session, name, magic, batch_size, capacity_here, limit, correction))
            if magic and plan_budget is not None and not by_device_model:  # the dashboard names it: say what it is
                results[-1] = replace(results[-1], note=f"--budget {plan_budget >> 20}MiB is in the replay's bytes, "
                                                        f"which LMS plans in: the {format_size(usable)} it may fill "
                                                        "here, as the measured steps correct the replay")
            if loop is not None and limit is not None:
                results[-1] = loop.confirm(session, results[-1], tuned, capacity_here, limit, batch_size)
            if tuned.get("lean_ops") and not session.predictors.lean_changes():  # the step without it
                results[-1] = replace(results[-1], note=NOTHING_LEAN)
            for size in sizes:
                step_ratio = _step_ratio(session, bool(magic), size, capacity_here)
                held = None if loop is None or limit is None else loop.held(session, results[-1], size, capacity_here)
                peak_bytes = held if held is not None else lms_corrected(session, size, capacity_here, correction) \
                    if magic else _plain_corrected(session, size, correction)
                fits = None if limit is None else peak_bytes <= limit
                frontier.append(FrontierPoint(size, name, peak_bytes, step_ratio, fits))
        if correction is not None and correction.measured_bytes is not None:  # the headline says what the rows do
            plain_bytes = _plain_corrected(session, batch_size, correction)
            source = f"{source}, " * bool(source) + "as the plain steps measured below correct it"
        return FitExplanation(batch_size, capacity_bytes, usable, plain, results, frontier, speed_target,
                              session.predictor.caveat, plain_bytes, source, plain_usable, correction,
                              "" if loop is None else loop.unmeasured, plan_budget)


def prediction_at(session, with_lms: bool, batch: int, capacity_bytes: int | None):
    """The prediction at ``batch``: without LMS; with LMS, of the step its fit runs: its default plan for the
    capacity, or, where the plan swaps and its framework keeps a first step's swaps of every eligible tensor where
    their extra copies cost less than a retrace (``Framework.keeps_free_probe``; ``costs.probe_stands``), that step
    (``recompute="only"`` plans on the traced step: no such first step)."""
    if not with_lms:
        return session.predictor.predict(0, 1, batch)
    planned = session.predictor.planned(1, batch, capacity_bytes)
    if not framework().keeps_free_probe or not planned.swapped_bytes_per_step:
        return planned
    probe = session.predictor.predict(-1, 1, batch)
    # as LMS's first step decides (tensorflow/first_step.py): its swaps stand where their extra copies over the
    # fit's steps left cost less than a retrace
    if probe.peak_bytes > planned.peak_bytes or not probe_stands(
            session.step_cost(batch), probe.swapped_bytes_per_step, planned.swapped_bytes_per_step,
            *session.fit_left(batch)):
        return planned
    return probe


def _step_ratio(session, with_lms: bool, batch: int, capacity_bytes: int | None) -> float | None:
    """The predicted step time over a plain step's at ``batch`` (1.0 without LMS)."""
    if not with_lms:
        return 1.0
    prediction = prediction_at(session, with_lms, batch, capacity_bytes)
    return session.step_cost(batch).ratio(prediction.swapped_bytes_per_step)


def _corrected(session, peak_bytes: int, correction: Correction | None) -> int:
    """``peak_bytes`` as the measured steps say the device holds it (``Correction.applied``), or as replayed."""
    return peak_bytes if correction is None else correction.applied(peak_bytes, session.predictor.persistent_bytes)


def _plain_corrected(session, batch: int, correction: Correction | None) -> int:
    """A plain step's peak at ``batch``: measured there where a step was (``Correction.plain_at``), else corrected."""
    peak_bytes = session.predictor.plain_peak_bytes(batch)
    return peak_bytes if correction is None else correction.plain_at(batch, peak_bytes,
                                                                      session.predictor.persistent_bytes)


def lms_corrected(session, batch: int, capacity_bytes: int | None, correction: Correction | None) -> int:
    """A way with LMS at ``batch`` as the plain steps correct it: where its plan there moves nothing, the step is the
    model's own and its figure the plain one (measured where a step was); else its replay, corrected."""
    planned = prediction_at(session, True, batch, capacity_bytes)
    if not planned.swapped_bytes_per_step + planned.recomputed_bytes_per_step:
        return _plain_corrected(session, batch, correction)
    return _corrected(session, planned.peak_bytes, correction)


def mode_fit(session, name: str, magic: str, batch_size: int, capacity_bytes: int | None,
             usable: int | None, correction: Correction | None = None) -> ModeFit:
    with_lms = bool(magic)

    def peak_at(batch: int) -> int:
        return lms_corrected(session, batch, capacity_bytes, correction) if with_lms else \
            _plain_corrected(session, batch, correction)

    ratio = _step_ratio(session, with_lms, batch_size, capacity_bytes)
    peak_bytes = peak_at(batch_size)
    if usable is None:
        return ModeFit(name, peak_bytes, None, None, ratio, magic)
    # the peak grows about linearly with the batch: the guess from the batch asked for, past the weights
    persistent = session.predictor.persistent_bytes
    per_sample = max(1.0, (peak_bytes - persistent) / batch_size)
    guess = min(max(1, int((usable - persistent) / per_sample)), MAX_BATCH)
    if guess != batch_size:  # a line through the figure there and here: the fixed part the first guess leaves out
        slope = (peak_at(guess) - peak_bytes) / (guess - batch_size)
        if slope > 0:
            guess = min(max(1, int(batch_size + (usable - peak_bytes) / slope)), MAX_BATCH)

    def fits(batch: int) -> bool:
        if with_lms and _corrected(session, session.predictor.predict(-1, 1, batch).peak_bytes, correction) <= usable:
            return True  # every eligible tensor moved fits: so does the plan, the fewest bytes that fit (one replay)
        return peak_at(batch) <= usable

    largest = largest_fitting(fits, guess)
    return ModeFit(name, peak_bytes, peak_bytes <= usable, largest, ratio, magic)


# LMS plans again on its own trace of the fit (on TensorFlow at the batch the data gives, sized by shape inference),
# whose figure can exceed the predictor's at the same batch by a fraction of a percent (its inputs, a class-weight
# lookup): where LMS is told a budget, the predictions plan for this share less, so LMS's own plan meets the budget
LMS_MARGIN = 0.01


def _within(budget_bytes: int) -> int:
    """What the predictions hold a way with LMS to where LMS is told ``budget_bytes``: ``LMS_MARGIN`` less."""
    return int(budget_bytes * (1 - LMS_MARGIN))


def _capacity(budget_bytes: int) -> int:
    """The capacity whose usable share (``CAPACITY_HEADROOM`` left) is :func:`_within` ``budget_bytes``: what the
    predictions plan for."""
    return int(_within(budget_bytes) / (1 - CAPACITY_HEADROOM))


def _plan_budget(session, usable: int | None, correction: Correction | None) -> int | None:
    """The budget, in the replay's bytes, whose plans the allocator holds within ``usable``, where measured steps
    say the device holds more than the replay there; else None."""
    if usable is None or correction is None:
        return None
    return correction.replay_budget(usable, session.predictor.persistent_bytes)


def _whole_units(size: int) -> tuple[int, str]:
    """``size`` rounded down to whole MiB (KiB under 16 MiB), and as a budget flag writes it.

    Example:
        >>> _whole_units(100 * 2**20 + 5), _whole_units(1677721)
        ((104857600, '100MiB'), (1677312, '1638KiB'))
    """
    unit, name = (2**20, "MiB") if size >= 16 * 2**20 else (2**10, "KiB")
    return size // unit * unit, f"{size // unit}{name}"


def device_capacity(options: dict) -> int | None:
    """The capacity of the device LMS would relieve with these options, or None where there is none."""
    from ..core.stats import LmsStats
    from ..framework import framework
    from ..options import LmsOptions

    chosen, stats = framework(), LmsStats()
    prepared = chosen.prepare(LmsOptions(device=options.get("device"), host_device=options.get("host_device")), stats)
    return None if chosen.off_reason(prepared) is not None else stats.capacity_bytes


__all__ = ["MODES", "NOTHING_LEAN", "device_capacity", "explained"]
