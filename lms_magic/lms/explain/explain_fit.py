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
from .results import FitExplanation, FrontierPoint, ModeFit
from .search import largest_fitting

# name, the tuner's options, and the %%lms_fit line that trains that way
MODES = (("without LMS", {}, ""), ("LMS", {}, "%%lms_fit"),
         ("LMS, recompute", {"recompute": "only"}, "%%lms_fit --recompute only"),
         ("LMS, lean_ops", {"lean_ops": True}, "%%lms_fit --lean-ops"))
# beside lean_ops's figures where the model has no layer it changes: they are LMS's alone
NOTHING_LEAN = "the same as LMS alone: lean_ops changes BatchNormalization's gradient, and the model has none"
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
                              session.predictor.caveat, plain_bytes, source, plain_usable)


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
    from ..core.stats import LmsStats
    from ..framework import framework
    from ..options import LmsOptions

    chosen, stats = framework(), LmsStats()
    prepared = chosen.prepare(LmsOptions(device=options.get("device"), host_device=options.get("host_device")), stats)
    return None if chosen.off_reason(prepared) is not None else stats.capacity_bytes


__all__ = ["MODES", "explain_fit"]
