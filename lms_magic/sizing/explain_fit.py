"""Why a fit does not fit, and what will, before training: ``explain_fit``.

The step's predictor for each way of training (:class:`~lms_magic.lms.explain.predictors.StepPredictors`, as
``%lms_tune``'s: on TensorFlow one trace per way, the batch asked for sized from it, every other batch size read
off those two; on JAX a jaxpr per batch size; on PyTorch the step run at two small batch sizes) gives the step's
predicted device peak explained: what fills it by kind (weights, optimizer state, gradients, activations) and the
Keras layers whose tensors hold the most at the peak. Against the device's capacity (given, the GPU's, or
``simulate_accelerator``'s), it finds the largest batch each way of training fits (``explain/largest.py``): without LMS,
with LMS's default plan, with ``recompute="only"`` and with ``lean_ops``, each with its predicted step time over a
plain step's, and the ``%%lms_fit`` line that trains the batch asked for where one does (``replay.py``). Where
the device's allocator can be read, the closed loop here holds those figures to real steps (``measured.py``): a
plain step corrects them, and steps confirm each way's largest batch (``explain/largest.py``). The answer is a
:class:`~lms_magic.lms.explain.results.FitExplanation`.
"""

from __future__ import annotations

from dataclasses import replace

from ..lms.core import device_model
from ..lms.core.device_model import Correction
from ..lms.explain.largest import Confirmed, MeasuredStep, confirm_largest
from ..lms.explain.replay import MODES, mode_fit, prediction_at, explained
from ..lms.explain.results import FitExplanation, ModeFit
from ..units import format_size


def explain_fit(model, data, batch_size: int = 32, capacity=None, modes=None, batch_sizes=(),
                speed_target: float = 0.9, budget=None, confirm: bool | None = None, epochs: int | None = None,
                steps_per_epoch: int | None = None, **options) -> FitExplanation:
    """Why a fit of ``model`` on ``data`` at ``batch_size`` does not fit the device, and what will, before training.

    Traces the train step (on TensorFlow once per way of training, the batch asked for sized from that trace by
    TensorFlow's shape inference, every other batch size read off those two; on
    JAX at each batch size the search needs; on PyTorch runs it, without updating anything, at two small batch
    sizes and reads the others off) and predicts its device peak (held to steps measured on the device where its
    allocator can be read: ``confirm``); explains the peak without LMS by kind
    and by Keras layer; and, against the device's capacity, finds the largest batch without LMS, with LMS's default plan, with
    ``recompute="only"`` and with ``lean_ops`` (where the backend offers them).

    Args:
        model: a compiled Keras model (TensorFlow, JAX or PyTorch backend).
        data: ``(x, y)`` arrays or a ``tf.data.Dataset``, as for ``fit``.
        batch_size: the batch the user asks for.
        capacity: the device's memory ("16GiB" or bytes). Defaults to the device LMS relieves (the first
            GPU, or the accelerator ``lms_magic.simulate_accelerator(memory=...)`` made); None where there is none.
            A capacity LMS would not find by itself puts the budget it leaves into each ``%%lms_fit`` line.
        modes: the names of ``MODES`` to consider. Defaults to all.
        batch_sizes: batch sizes for the frontier: each way's predicted peak and step time at each. Defaults to
            none.
        speed_target: the share of plain speed the frontier's "largest batch at speed" asks for. Defaults to 0.9.
        budget: the bytes every way of training may fill ("512MiB" or bytes; ``%lms_tune``'s budget), instead of
            the device's share (80%, or 95% for a peak without LMS read from the framework itself). Defaults to None.
        confirm: run real steps on the device (``measured.py``): True measures a plain step at a batch predicted
            to fit, corrects every way's figures by what the allocator held beyond the graph's tensors, and
            confirms each way's largest batch by steps at it (backing off where a step does not fit); None (the
            default) does the same where the device's allocator can be read: a GPU, or ``simulate_accelerator``'s
            device (there a step with LMS is read as LMS reads its own: the allocator, which the host shares,
            less what the host held); False runs nothing (plain steps this process measured before on the same
            model, device and data still correct the figures where they hold the batch: ``%lms_tune``'s frontier
            reads them so). The model, its optimizer, metrics and the random state end as they were.
        epochs: the fit's epochs, as ``fit`` takes them. With ``steps_per_epoch`` (else the data's samples over
            each batch size), the fit's length: on TensorFlow a fit too short to pay for a retrace keeps LMS's
            first step, which swaps every eligible tensor (less memory, more copies), and a way with LMS is
            predicted so (a retrace timed where steps with LMS ran, else the step's own trace: fewer such fits).
            Defaults to None: a fit long enough that only copies which cost nothing more stand.
        steps_per_epoch: as ``fit`` takes it. Defaults to None.
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
        (False, True, '%%lms_fit --budget 51MiB')
        >>> found.modes[0].largest_batch < 6000 < found.modes[1].largest_batch
        True
    """
    fit_steps = None
    if epochs is not None:
        from ..lms.options import whole_number
        from ..lms.samples import fit_steps as steps_of

        whole_number("epochs", epochs, 1)
        if steps_per_epoch is not None:
            whole_number("steps_per_epoch", steps_per_epoch, 1)
        fit_steps = steps_of(data, epochs, steps_per_epoch)

    def closed_loop(capacity_bytes: int | None, usable: int | None, given: bool):
        if confirm is False:  # nothing runs: the steps this process measured before still correct the figures
            kept = _kept_steps(model, data, options) if capacity_bytes else None
            return None if kept is None else _ClosedLoop(kept, "", confirming=False)
        if not capacity_bytes and not confirm:
            return None
        meter, why = (None, "no device capacity known: pass capacity=...") if not capacity_bytes else \
            _meter(model, data, options, budget=usable if given else None, fit_steps=fit_steps)
        if confirm and meter is None:
            raise ValueError(f"confirm=True: {why}; leave confirm out for the predicted figures alone")
        return _ClosedLoop(meter, why)

    return explained(model, data, batch_size, capacity, modes, batch_sizes, speed_target, budget, closed_loop,
                     fit_steps, **options)


