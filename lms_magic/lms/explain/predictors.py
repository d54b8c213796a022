"""A model's step predictors, one per way of training, and the step's estimated cost: what ``explain_fit``
(``replay.py``, for ``sizing/explain_fit.py``) and the tuner (``tuning/session.py``) both predict with (no framework import here)."""

from __future__ import annotations

from ..core.prediction import StepPredictor
from ..options import LmsOptions


def _held(predictor: StepPredictor, scratch) -> None:
    """``predictor``'s replays hold ``scratch`` where it takes a measured one (``use_kernel_scratch``)."""
    use = getattr(predictor, "use_kernel_scratch", None)
    if use is not None:
        use(scratch)


class StepPredictors:
    """The framework's step predictor (``Framework.predictor``) of ``model`` for each ``(lean_ops, order_backward,
    recompute)``, made on first use from two samples of ``data``.

    Args:
        model: a compiled Keras model.
        data: what ``fit`` takes (``samples.take_samples``); a KerasHub task model's preprocessor runs over it as
            its ``fit`` would (``samples.preprocessed``).
        options: the checked options (``min_bytes``, the filters, ``device``, ``host_device``).
        tuner: for the tuner, which refuses where the framework says so (``tuner_refusal``); ``explain_fit``'s
            predictions run on every framework. Defaults to True.

    Raises:
        ValueError: no predictor on this framework, an option it does not take, an unknown device, or bad data.
    """

    def __init__(self, model, data, options: LmsOptions, tuner: bool = True):
        from ..framework import check_devices, framework, refuse_unavailable
        from ..samples import preprocessed, take_samples

        self.framework = framework()
        if tuner and self.framework.tuner_refusal is not None:
            raise ValueError(self.framework.tuner_refusal)
        self.unavailable: dict[str, str] = {**self.framework.unavailable, **self.framework.predictor_unavailable}
        refuse_unavailable(options, self.unavailable)
        if "device" not in self.unavailable:
            check_devices(options.device, options.host_device)
        self.model, self.options, self.samples = model, options, preprocessed(model, take_samples(data, 2))
        self._made: dict[tuple, StepPredictor] = {}
        self._compute_s: dict[tuple, float] = {}  # (predictor, batch size) -> the FLOP estimate's compute seconds
        self._lean_changes: bool | None = None  # whether lean_ops changes any layer of the model (lean_changes)
        self.scratch = None  # each kernel's scratch as measured on the device (core.scratch.KernelScratch)

    def lean_changes(self) -> bool:
        """Whether ``lean_ops`` changes the model's step: it has a ``BatchNormalization`` whose gradient it computes
        (``lean.lean_layers``). Where not, the lean step is the step without it."""
        if self._lean_changes is None:
            from ..lean import lean_layers

            self._lean_changes = bool(lean_layers(self.model))
        return self._lean_changes

    def get(self, lean_ops: bool = False, order_backward: bool = False, recompute=False) -> StepPredictor:
        """The predictor for these options (made once), given the ones made before it to take what it can from
        (``StepPredictor.share``: on TensorFlow, the traces of the same step and the rule that sized them). On
        TensorFlow it reads every batch size off two steps: a trace at a prime near the batch asked for first, and
        that batch sized from it; a new one on the batch slider is then instant. ``lean_ops`` on a model with no
        layer it changes (no ``BatchNormalization``) is the step without it: that predictor."""
        lean_ops = lean_ops and self.lean_changes()
        key = (lean_ops, order_backward, recompute)
        if key not in self._made:
            made = self.framework.predictor(self.model, self.samples, self.options, *key)
            made.share(self._made)
            self._made[key] = made
            if self.scratch is not None:
                _held(made, self.scratch)
        return self._made[key]

    def use_kernel_scratch(self, scratch) -> None:
        """Every predictor's replays hold each kernel's scratch as measured (a ``core.scratch.KernelScratch``) at
        its op, where the framework's replay can (TensorFlow's)."""
        self.scratch = scratch
        for made in self._made.values():
            _held(made, scratch)

    def step_cost(self, predictor: StepPredictor, batch_size: int, bandwidth, compute_s: float | None = None):
        """The :class:`~lms_magic.lms.core.costs.StepCost` at ``batch_size``: ``compute_s`` where one was measured
        (said so), else ``predictor``'s traced step FLOPs at the device's rate (once per predictor and batch size);
        the host link's ``bandwidth``."""
        from ..core.costs import StepCost

        link = (bandwidth.device_to_host, bandwidth.host_to_device)
        if compute_s is not None:
            return StepCost(compute_s, "measured: the fastest trial's step, per sample", *link)
        key = (id(predictor), batch_size)  # the predictors live as long as this object
        if key not in self._compute_s:
            self._compute_s[key] = predictor.estimated_compute_s(batch_size, self.options.device)
        return StepCost(self._compute_s[key], "estimated: " + predictor.compute_estimate, *link)


__all__ = ["StepPredictors"]
