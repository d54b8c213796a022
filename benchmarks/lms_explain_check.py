"""explain_fit's largest batches against what fits confirm, on lms_demo's simulated 64 MiB accelerator.

The lms_demo CNN (8 Conv2D of 16 filters, 128x128 images, SGD) on the two logical CPUs, `/CPU:0` the
accelerator with a capacity of --memory (LMS plans to fill 80% of it). For each way of training (without
LMS, with LMS's default plan):
  - predicted: explain_fit's largest batch;
  - confirmed: the largest batch whose fit, in a fresh process, keeps TensorFlow's allocator on `/CPU:0`
    within the same usable bytes (the weights and optimizer state, plus the last of three steps' peak over
    what was allocated before it), found by checking batches outward from the prediction.
Prints both, and the explanation of the plain step at the demo's batch. On the split CPU both logical
devices share one allocator (a tensor on `/CPU:1` counts in `/CPU:0`'s figures), so the LMS fits' device
memory cannot be measured there: they are measured only with --lms.

    python benchmarks/lms_explain_check.py --memory 64MiB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZE, DEMO_BATCH = 128, 8


def _model():
    import keras

    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((SIZE, SIZE, 3))]
                             + [keras.layers.Conv2D(16, 3, padding="same", activation="relu") for _ in range(8)]
                             + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data(batch: int, steps: int):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.random((batch * steps, SIZE, SIZE, 3), dtype="float32"), rng.integers(0, 10, batch * steps)


def _measure_here(batch: int, memory: str, lms: bool) -> dict:
    """Three steps at ``batch``; the allocator's peak of the last over what was allocated before it."""
    import keras
    import tensorflow as tf

    import lms_magic

    lms_magic.simulate_accelerator(memory=memory)
    model = _model()

    class LastStepPeak(keras.callbacks.Callback):
        def on_train_batch_begin(self, index, logs=None):
            if index == 2:
                tf.config.experimental.reset_memory_stats("CPU:0")
                self.before = tf.config.experimental.get_memory_info("CPU:0")["current"]

        def on_train_batch_end(self, index, logs=None):
            if index == 2:
                self.peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - self.before

    record = LastStepPeak()
    callbacks = [record] + ([lms_magic.LMS(verbose=0)] if lms else [])
    model.fit(*_data(batch, 3), batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    from lms_magic.lms.persistent import persistent_tensors

    persistent = sum(tensor.nbytes for tensor in persistent_tensors(model))
    return {"peak_bytes": persistent + record.peak}


def measured(batch: int, memory: str, lms: bool) -> int:
    # oneDNN on: its CPU allocator keeps the statistics that get_memory_info reads
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "1"}
    done = subprocess.run([sys.executable, __file__, "--child", str(batch), "--memory", memory]
                          + (["--lms"] if lms else []), cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=1200)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"]


def confirmed(predicted: int, usable: int, memory: str, lms: bool) -> tuple[int, dict]:
    """The largest batch whose measured peak is within ``usable``, searched outward from ``predicted``."""
    seen: dict[int, int] = {}

    def fits(batch: int) -> bool:
        if batch not in seen:
            seen[batch] = measured(batch, memory, lms)
            print(f"    {'LMS' if lms else 'plain'} batch {batch}: measured {seen[batch] / 2**20:.1f} MiB "
                  f"({'within' if seen[batch] <= usable else 'above'} {usable / 2**20:.1f})", flush=True)
        return seen[batch] <= usable

    batch = max(predicted, 1)
    if fits(batch):
        while fits(batch + 1):
            batch += 1
        return batch, seen
    while batch > 1 and not fits(batch - 1):
        batch -= 1
    return batch - 1, seen


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory", default="64MiB")
    parser.add_argument("--child", type=int)
    parser.add_argument("--lms", action="store_true", help="also measure the LMS fits (on a GPU machine)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_measure_here(args.child, args.memory, args.lms)))
        return
    import time

    import lms_magic

    lms_magic.simulate_accelerator(memory=args.memory)
    started = time.perf_counter()
    found = lms_magic.explain_fit(_model(), _data(DEMO_BATCH, 1), batch_size=DEMO_BATCH,
                                  modes=("without LMS", "LMS"))
    print(f"explain_fit in {time.perf_counter() - started:.1f} s:\n{found}", flush=True)
    for mode in found.modes:
        if mode.magic and not args.lms:
            print(f"{mode.mode}: predicted largest batch {mode.largest_batch}, not confirmed: the two logical CPUs "
                  "share one allocator, so what LMS moves to /CPU:1 still counts in /CPU:0's figures (--lms "
                  "measures it anyway)", flush=True)
            continue
        largest, _ = confirmed(mode.largest_batch, found.usable_bytes, args.memory, bool(mode.magic))
        print(f"{mode.mode}: predicted largest batch {mode.largest_batch}, confirmed {largest}", flush=True)


if __name__ == "__main__":
    main()
