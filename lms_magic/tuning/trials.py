"""Measured trials: K training steps under one LMS setting, from one saved start.

Every trial starts from the same weights, optimizer state and random seed and
trains on the same batches (the first ``batch_size * (steps + 1)`` samples, in
order); the first step traces and rewrites, so it is not timed. After every
trial, and whatever happens in it, the model is put back as it was. The runs
are :class:`~lms_magic.fit.runs.FairStart` runs, as ``%%lms_fit --compare``'s.
"""

from __future__ import annotations


import keras
import numpy as np

from ..lms.core.autotune import Setting, Trial
from ..lms.options import compiled_model, whole_number
from ..lms.samples import fit_arguments, take_samples
from ..fit.runs import FairStart
from ..quiet import own_retraces_hidden


class TrialRunner:
    """Measures LMS settings on ``model``: time per step and device peak.

    Args:
        model: a compiled Keras model (TensorFlow or JAX backend).
        data: as for :func:`take_samples`.
        steps: timed steps per trial (one more runs first, untimed).
        lms_options: more :class:`lms_magic.LMS` options (``min_bytes``,
            ``device``, ``host_device``...).
        predicted_peak: the predicted peak of a :class:`~lms_magic.lms.core.autotune.Setting` in bytes (the
            tuning session's estimate), for the peak when no GPU measures one.

    On a GPU with TensorFlow the peak is TensorFlow's allocator peak for the
    trial (``peak_source`` says "measured"). Without one the trials train on
    the CPU in the accelerator role and the peak is LMS's own figure of the
    graph that ran (without LMS, ``predicted_peak``), so ``gpu`` is False and
    the times are not GPU times. On
    JAX the peak is the prediction from the step's jaxpr (JAX's device peak
    cannot be reset between trials), and ``peak_source`` says so.
    """

    def __init__(self, model, data, steps: int = 5, lms_options: dict | None = None, predicted_peak=None):
        compiled_model(model)
        whole_number("steps", steps, 1)
        take_samples(data, 1)  # refuse bad data before anything runs
        self.model, self.data, self.steps = model, data, steps
        self.options = dict(lms_options or {})
        from ..lms.framework import framework

        self.framework = framework()
        default, default_is_gpu = self.framework.trial_device()
        self.device = self.options.pop("device", None) or default
        self.gpu = default_is_gpu if self.device == default else "GPU" in self.device.upper()
        self.predicted_peak = predicted_peak
        self.start = FairStart(model, seed=1234)

    @property
    def measures_peak(self) -> bool:
        """Whether trials' peaks are measured (TensorFlow on a GPU), not predicted."""
        return self.gpu and self.framework.trials_measure_peak

    @property
    def peak_source(self) -> str:
        return self.framework.trial_peak_source(self.gpu)

    def measure(self, setting: Setting) -> Trial:
        """Trains ``steps + 1`` steps with ``setting``; the model ends as it started."""
        from ..lms.callback import LMS

        whole_number("batch_size", setting.batch_size, 1)
        args, data_kwargs = fit_arguments(take_samples(self.data, setting.batch_size * (self.steps + 1)))
        lms = None
        if setting.n_tensors != 0:
            lms = LMS(n_tensors=setting.n_tensors, lb=setting.lb, device=self.device, verbose=0, **self.options)
        reset_peak = None
        if self.measures_peak:
            import tensorflow as tf

            reset_peak = lambda: tf.config.experimental.reset_memory_stats(self.device.strip("/"))  # noqa: E731
        try:
            # exactly steps + 1 batches, run to the epoch's end: a fit stopped at its last step leaves Keras's epoch
            # generator suspended with its tf.data iterator, in a cycle only a full collection frees (its threads
            # piled up over trials, and freeing them all at once stalled a tuning test for seconds)
            with own_retraces_hidden():  # each trial traces the step anew: not the user's code to change
                outcome = self.start.run(self.model.fit, args, {**data_kwargs, "batch_size": setting.batch_size,
                                                                "epochs": 1, "shuffle": False, "verbose": 0},
                                         [lms] if lms else [], before_fit=reset_peak)
            if outcome.status == "oom":
                return Trial(setting, "oom", message=f"out of memory: {outcome.error_line}")
            return Trial(setting, "ok", step_s=outcome.recorder.time_per_step_s(), peak_bytes=self._peak(setting, lms))
        finally:
            self.start.restore()

    def _peak(self, setting: Setting, lms) -> int | None:
        if self.measures_peak:
            import tensorflow as tf

            return int(tf.config.experimental.get_memory_info(self.device.strip("/"))["peak"])
        if lms is not None and lms.stats.device_peak_bytes:
            return int(lms.stats.device_peak_bytes)
        if self.predicted_peak is not None:
            return self.predicted_peak(setting)
        return None
