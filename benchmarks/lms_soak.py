"""A long-running kernel after LMS: memory growth of plain work, with and without an earlier LMS fit.

Each side runs in a fresh process on two logical CPUs (LMS's accelerator and
host roles). The "lms" side trains a small CNN with LMS (swapping), the
"plain" side trains it without; then both run the same loop of plain
``fit``/``predict``/``evaluate`` calls of another small model and report
the growth of the process's resident memory over the loop. Goal: the LMS side
grows no more than 10 MiB above the plain side after 120 calls (before the
fix: +108 MiB against +9 MiB, from TensorFlow's run metadata that kept
collecting every function's graphs).

    python benchmarks/lms_soak.py [--calls 120] [--pairs 3]
    python benchmarks/lms_soak.py --side lms --calls 120      # one side, prints JSON
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/lms/tensorflow/test_soak.py loads this file by path
from common import ROOT, child_env, report, runs_figure  # noqa: E402


def run_side(side: str, calls: int) -> dict:
    """Runs one side in this process; returns its RSS growth over the loop, in bytes."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import gc

    import psutil
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import numpy as np

    from lms_magic import LMS

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    images, labels = rng.random((64, 32, 32, 3), dtype="float32"), rng.integers(0, 10, 64)
    cnn = keras.Sequential([keras.Input((32, 32, 3))] +
                           [keras.layers.Conv2D(16, 3, padding="same", activation="relu") for _ in range(4)] +
                           [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    cnn.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [LMS(device="/CPU:0", host_device="/CPU:1", min_bytes=0, verbose=0)] if side == "lms" else []
    cnn.fit(images, labels, batch_size=16, epochs=1, verbose=0, callbacks=callbacks)
    swapped = callbacks[0].stats["swapped_tensors"] if callbacks else 0

    x, y = rng.random((256, 32), dtype="float32"), rng.random((256, 1), dtype="float32")

    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    model.compile("adam", "mse")

    def plain_call(index: int) -> None:
        [model.fit, model.predict, model.evaluate][index % 3](x, *(() if index % 3 == 1 else (y,)), verbose=0)

    for index in range(6):  # warm-up: Keras's and TensorFlow's one-time caches
        plain_call(index)
    gc.collect()
    start = psutil.Process().memory_info().rss
    for index in range(calls):
        plain_call(index)
    gc.collect()
    growth = psutil.Process().memory_info().rss - start
    return {"side": side, "calls": calls, "swapped_tensors": swapped, "rss_growth_bytes": growth}


def measure(side: str, calls: int) -> dict:
    """Runs one side in a fresh interpreter."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--side", side, "--calls", str(calls)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, env=child_env())
    if done.returncode != 0:
        raise RuntimeError(f"the {side} side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("lms", "plain"))
    parser.add_argument("--calls", type=int, default=120)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(run_side(args.side, args.calls)))
        return
    excess = []
    for _ in range(args.pairs):
        lms, plain = measure("lms", args.calls), measure("plain", args.calls)
        excess.append((lms["rss_growth_bytes"] - plain["rss_growth_bytes"]) / 2**20)
        print(f"after an LMS fit ({lms['swapped_tensors']} tensors swapped): +{lms['rss_growth_bytes'] / 2**20:.1f} "
              f"MiB over {args.calls} plain calls; without: +{plain['rss_growth_bytes'] / 2**20:.1f} MiB")
    print(f"LMS side minus plain side: median {statistics.median(excess):+.1f} MiB, range "
          f"{min(excess):+.1f} to {max(excess):+.1f} over {args.pairs} pairs (goal <= +10 MiB)")
    report([runs_figure(f"resident memory growth over {args.calls} plain fit/predict/evaluate calls after an LMS fit, "
                        "less without one", excess, "MiB", goal="<= +10 MiB")])


if __name__ == "__main__":
    main()
