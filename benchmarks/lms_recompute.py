"""recompute="only" (gradient checkpointing through fit) on keras.applications models, on this machine's CPU.

For each model, a plain fit and a fit with ``LMS(recompute="only", n_tensors=-1)``, each in a fresh process
(TensorFlow's allocator counts whole chunks, so a peak depends on what earlier models left in it), on the two
logical CPUs the tests use: /CPU:0 plays the accelerator. A recomputed tensor never leaves /CPU:0, so its
allocator peak shows the saving as measured (a swapped one would still be counted: both logical CPUs share
the host's memory). Reports per model: the step's measured allocator peak over what was held before it
(median of the steps after the first), LMS's predicted peaks with and without (weights and optimizer state
included), the tensors recomputed, whether the losses are identical, and the step time (median).

    python benchmarks/lms_recompute.py [--size 64] [--batch 8] [--steps 5] [MODEL ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODELS = ("DenseNet121", "ResNet50", "MobileNetV2", "EfficientNetB0")


def measure(name: str, variant: str, size: int, batch: int, steps: int) -> dict:
    """One fit in this process: ``variant`` is "plain" or "recompute"."""
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from tests.conftest import _split_tensorflow_cpu

    _split_tensorflow_cpu()
    import keras
    import numpy as np
    import tensorflow as tf

    from lms_magic import LMS

    class StepPeaks(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.peaks, self.times, self.losses = [], [], []

        def on_train_batch_begin(self, batch, logs=None):
            tf.config.experimental.reset_memory_stats("CPU:0")
            self.before = tf.config.experimental.get_memory_info("CPU:0")["current"]
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self.started)
            self.peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - self.before)
            self.losses.append(float(logs["loss"]))

    keras.utils.set_random_seed(5)
    model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10,
                                              classifier_activation=None)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.random((batch * steps, size, size, 3), dtype="float32"), rng.integers(0, 10, batch * steps)
    record = StepPeaks()
    callbacks = [record]
    if variant == "recompute":
        callbacks.insert(0, LMS(device="/CPU:0", host_device="/CPU:1", recompute="only", n_tensors=-1, verbose=0))
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    out = {"losses": record.losses, "step_peak_bytes": statistics.median(record.peaks[1:]),
           "step_s": statistics.median(record.times[1:])}
    if variant == "recompute":
        stats = callbacks[0].stats
        out.update(predicted=stats.device_peak_bytes, predicted_without=stats.device_peak_bytes_without_lms,
                   persistent=stats.persistent_bytes, recomputed=stats.recomputed_tensors,
                   recomputed_bytes=stats.recomputed_bytes_per_step, candidates=stats.candidates)
    return out


def main(names, size: int, batch: int, steps: int) -> None:
    mib = 2**20
    print(f"{size}x{size}, batch {batch}, {steps} steps, SGD with momentum; this machine's CPU as the accelerator")
    for name in names:
        runs = {}
        for variant in ("plain", "recompute"):
            done = subprocess.run([sys.executable, __file__, "--one", name, variant, "--size", str(size), "--batch",
                                   str(batch), "--steps", str(steps)], capture_output=True, text=True,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
            if done.returncode:
                raise RuntimeError(done.stderr[-2000:])
            runs[variant] = json.loads(done.stdout.strip().splitlines()[-1])
        plain, lms = runs["plain"], runs["recompute"]
        print(f"{name}: measured step peak {plain['step_peak_bytes'] / mib:.1f} -> {lms['step_peak_bytes'] / mib:.1f} MiB "
              f"({lms['step_peak_bytes'] / plain['step_peak_bytes'] - 1:+.0%}); predicted peak "
              f"{lms['predicted_without'] / mib:.1f} -> {lms['predicted'] / mib:.1f} MiB "
              f"({lms['predicted'] / lms['predicted_without'] - 1:+.0%}; weights and optimizer state "
              f"{lms['persistent'] / mib:.1f}); {lms['recomputed']} of {lms['candidates']} recomputable tensors "
              f"recomputed ({lms['recomputed_bytes'] / mib:.1f} MiB a step); losses "
              f"{'identical' if lms['losses'] == plain['losses'] else 'DIFFERENT'}; step time "
              f"{plain['step_s'] * 1000:.0f} -> {lms['step_s'] * 1000:.0f} ms ({lms['step_s'] / plain['step_s'] - 1:+.0%})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.size, args.batch, args.steps)))
    else:
        main(args.models, args.size, args.batch, args.steps)
