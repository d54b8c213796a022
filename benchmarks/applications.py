"""What the keras.applications benchmarks share: a compiled model and its data, on the tests' two logical CPUs
(/CPU:0 plays the accelerator, /CPU:1 the host), and one measurement a fresh process.

    model, x, y = compiled_application("ResNet50", size=64, batch=8, steps=3)
    result = in_fresh_process(__file__, ["ResNet50", "plain"], size=64, batch=8, steps=3)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

MODELS = ("DenseNet121", "ResNet50", "MobileNetV2", "EfficientNetB0")


def compiled_application(name: str, size: int, batch: int, steps: int):
    """keras.applications' ``name`` (seed 5, 10 classes, logits) compiled with SGD and momentum, and ``steps``
    batches of random images and labels; the CPU is split first, as in the tests."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.conftest import _split_tensorflow_cpu

    _split_tensorflow_cpu()
    import keras
    import numpy as np

    keras.utils.set_random_seed(5)
    model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10,
                                              classifier_activation=None)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    return model, rng.random((batch * steps, size, size, 3), dtype="float32"), rng.integers(0, 10, batch * steps)


def fit_step_peaks(model, x, y, batch: int, lms=None) -> dict:
    """``model`` trained one epoch on ``(x, y)`` (with the callback ``lms``, if any): each step's loss, and the
    medians over the steps after the first of /CPU:0's allocator peak over what was held before the step
    (``step_peak_bytes``) and of the step time (``step_s``)."""
    import statistics
    import time

    import keras
    import tensorflow as tf

    class StepPeaks(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.peaks, self.times, self.losses = [], [], []

        def on_train_batch_begin(self, step, logs=None):
            tf.config.experimental.reset_memory_stats("CPU:0")
            self.before = tf.config.experimental.get_memory_info("CPU:0")["current"]
            self.started = time.perf_counter()

        def on_train_batch_end(self, step, logs=None):
            self.times.append(time.perf_counter() - self.started)
            self.peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - self.before)
            self.losses.append(float(logs["loss"]))

    record = StepPeaks()
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=([lms] if lms else []) + [record])
    return {"losses": record.losses, "step_peak_bytes": statistics.median(record.peaks[1:]),
            "step_s": statistics.median(record.times[1:])}


def in_fresh_process(script: str, one: list[str], size: int, batch: int, steps: int) -> dict:
    """``script --one ONE... --size --batch --steps`` in a fresh process (TensorFlow's allocator counts whole
    chunks, so a peak depends on what earlier models left in it); its last line of output, as JSON."""
    done = subprocess.run([sys.executable, script, "--one", *one, "--size", str(size), "--batch", str(batch),
                           "--steps", str(steps)], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def cli(doc: str, measure, main, steps: int) -> None:
    """The benchmark's command line: ``[--size 64] [--batch 8] [--steps N] [MODEL ...]`` runs ``main``; the
    hidden ``--one MODEL VARIANT`` (``in_fresh_process``) prints ``measure``'s result as JSON."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.size, args.batch, args.steps)))
    else:
        main(args.models, args.size, args.batch, args.steps)


def fresh_runs(script: str, name: str, variants, size: int, batch: int, steps: int) -> dict:
    """Each of ``variants`` of model ``name`` measured by ``script`` in a fresh process, by variant."""
    return {variant: in_fresh_process(script, [name, variant], size, batch, steps) for variant in variants}


def header(size: int, batch: int, steps: int) -> str:
    return f"{size}x{size}, batch {batch}, {steps} steps, SGD with momentum; this machine's CPU as the accelerator"
