"""TensorFlow's measured peak of one plain train step, taken in a fresh process.

TensorFlow's allocator counts whole chunks: a request served from a larger
free chunk (up to twice its size) counts at the chunk's size. So a peak
measured in a process that has already trained other models depends on what
they left in the allocator's free lists (the subclassed CNN measured 8.4 MiB
fresh and 8.9-13.6 MiB after the other models), and a test that measures in
the pytest process depends on the tests before it. Here the only history is
the model's own warm-up.

A fresh process is not always the same either: in a few its warm-up leaves
the free lists so that every later step counts a chunk or two more (the
subclassed CNN: 8.4 MiB in most, 2-4 MiB more in a few; docs/measurements.md).
So ``measure`` takes the median of three processes, run side by side.

Run as ``python -m tests.lms.tensorflow.fresh_peak NAME``; prints the peak in bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

MODELS = ("reference cnn", "residual", "subclassed")  # and "NAME:SIZE:BATCH" for keras.applications' NAME


def application(name: str, size: int, batch: int, steps: int = 2):
    """keras.applications' ``name`` at ``size`` x ``size`` (seed 5, 10 classes, logits) compiled with SGD and
    momentum, and ``steps`` batches of random images and labels: the model and its data (the benchmarks' too)."""
    import keras
    import numpy as np

    from tests.lms.tensorflow.real_models import application as builder

    model = builder(name, size)()
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    return model, (rng.random((batch * steps, size, size, 3), dtype="float32"), rng.integers(0, 10, batch * steps))


def spec_of(spec: str) -> tuple[str, int, int]:
    """``"ResNet50:128:16"`` as (name, image size, batch)."""
    name, size, batch = spec.split(":")
    return name, int(size), int(batch)


def measure(name: str, processes: int = 3) -> int:
    """The median of ``processes`` fresh interpreters' measures of model ``name`` (one of MODELS, or a
    keras.applications spec), run side by side."""
    root = Path(__file__).resolve().parents[3]
    running = [subprocess.Popen([sys.executable, "-m", "tests.lms.tensorflow.fresh_peak", name], cwd=root,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(root)}) for _ in range(processes)]
    peaks = []
    try:
        for process in running:
            out, err = process.communicate(timeout=300)
            if process.returncode != 0:
                raise RuntimeError(f"measuring {name!r} failed:\n{err[-3000:]}")
            peaks.append(int(json.loads(out.strip().splitlines()[-1])["peak_bytes"]))
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()
                process.wait()
    return sorted(peaks)[len(peaks) // 2]


def _measure_here(name: str) -> int:
    from lms_magic.lms.devices import split_cpu

    split_cpu(2)  # two logical CPUs, one inter-op thread, as in the tests
    if ":" in name:
        model, (x, y) = application(*spec_of(name))
        return plain_step_peak(model, x, y, spec_of(name)[2])
    from tests import models

    build, (x, y) = {"reference cnn": (models.reference_cnn_small, models.images(64, 32)),
                     "residual": (models.residual_bn_dropout, models.images(64, 32)),
                     "subclassed": (models.custom_step, models.images(64, 32))}[name]
    return plain_step_peak(build(), x, y, 32)


def plain_step_peak(model, x, y, batch_size: int) -> int:
    """TensorFlow's allocator peak of one plain train step of ``model`` on ``/CPU:0`` over what was allocated
    before it: the median of 3 steps, after a fit and one more step have warmed it up."""
    import tensorflow as tf

    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False)
    batches = iter(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).repeat())
    model.train_function(batches)
    peaks = []
    for _ in range(3):
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        model.train_function(batches)
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - before)
    return sorted(peaks)[1]


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # every tensor counted, as simulate_accelerator() sets
    print(json.dumps({"peak_bytes": _measure_here(sys.argv[1])}))