class _ClosedLoop:
    """``explained``'s loop: a plain step measured on the device corrects the figures (``correct``); steps confirm
    each way's largest batch (``confirm``) wherever a meter reads the device (a GPU, or the simulated device, where
    a step with LMS is LMS's own reading of it)."""

    def __init__(self, meter, unmeasured: str, confirming: bool = True):
        self.meter, self.unmeasured, self.confirming = meter, unmeasured, confirming

    def retrace_s(self) -> float | None:
        """LMS's first checked step as this device's steps with LMS timed it (``MeasuredDevice.retrace_s``)."""
        measured = None if self.meter is None else self.meter.measured_device()
        return None if measured is None else measured.retrace_s()

    def correct(self, session, batch_size: int, capacity_bytes: int | None, limit: int | None) -> Correction | None:
        found = None if self.meter is None else _correction(session, self.meter, batch_size, capacity_bytes, limit)
        # confirm=False: where no kept steps hold the batch, the replay's figures (nothing ran out of memory)
        return None if found is None or not self.confirming and found.measured_bytes is None else found

    def confirm(self, session, found: ModeFit, tuned: dict, capacity_bytes: int | None, limit: int,
                batch_size: int) -> ModeFit:
        meter, budget = self.meter, tuned.get("budget")
        if meter is None or not self.confirming or found.magic and budget is not None and budget <= 0:
            # (no bytes left for LMS to plan in)
            return found
        from .measured import Unmeasured

        try:
            found = replace(found, confirmed=_confirmed(session, meter, found, tuned, limit))
        except Unmeasured as error:  # LMS moved tensors and its profile did not show what the device held
            return replace(found, note="; ".join(filter(None, (found.note, f"not confirmed: {error}"))))
        return _by_own_steps(session, found, batch_size, capacity_bytes, limit) if found.magic else found

    def held(self, session, found: ModeFit, batch_size: int, capacity_bytes: int | None) -> int | None:
        """A way with LMS at another batch (the frontier's) as its own measured steps say, or None."""
        own = own_figure(session, found, batch_size, capacity_bytes) if found.magic else None
        return None if own is None else own[0]


def _by_own_steps(session, found: ModeFit, batch_size: int, capacity_bytes: int | None, limit: int) -> ModeFit:
    """A way with LMS at the batch asked for as its own measured steps say (``own_figure``)."""
    own = own_figure(session, found, batch_size, capacity_bytes)
    if own is None:
        return found
    peak_bytes, how = own
    note = "; ".join(filter(None, (found.note, f"{format_size(peak_bytes)}: {how}")))
    fits = peak_bytes <= limit or found.confirmed.batch_size >= batch_size
    return replace(found, peak_bytes=peak_bytes, fits=fits, note=note)


