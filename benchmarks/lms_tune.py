"""Tuning: slider response time on ResNet-50 at batch 64, and autotune trials against the full grid.

Prints:
  - the time a slider move takes to answer (the prediction only: one memoised liveness replay), median and
    max over moves of n_tensors and lb at batch 64 (goal < 100 ms), and the one-off costs before it (the
    trace, and the first prediction at a new batch size or lb);
  - for two small models on this machine's CPU (two logical CPUs as accelerator and host): how many
    measured trials autotune needs, against a full grid, and how close its best is to the grid's best.
Usage: python benchmarks/lms_tune.py [--skip-resnet | --resnet-only]
"""

import argparse
import functools
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from common import Figure, report  # noqa: E402
from lms_magic.lms.core.autotune import Setting, grid_search  # noqa: E402
from lms_magic.tuning.session import TuningSession  # noqa: E402
from lms_magic.ui.tuner import Tuner  # noqa: E402

MIB = 2**20
FIGURES: list[Figure] = []


def slider_response():
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy())
    data = (np.zeros((2, 224, 224, 3), "float32"), np.zeros((2,), "int64"))
    started = time.perf_counter()
    session = TuningSession(model, data, batch_size=64, min_bytes=0)
    tuner = Tuner(session)
    print(f"ResNet-50: trace and first prediction at batch 64 {time.perf_counter() - started:.1f} s (once per model)")
    count = tuner.controls["n_tensors"].max
    moves, redraws = [], []
    for lb in (1, 2):
        started = time.perf_counter()
        tuner.controls["lb"].value = lb
        print(f"  first move to lb={lb}: {1e3 * (time.perf_counter() - started):.0f} ms (candidates found once per lb)")
        for count_value in np.linspace(0, count, 12).astype(int):
            tuner.controls["n_tensors"].value = int(count_value)
            moves.append(tuner.response_s)
            redraws.append(tuner.redraw_s)
    for what, times in (("prediction only", moves), ("prediction and redraw of both figures", redraws)):
        p95 = statistics.quantiles(times, n=20)[-1]
        print(f"slider response ({what}), {len(times)} moves of n_tensors over {count} candidates at batch 64: "
              f"median {1e3 * statistics.median(times):.0f} ms, p95 {1e3 * p95:.0f} ms, max {1e3 * max(times):.0f} ms "
              "(goal: p95 < 100 ms)")
        FIGURES.append(Figure(f"%lms_tune slider response, ResNet-50 224x224 at batch 64 ({what})",
                              f"p95 of {len(times)} moves", round(1e3 * p95, 1), "ms", round(1e3 * min(times), 1),
                              round(1e3 * max(times), 1), "min-max", "p95 < 100 ms"))
    for count_value in (0, count // 2, count):
        e = session.estimate(Setting(int(count_value), 1, 64))
        print(f"  n_tensors={count_value}: predicted peak {e.peak_bytes / MIB:.0f} MiB, "
              f"{e.swapped_bytes_per_step / MIB:.0f} MiB out per step, copies >= {1e3 * e.transfer_s:.0f} ms "
              f"at {session.bandwidth.slowest / 1e9:.0f} GB/s ({session.bandwidth.source})")


def small_cnn():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((32, 32, 3))] + [keras.layers.Conv2D(32, 3, padding="same",
                                                                                activation="relu") for _ in range(12)]
                             + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def residual():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(32, 3, padding="same")(inputs)
    for _ in range(6):
        branch = keras.layers.Conv2D(32, 3, padding="same")(x)
        branch = keras.layers.BatchNormalization()(branch)
        x = keras.layers.Add()([x, keras.layers.Activation("relu")(branch)])
    outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, outputs)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def autotune_against_grid(name, build):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(256, 32, 32, 3)).astype("float32"), rng.integers(0, 10, 256)
    session = TuningSession(build(), data, batch_size=32, steps=5, min_bytes=0, device="/CPU:0",
                            host_device="/CPU:1")
    count = session.predictor.predict(-1, 1, 32).candidates
    plain, lowest = session.predictor.predict(0, 1, 32), session.predictor.predict(-1, 1, 32)
    session.set_budget(plain.peak_bytes - (plain.peak_bytes - lowest.peak_bytes) // 2)
    n_values = sorted({round(count * k / 6) for k in range(7)})
    lb_values = [1, 2, 3]
    measure = functools.cache(session.measure)  # one measured trial per setting, shared by both searches
    grid = grid_search([Setting(n, lb, 32) for n in n_values for lb in lb_values], measure, session.budget_bytes)
    found = session.autotune(max_trials=len(n_values) * len(lb_values), n_values=n_values, lb_values=lb_values,
                             measure=measure)
    print(f"{name}: budget {session.budget_bytes / MIB:.1f} MiB (no LMS {plain.peak_bytes / MIB:.1f}); grid "
          f"{len(n_values) * len(lb_values)} trials, best {grid.best.setting} at {1e3 * grid.best.step_s:.1f} ms; "
          f"autotune {found.measured_trials} trials, best {found.best.setting} at {1e3 * found.best.step_s:.1f} ms "
          f"({found.best.step_s / grid.best.step_s:.3f} of the grid's best; {found.stopped_by})")
    FIGURES.append(Figure(f"autotune, {name}: measured trials against a grid of {len(n_values) * len(lb_values)}",
                          "one search", found.measured_trials, "trials"))
    FIGURES.append(Figure(f"autotune, {name}: its best step time over the grid's best", "one search",
                          round(found.best.step_s / grid.best.step_s, 3), "x"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-resnet", action="store_true")
    parser.add_argument("--resnet-only", action="store_true", help="the slider figures only")
    args = parser.parse_args()
    if not args.skip_resnet:
        slider_response()
    if not args.resnet_only:
        autotune_against_grid("12-conv CNN 32x32", small_cnn)
        autotune_against_grid("residual CNN + BatchNorm 32x32", residual)
    report(FIGURES)


if __name__ == "__main__":
    main()
