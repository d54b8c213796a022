"""A pytest plugin: every Keras ``fit`` gets ``LMS()`` in its callbacks, so Keras's own tests run as a peer's
suite with LMS in every fit (``run.py``). ``LMS_IN_EVERY_FIT=0`` leaves the fits alone (the baseline run).
On TensorFlow the CPU plays an accelerator and a host (``simulate_accelerator``), with or without LMS."""

from __future__ import annotations

import inspect
import os


def pytest_configure(config):
    import lms_magic

    if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
        lms_magic.simulate_accelerator(memory=os.environ.get("LMS_SIMULATED_MEMORY", "1GiB"))
    if os.environ.get("LMS_IN_EVERY_FIT", "1") != "1":
        return
    import keras

    from lms_magic import LMS

    original = keras.Model.fit
    parameters = [name for name in inspect.signature(original).parameters if name != "self"]

    def fit(model, *args, **kwargs):
        named = dict(zip(parameters, args))
        named.update(kwargs)
        named["callbacks"] = list(named.get("callbacks") or []) + [LMS(verbose=0)]
        return original(model, **named)

    fit.__wrapped__ = original
    keras.Model.fit = fit
