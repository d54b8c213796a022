"""Tuning LMS: instant predictions for any setting, measured trials (``trials.py``) and the autotuner
(``session.py``); ``%lms_tune`` (``ipython/lms_tune.py``) and its widget (``ui/tuner.py``) are its front ends."""

from .session import TuningSession, autotune

__all__ = ["TuningSession", "autotune"]
