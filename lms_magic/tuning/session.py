"""Tuning LMS: instant predictions for any setting, measured trials, and autotune.

A :class:`TuningSession` holds what the sliders and buttons of ``%lms_tune``
need: one step predictor per way of training (``lms/explain/predictors.py``, each answering
:class:`~lms_magic.lms.core.prediction.StepPredictor`: the liveness replay that ``LMS`` reports, of
TensorFlow's traced graph or JAX's jaxpr), one
:class:`~lms_magic.tuning.trials.TrialRunner` (K steps from one saved start),
the host link bandwidth, and the trials so far. :func:`autotune` is the same
search as a Python call.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..lms.core.plan import DEFAULT_MIN_BYTES, BudgetError
from ..lms.framework import refuse_unavailable
from ..lms.options import LmsOptions, OptionError, whole_number
from ..units import parse_bytes
from ..lms.core.autotune import PatternSearch, SearchResult, Setting, Trial, default_n_values, drive
from ..units import format_size

DEFAULT_LB_VALUES = (1, 2, 3, 4)


def step_time_lower_bound(compute_s: float | None, moved_bytes: int, bytes_per_s: float) -> float:
    """No step is faster than its compute, nor than the time its copies take on the link.

    Example:
        >>> step_time_lower_bound(0.2, 3 * 10**9, 12e9), step_time_lower_bound(None, 0, 12e9)
        (0.25, 0.0)
    """
    return max(compute_s or 0.0, moved_bytes / bytes_per_s)


@dataclass(frozen=True)
class Estimate:
    """What a slider move shows: the prediction and the step-time lower bound."""

    setting: Setting
    peak_bytes: int
    peak_bytes_without_lms: int
    swapped_tensors: int
    swapped_bytes_per_step: int
    candidates: int
    transfer_s: float  # bytes out and back in, over the link
    compute_s: float | None  # from the fastest measured trial, None before any
    lower_bound_s: float
    fits: bool | None  # within the budget (None: no budget)
    step_ratio: float | None = None  # predicted step time over the plain step's (core/costs.py)
    compute_source: str = ""  # where the compute time of step_ratio comes from ("measured: ...", "estimated: ...")
    measured: str = ""  # the plain steps measured on the device that correct the replay, in words ("": none)


class TuningSession:
    """The state behind the tuning widget and :func:`autotune`.

    Args:
        model: a compiled Keras model (TensorFlow or JAX backend).
        data: ``(x, y)`` arrays or a ``tf.data.Dataset`` (see ``take_samples``).
        batch_size: the batch size to start from.
        budget: device memory to stay under ("6GiB" or bytes), or None.
        steps: timed steps per measured trial.
        min_bytes, device, host_device: as for :class:`lms_magic.LMS`.
        bandwidth: a ``LinkBandwidth``; measured once per process if None.
        lean_ops, order_backward, recompute: as for :class:`lms_magic.LMS` (``set_options`` changes them:
            the predictions and trials follow). Default to False; ``recompute`` takes False or "only" here
            (``n_tensors`` then counts the tensors recomputed, and nothing crosses the host link).

    Raises:
        ValueError: not compiled, no data, an option's bad value (an ``OptionError``), or a budget
            below the weights and optimizer state (the message says what to do).
    """

    def __init__(self, model, data, batch_size: int = 32, budget=None, steps: int = 5,
                 min_bytes: int = DEFAULT_MIN_BYTES, device: str | None = None, host_device: str | None = None,
                 bandwidth=None, lean_ops: bool = False, order_backward: bool = False, recompute=False):
        from ..lms.explain.predictors import StepPredictors
        from ..memory.bandwidth import host_link_bandwidth
        from ..sizing.explain_fit import KeptCorrection
        from .trials import TrialRunner

        self.batch_size = whole_number("batch_size", batch_size, 1)
        whole_number("steps", steps, 1)
        options = LmsOptions(min_bytes=min_bytes, device=device, host_device=host_device, budget_bytes=budget,
                             lean_ops=lean_ops, order_backward=order_backward, recompute=_tunable(recompute))
        self.predictors = StepPredictors(model, data, options)
        # an option this backend does not take -> why (refused here and in set_options; the widget disables it)
        self.unavailable = self.predictors.unavailable
        self.predictor = self.predictors.get(options.lean_ops, options.order_backward, options.recompute)
        self.budget_bytes = None
        self.set_budget(options.budget_bytes)
        self.lms_options = {"min_bytes": options.min_bytes, "host_device": options.host_device,
                            "device": options.device, "lean_ops": options.lean_ops,
                            "order_backward": options.order_backward, "recompute": options.recompute}
        self.runner = TrialRunner(model, data, steps, self.lms_options,
                                  lambda setting: self.estimate(setting).peak_bytes)
        self.bandwidth = bandwidth or host_link_bandwidth()
        self.trials: list[Trial] = []
        self._kept = KeptCorrection(model, data, self.lms_options, self.batch_size)

    def device_correction(self):
        """What plain steps this process measured on the device for this model and data (``explain_fit``'s, or
        ``%%lms_fit --batch-size max``'s) say it holds beyond the replay, near the batch the session started at
        (a :class:`~lms_magic.lms.core.device_model.Correction`), or None where none were: every estimate, the
        budget's search and the trials' predictions read it, as ``explain_fit`` does."""
        return self._kept(self)

    def set_options(self, lean_ops: bool | None = None, order_backward: bool | None = None, recompute=None) -> None:
        """Switches ``lean_ops``, ``order_backward`` and ``recompute`` (False or "only"; None: as they are) for
        the predictions, the trials and the ``LMS(...)`` call. The first prediction with new options traces the
        step again (once per batch size).

        Raises:
            OptionError: a value the option does not take.
        """
        given = {"lean_ops": lean_ops, "order_backward": order_backward,
                 "recompute": None if recompute is None else _tunable(recompute)}
        chosen = {name: self.lms_options[name] if value is None else value for name, value in given.items()}
        options = LmsOptions(**chosen)
        refuse_unavailable(options, self.unavailable)
        self.lms_options.update(chosen)
        self.predictor = self.predictors.get(options.lean_ops, options.order_backward, options.recompute)
        self.runner.options.update(chosen)

    @property
    def persistent_bytes(self) -> int:
        return self.predictor.persistent_bytes

    def set_budget(self, budget) -> None:
        """Sets the budget (None: none); refuses one below the weights and optimizer state."""
        budget_bytes = None if budget is None else parse_bytes(budget)
        if budget_bytes is not None and budget_bytes < self.persistent_bytes:
            raise ValueError(f"the budget {format_size(budget_bytes)} is below the model's weights and optimizer "
                             f"state ({format_size(self.persistent_bytes)}), which LMS does not swap: "
                             "raise the budget")
        self.budget_bytes = budget_bytes

    def compute_s(self, batch_size: int) -> float | None:
        """The compute time of a step: the fastest measured step per sample, scaled to ``batch_size``."""
        rates = [t.step_s / t.setting.batch_size for t in self.trials if t.ok]
        return min(rates) * batch_size if rates else None

    def step_cost(self, batch_size: int):
        """The :class:`~lms_magic.lms.core.costs.StepCost` at ``batch_size``: the compute of the fastest measured
        trial, else the traced step's matrix FLOPs at the device's rate (an estimate, which says so)."""
        return self.predictors.step_cost(self.predictor, batch_size, self.bandwidth, self.compute_s(batch_size))

    def estimate(self, setting: Setting) -> Estimate:
        """The prediction for ``setting``: no training, one memoised replay, as the plain steps measured on the
        device correct it (``device_correction``: the figure without LMS is a step measured at that batch where one
        was; a setting that moves nothing is that figure too)."""
        correction = self.device_correction()  # before the replay: their kernel scratch enters it
        prediction = self.predictor.predict(setting.n_tensors, setting.lb, setting.batch_size)
        peak_bytes, without_lms = prediction.peak_bytes, prediction.peak_bytes_without_lms
        if correction is not None:
            without_lms = correction.plain_at(setting.batch_size, without_lms, prediction.persistent_bytes)
            moves = prediction.swapped_bytes_per_step + prediction.recomputed_bytes_per_step
            peak_bytes = correction.applied(peak_bytes, prediction.persistent_bytes) if moves else without_lms
        moved = 2 * prediction.swapped_bytes_per_step
        transfer_s = moved / self.bandwidth.slowest
        compute_s = self.compute_s(setting.batch_size)
        fits = None if self.budget_bytes is None else peak_bytes <= self.budget_bytes
        cost = self.step_cost(setting.batch_size)
        return Estimate(setting, peak_bytes, without_lms, prediction.n_tensors,
                        prediction.swapped_bytes_per_step, prediction.candidates, transfer_s, compute_s,
                        step_time_lower_bound(compute_s, moved, self.bandwidth.slowest), fits,
                        cost.ratio(prediction.swapped_bytes_per_step), cost.source.split(":")[0],
                        "" if correction is None else correction.words)

    def measure(self, setting: Setting) -> Trial:
        """Runs one trial (the model ends as it started) and keeps it."""
        trial = self.runner.measure(setting)
        trial.predicted_peak_bytes = self.estimate(setting).peak_bytes
        self.trials.append(trial)
        return trial

    def start(self, batch_size: int | None = None, lb: int = 1) -> Setting:
        """Where autotune starts: the fewest swaps whose predicted peak fits the budget.

        Raises:
            BudgetError: even swapping every candidate does not fit.
        """
        batch_size = batch_size or self.batch_size
        if self.budget_bytes is None:
            return Setting(0, lb, batch_size)
        return Setting(self.predictor.fewest_swaps(self.replay_budget(), lb, batch_size), lb, batch_size)

    def replay_budget(self) -> int | None:
        """The budget in the replay's bytes: where measured steps say the device holds more than the replay
        (``device_correction``), the replayed peak the device holds as the budget; else the budget."""
        correction = self.device_correction()
        replayed = None if correction is None or self.budget_bytes is None else \
            correction.replay_budget(self.budget_bytes, self.persistent_bytes)
        return self.budget_bytes if replayed is None else replayed

    def search(self, max_trials: int = 12, batch_size: int | None = None, lb: int = 1,
               lb_values=DEFAULT_LB_VALUES, n_values=None) -> PatternSearch:
        """A new autotune search from :meth:`start`, within the budget (driven by :meth:`autotune` or the widget).

        Raises:
            BudgetError: even swapping every candidate does not fit.
        """
        start = self.start(batch_size, lb)
        if "lb" in self.unavailable:  # every lb would be the same step
            lb_values = (start.lb,)
        n_values = n_values or default_n_values(self.predictor.predict(-1, 1, start.batch_size).candidates,
                                                start.n_tensors)
        return PatternSearch(start, n_values, lb_values, max_trials, self.budget_bytes,
                             lambda setting: self.estimate(setting).peak_bytes)

    def autotune(self, max_trials: int = 12, batch_size: int | None = None, lb_values=DEFAULT_LB_VALUES,
                 n_values=None, should_stop=lambda: False, on_trial=lambda trial: None,
                 measure=None) -> SearchResult:
        """Searches from :meth:`start` for the fastest measured setting within the budget.

        ``measure`` replaces :meth:`measure` (to share trials with another search)."""
        search = self.search(max_trials, batch_size, lb_values=lb_values, n_values=n_values)
        return drive(search, measure or self.measure, should_stop, on_trial)

    def lms_call(self, setting: Setting) -> str:
        """The ``LMS(...)`` call for ``setting``, with the options that differ from the defaults."""
        defaults = {"min_bytes": DEFAULT_MIN_BYTES, "host_device": None, "device": None, "lean_ops": False,
                    "order_backward": False, "recompute": False}
        return setting.lms_call(**{k: v for k, v in self.lms_options.items() if v != defaults[k]})


def _tunable(recompute):
    """``recompute`` as the tuner predicts it: False or "only" (the hybrid plan's is made while it trains).

    Raises:
        OptionError: True, or a value LMS does not take.
    """
    if recompute is False or recompute == "only":
        return recompute
    raise OptionError("recompute", recompute, "takes False or 'only' in %lms_tune (the hybrid plan, True, is "
                      "chosen while a fit trains: use it in LMS(...) or %%lms_fit --recompute on)")


def autotune(model, data, budget=None, max_trials: int = 12, batch_size: int = 32, steps: int = 5,
             **options) -> SearchResult:
    """Finds the LMS setting with the best measured time per step within ``budget``.

    Starts from the prediction (the fewest swaps that fit) and measures
    neighbours (more or fewer tensors, larger or smaller ``lb``) until none is
    faster or ``max_trials`` trials ran. Every trial starts from the same
    weights, optimizer state, seed and batches; the model ends as it started.

    Args:
        model: a compiled Keras model (TensorFlow or JAX backend).
        data: ``(x, y)`` arrays or a ``tf.data.Dataset``.
        budget: device memory to stay under ("6GiB" or bytes), or None.
        max_trials: the most trials to measure.
        batch_size: the batch size of every trial.
        steps: timed steps per trial.
        **options: ``min_bytes``, ``device``, ``host_device`` (as for ``LMS``),
            ``lb_values``, ``n_values``.

    Returns:
        A ``SearchResult``: ``best`` (a Trial whose ``setting`` has n_tensors,
        lb and batch_size, or None if nothing fit) and ``trials``.

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
        ...                           keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> found = autotune(model, (np.ones((64, 16)), np.ones(64)), max_trials=3, batch_size=8, steps=2,
        ...                  min_bytes=0)
        >>> found.measured_trials <= 3, found.best.status
        (True, 'ok')
    """
    search_options = {k: options.pop(k) for k in ("lb_values", "n_values") if k in options}
    session = TuningSession(model, data, batch_size, budget, steps, **options)
    return session.autotune(max_trials, **search_options)


__all__ = ["autotune", "TuningSession", "Estimate", "step_time_lower_bound", "BudgetError"]