def own_figure(session, found: ModeFit, batch_size: int, capacity_bytes: int | None) -> tuple[int, str] | None:
    """A way with LMS at ``batch_size`` as its own measured steps (``found.confirmed``) say, and how: its step there,
    where one was measured, else its replay times what its nearest measured step held over its replay; None where
    none was measured. The plain steps' correction would charge it for what it moved to the host: each way is held
    to its own steps. None too where its plan there moves nothing: that step is the model's own, and the plain
    steps' figures hold it."""
    steps = [step for step in (found.confirmed.tried if found.confirmed else ()) if step.step_bytes is not None]
    if not steps:
        return None
    persistent = session.predictor.persistent_bytes
    near = min(steps, key=lambda step: (abs(step.batch_size - batch_size), step.batch_size))
    if near.batch_size == batch_size:
        return persistent + near.step_bytes, f"its step at batch {batch_size} measured"
    planned = prediction_at(session, True, batch_size, capacity_bytes)
    if not planned.swapped_bytes_per_step + planned.recomputed_bytes_per_step:  # the model's own step: plain's figure
        return None

    def replayed(batch: int) -> int:
        return prediction_at(session, True, batch, capacity_bytes).peak_bytes - persistent

    ratio = near.step_bytes / max(1, replayed(near.batch_size))
    return (persistent + int(ratio * replayed(batch_size)),
            f"its replay at batch {batch_size} times {ratio:.2f}, as its step at {near.batch_size} held")


def measurable(model, data, **options) -> bool:
    """Whether steps of ``model`` can be measured on the device LMS relieves (``explain_fit(..., confirm=True)``)."""
    return _meter(model, data, options, None)[0] is not None


def _meter(model, data, options: dict, budget: int | None, fit_steps=None):
    """The meter of the device LMS relieves (``measured.step_meter``), and why there is none."""
    from .measured import step_meter

    lms_options = {**options, **({"budget": budget} if budget is not None else {})}
    return step_meter(model, data, _measured_device_name(options), lms_options, fit_steps)


def _measured_device_name(options: dict) -> str | None:
    """The device LMS relieves with these options, as a meter measures it ("/GPU:0", "/CPU:0", "cuda:0")."""
    from ..lms.core.stats import LmsStats
    from ..lms.framework import framework
    from ..lms.options import LmsOptions

    chosen = framework()
    prepared = chosen.prepare(LmsOptions(device=options.get("device"), host_device=options.get("host_device")),
                              LmsStats())
    device = prepared.device
    if device is None:  # the framework's own choice (PyTorch): the GPU the model trains on, where there is one
        trains_on, gpu = chosen.trial_device()
        device = trains_on or ("cuda:0" if gpu else None)
    return device


class _KeptSteps:
    """A meter that runs nothing (``confirm=False``): the plain steps this process measured before on the same model,
    device and data (``lms.core.device_model``), read as a meter's."""

    def __init__(self, kept):
        self.kept, self.where = kept, kept.correction.source

    def measured_device(self):
        return self.kept

    def kept_batches(self) -> list[int]:
        return sorted(self.kept.steps.get(device_model.PLAIN, {}))

    def measure(self, batch_size: int, with_lms: bool = False, options: dict | None = None) -> MeasuredStep:
        step = None if with_lms else self.kept.steps.get(device_model.PLAIN, {}).get(batch_size)
        return step if step is not None else MeasuredStep(batch_size, with_lms, None)


def _kept_steps(model, data, options: dict) -> _KeptSteps | None:
    """The steps kept for ``model`` on ``data`` and the device LMS relieves, where they made a correction; else None."""
    from .measured import StepMeter

    kept = StepMeter(model, data, None, device=_measured_device_name(options)).measured_device()
    return None if kept is None or kept.correction is None or kept.correction.measured_bytes is None else \
        _KeptSteps(kept)


class KeptCorrection:
    """What the plain steps this process measured before on a model, its device and data say near one batch size, as
    ``explain_fit(confirm=False)`` reads them, for a session that predicts as long as it lives (``%lms_tune``'s):
    read again only when the steps kept change. Nothing runs.

    Args:
        model, data: as for ``explain_fit``.
        options: ``device``, ``host_device``, as for ``LMS``.
        batch_size: the batch the kept steps are read near (``kept_pair``).
    """

    def __init__(self, model, data, options: dict, batch_size: int):
        from .measured import StepMeter

        self.batch_size = batch_size
        self._meter = StepMeter(model, data, None, device=_measured_device_name(options))
        self._steps: tuple | None = None  # the kept plain steps last read: (batch size, step bytes), in order
        self._found: Correction | None = None

    def __call__(self, session) -> Correction | None:
        """The correction, or None where no kept steps hold the batch; their kernel scratch is then held in
        ``session``'s replays (``session`` has an explanation's ``predictor`` and ``predictors``)."""
        kept = self._meter.measured_device()
        plain = {} if kept is None or kept.correction is None else kept.steps.get(device_model.PLAIN, {})
        steps = tuple(sorted((batch, step.step_bytes) for batch, step in plain.items()))
        if steps != self._steps:
            self._steps = steps
            found = _correction(session, _KeptSteps(kept), self.batch_size, None, None) if steps else None
            self._found = None if found is None or found.measured_bytes is None else found
        return self._found


