"""%lms_tune on Keras's JAX backend, on this machine's CPU: ResNet-50 at 224x224.

Prints:
  - the one-off cost of a tuning session (the step's jaxpr traced and flattened at batch 64) and the time a
    slider move takes to answer (one replay of the jaxpr, memoised; and with both figures redrawn), median
    and p95 over 23 moves of n_tensors to settings not seen yet, then over the same moves again (goal, as
    on TensorFlow: p95 < 100 ms);
  - the replay's peak without LMS beside XLA's own figure for the compiled loss-and-gradient step on this
    CPU (``memory_analysis()``: arguments, outputs and temporaries), at batch 8 and 32;
  - the largest batch (multiples of 8) whose predicted peak is within 16 GiB, without LMS and with every
    candidate offloaded (predictions of the jaxpr replay: no GPU has run them).

    KERAS_BACKEND=jax python benchmarks/lms_tune_jax.py [--skip-largest]
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

from lms_magic.lms.core.search import Setting  # noqa: E402
from lms_magic.lms.jax.residuals import differentiated, named_residuals  # noqa: E402
from lms_magic.tuning.session import TuningSession  # noqa: E402
from lms_magic.ui.tuner import Tuner  # noqa: E402

MIB, GIB = 2**20, 2**30


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


def against_xla(session, batch_size: int):
    predictor = session.predictor
    plain = predictor.predict(0, 1, batch_size)
    inner, args = predictor._inner_and_args(batch_size)
    function, specs = differentiated(named_residuals(inner), args)
    started = time.perf_counter()
    analysis = jax.jit(function).lower(*specs).compile().memory_analysis()
    xla = analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes \
        - analysis.alias_size_in_bytes
    # the loss and gradient read no optimizer variable (jit drops unused arguments): the replay's figure without them
    optimizer_bytes = sum(t.nbytes for t in predictor._persistent if t.kind == "optimizer_state")
    comparable = plain.peak_bytes - optimizer_bytes
    print(f"batch {batch_size}, without LMS: the replay predicts {plain.peak_bytes / MIB:.1f} MiB, "
          f"{comparable / MIB:.1f} MiB without the optimizer state ({optimizer_bytes / MIB:.1f} MiB); XLA's compiled "
          f"loss-and-gradient step ({time.perf_counter() - started:.0f} s to compile) holds arguments "
          f"{analysis.argument_size_in_bytes / MIB:.1f} + outputs {analysis.output_size_in_bytes / MIB:.1f} + "
          f"temporaries {analysis.temp_size_in_bytes / MIB:.1f} MiB = {xla / MIB:.1f} MiB; replay / XLA "
          f"{comparable / xla:.2f}")


def largest_batch(session, budget_bytes: int):
    predictor = session.predictor

    def fits(batch_size: int, count: int) -> bool:
        started = time.perf_counter()
        peak = predictor.predict(count, 1, batch_size).peak_bytes
        print(f"  batch {batch_size}, {'every output offloaded' if count else 'without LMS'}: "
              f"{peak / GIB:.2f} GiB ({time.perf_counter() - started:.0f} s)", flush=True)
        return peak <= budget_bytes

    for label, count in (("without LMS", 0), ("every candidate offloaded", -1)):
        low, high = 8, 16
        while fits(high, count):
            low, high = high, high * 2
        while high - low > 8:
            middle = (low + high) // 16 * 8
            low, high = (middle, high) if fits(middle, count) else (low, middle)
        print(f"largest batch within {budget_bytes / GIB:.0f} GiB, {label}: {low} (predicted)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-largest", action="store_true")
    args = parser.parse_args()
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
    for batch_size in (8, 32):
        against_xla(session, batch_size)
    if not args.skip_largest:
        largest_batch(session, 16 * GIB)


if __name__ == "__main__":
    main()
