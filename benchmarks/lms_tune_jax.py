"""%lms_tune on Keras's JAX backend, on this machine's CPU: ResNet-50 at 224x224.

Prints:
  - the one-off cost of a tuning session (the step's jaxpr traced and flattened at batch 64) and the time a
    slider move takes to answer (one replay of the jaxpr, memoised; and with both figures redrawn), median
    and p95 over 23 moves of n_tensors to settings not seen yet, then over the same moves again (goal, as
    on TensorFlow: p95 < 100 ms);
  - the replay's peak without LMS over XLA's own figure for the compiled step on this CPU (the predictor's
    ``plain_peak_bytes``: ``memory_analysis()``'s arguments, outputs and temporaries, and the optimizer state), at
    batch 8 and 32.

    KERAS_BACKEND=jax python benchmarks/lms_tune_jax.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from common import Figure, report  # noqa: E402
from lms_magic.lms.core.autotune import Setting  # noqa: E402
from lms_magic.tuning.session import TuningSession  # noqa: E402
from lms_magic.ui.tuner import Tuner  # noqa: E402

MIB, GIB = 2**20, 2**30
FIGURES: list[Figure] = []


def resnet50():
    keras.utils.set_random_seed(1)
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy())
    return model


def slider_response(session):
    tuner = Tuner(session)
    count = tuner.controls["n_tensors"].max
    for visit in ("first visits (a replay each)", "the same settings again (memoised)"):
        moves, redraws = [], []
        for value in np.linspace(0, count, 24).astype(int)[1:]:
            tuner.controls["n_tensors"].value = int(value)
            moves.append(tuner.response_s)
            redraws.append(tuner.redraw_s)
        for what, times in (("prediction only", moves), ("prediction and redraw of both figures", redraws)):
            p95 = statistics.quantiles(times, n=20)[-1]
            print(f"slider response, {visit}, {what}: {len(times)} moves of n_tensors over {count} candidates at "
                  f"batch 64: median {1e3 * statistics.median(times):.0f} ms, p95 {1e3 * p95:.0f} ms, "
                  f"max {1e3 * max(times):.0f} ms")
            if visit.startswith("first"):
                FIGURES.append(Figure(f"%lms_tune slider response on JAX, ResNet-50 224x224 at batch 64 ({what}, a "
                                      "replay each)", f"p95 of {len(times)} moves", round(1e3 * p95, 1), "ms",
                                      round(1e3 * min(times), 1), round(1e3 * max(times), 1), "min-max",
                                      "p95 < 100 ms"))


def against_xla(session, batch_size: int) -> Figure:
    """The replay's peak without LMS over XLA's own figure for the compiled step (``plain_peak_bytes``: the loss and
    gradient compiled for this device, and the optimizer state), both with the weights and optimizer state."""
    predictor = session.predictor
    replay, xla = predictor.predict(0, 1, batch_size).peak_bytes, predictor.plain_peak_bytes(batch_size)
    print(f"batch {batch_size}, without LMS: the replay predicts {replay / MIB:.1f} MiB, XLA's compiled figure "
          f"{xla / MIB:.1f} MiB: {replay / xla:.2f}", flush=True)
    return Figure(f"JAX, ResNet-50 224x224 at batch {batch_size}: the jaxpr replay's peak without LMS over XLA's "
                  "compiled figure (this CPU)", "one compile", round(replay / xla, 3), "x")


def main():
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print(f"Keras {keras.__version__}, JAX {jax.__version__} on {jax.devices()[0].platform}")
    model = resnet50()
    data = (np.zeros((2, 224, 224, 3), "float32"), np.zeros((2,), "int64"))
    started = time.perf_counter()
    session = TuningSession(model, data, batch_size=64, min_bytes=0)
    first = session.estimate(Setting(-1, 1, 64))
    print(f"ResNet-50 224x224: session, trace and first prediction at batch 64 {time.perf_counter() - started:.1f} s; "
          f"{first.candidates} candidates; predicted peak {first.peak_bytes_without_lms / MIB:.0f} MiB without LMS, "
          f"{first.peak_bytes / MIB:.0f} MiB with every candidate offloaded "
          f"({first.swapped_bytes_per_step / MIB:.0f} MiB out per step)")
    slider_response(session)
    report(FIGURES + [against_xla(session, batch_size) for batch_size in (8, 32)])


if __name__ == "__main__":
    main()