def _correction(session, meter, batch_size: int, capacity_bytes: int | None, limit: int | None) -> Correction:
    """Plain steps measured at the batch asked for (or the largest predicted to fit, where smaller) and at half
    of it, or two steps measured before on the same model, device and data where they hold that batch closely
    (``kept_pair``: a later answer reads the figures an earlier one showed, not a step measured again). Where
    the framework reads each kernel's scratch off the steps (TensorFlow's profiler), every replay
    holds it at its op from then on (``core.scratch``: a line in the batch for each op). What the allocator held
    beyond the replay is then the line through the two steps' peaks against the replay's step bytes (a fixed part
    and one that grows with the batch), or the one step's ratio where only one could be measured. Steps of the
    same batch in one process vary by up to 15%; the line is made over batches far enough apart to show the fixed
    part, and only where the two steps' ratios differ by more than that (else one ratio fits both)."""
    from ..lms.core.scratch import KernelScratch

    persistent = session.predictor.persistent_bytes
    plain = mode_fit(session, "", "", batch_size, capacity_bytes, limit) if limit is not None else None
    batch = max(1, min(batch_size, plain.largest_batch if plain is not None and plain.largest_batch else batch_size))
    batch, low_batch = kept_pair(meter.kept_batches(), batch) or (batch, batch // 2)
    steps = [meter.measure(batch)]
    if steps[0].step_bytes is not None and low_batch >= 1:
        steps.append(meter.measure(low_batch))
    scratch = {step.batch_size: step.scratch for step in steps if step.step_bytes is not None and step.scratch}
    words = ""
    if scratch:  # held at each op in every way's replay, LMS's too
        found = KernelScratch(scratch)
        session.predictors.use_kernel_scratch(found)
        layer_path = getattr(session.predictor, "layer_path", None)
        words = found.words(batch, layer_path) if layer_path is not None else ""

    def predicted_at(size: int) -> int:
        return session.predictor.plain_peak_bytes(size) - persistent

    measured, predicted = steps[0].step_bytes, predicted_at(batch)
    if measured is None:
        return Correction(batch, None, predicted, 1.0, meter.where)
    low = (low_batch, steps[1].step_bytes, predicted_at(low_batch)) if len(steps) == 2 else None
    found = Correction.through(batch, measured, predicted, meter.where, low, words)
    kept = getattr(meter, "measured_device", lambda: None)()
    if kept is not None:  # LMS's figure without LMS, and the dashboard's, read it (lms.core.device_model)
        kept.correction = found
    return found


def kept_pair(kept: list[int], batch: int) -> tuple[int, int] | None:
    """Two batch sizes measured before to correct by instead of ``batch`` and half of it, where they hold it closely:
    the smallest at or above ``batch`` up to twice it (else the largest below it down to half), and the largest
    at or below half of that. None where the steps kept do not hold ``batch`` so.

    Example:
        >>> kept_pair([4, 8], 5), kept_pair([2, 4], 8), kept_pair([4, 8], 3), kept_pair([8], 6)
        ((8, 4), (4, 2), None, None)
    """
    above = [kept_batch for kept_batch in kept if batch <= kept_batch <= 2 * batch]
    below = [kept_batch for kept_batch in kept if batch / 2 <= kept_batch < batch]
    high = min(above) if above else max(below, default=None)
    lows = [kept_batch for kept_batch in kept if high is not None and kept_batch <= high // 2]
    return (high, max(lows)) if lows else None


def _confirmed(session, meter, found: ModeFit, tuned: dict, limit: int) -> Confirmed:
    """``found``'s largest batch confirmed by steps on the device (``explain/largest.py``)."""
    with_lms = bool(found.magic)
    persistent = session.predictor.persistent_bytes

    def predicted_step_bytes(batch: int) -> int:
        # with LMS, its lowest peak (every eligible tensor moved), which grows with the batch: the plan for the
        # capacity fills about the budget at every batch it moves tensors at, so a measured step's ratio over it
        # says nothing of where the largest batch lies
        peak = session.predictor.plain_peak_bytes(batch) if not with_lms else \
            session.predictor.predict(-1, 1, batch).peak_bytes
        return peak - persistent

    return confirm_largest(lambda batch: meter.measure(batch, with_lms, tuned), predicted_step_bytes, persistent,
                           limit, max(1, found.largest_batch or 1))


__all__ = ["MODES", "explain_fit", "KeptCorrection", "measurable"]
