"""LMS on a real GPU with TensorFlow: the largest batch that trains, and throughput.

Run on a machine with an NVIDIA GPU and TensorFlow (not measured by this
project yet; see the README):

    python benchmarks/lms_gpu.py --model resnet50 --memory-gib 16 --steps 10

The GPU is capped at --memory-gib with a logical device memory limit (a stand-in
for a smaller card). For each mode (without LMS, with LMS), the batch size is
doubled until training fails with ResourceExhaustedError, then bisected; the
throughput of the largest batch is measured over --steps steps after warm-up.
Each trial runs in a fresh subprocess, so an OOM cannot poison the next one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

TRIAL = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
args = json.loads(sys.argv[1])
gpu = tf.config.list_physical_devices("GPU")[0]
tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=args["memory_mib"])])
import keras, numpy as np
from lms_magic import LMS
size = 224 if args["model"] == "resnet50" else 128
if args["model"] == "resnet50":
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=1000)
else:
    layers = [keras.Input((size, size, 3))] + [keras.layers.Conv2D(64, 3, padding="same", activation="relu") for _ in range(24)]
    model = keras.Sequential(layers + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1000)])
model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
batch = args["batch"]
x = np.random.rand(batch * 2, size, size, 3).astype("float32"); y = np.random.randint(0, 1000, batch * 2)
callbacks = [LMS(verbose=0)] if args["lms"] else []
try:
    model.fit(x, y, batch_size=batch, epochs=1, steps_per_epoch=2, verbose=0, callbacks=callbacks)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()
    start = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=args["steps"], verbose=0, callbacks=callbacks)
    elapsed = time.perf_counter() - start
    stats = callbacks[0].stats if callbacks else {}
    print(json.dumps({"ok": True, "samples_per_s": batch * args["steps"] / elapsed,
                      "swapped_bytes_per_step": stats.get("swapped_bytes_per_step", 0),
                      "peak_bytes": tf.config.experimental.get_memory_info("GPU:0")["peak"]}))
except tf.errors.ResourceExhaustedError:
    print(json.dumps({"ok": False}))
"""


def trial(model: str, batch: int, lms: bool, memory_gib: float, steps: int) -> dict:
    arguments = json.dumps({"model": model, "batch": batch, "lms": lms, "memory_mib": int(memory_gib * 1024),
                            "steps": steps})
    completed = subprocess.run([sys.executable, "-c", TRIAL, arguments], capture_output=True, text=True)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"ok": False, "error": completed.stderr[-500:]}


def largest(model: str, lms: bool, memory_gib: float, steps: int, start: int, limit: int) -> tuple[int, dict]:
    best, best_result, batch = 0, {}, start
    while batch <= limit:
        result = trial(model, batch, lms, memory_gib, steps)
        if not result["ok"]:
            break
        best, best_result, batch = batch, result, batch * 2
    low, high = best, min(batch, limit + 1)
    while high - low > max(1, low // 8):
        middle = (low + high) // 2
        result = trial(model, middle, lms, memory_gib, steps)
        if result["ok"]:
            low, best_result = middle, result
        else:
            high = middle
    return low, best_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["resnet50", "deep_cnn"], default="resnet50")
    parser.add_argument("--memory-gib", type=float, default=16.0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--start", type=int, default=16)
    parser.add_argument("--limit", type=int, default=2048)
    args = parser.parse_args()
    rows = []
    for lms in (False, True):
        batch, result = largest(args.model, lms, args.memory_gib, args.steps, args.start, args.limit)
        rows.append((lms, batch, result))
    plain_batch = rows[0][1]
    at_plain = trial(args.model, plain_batch, True, args.memory_gib, args.steps) if plain_batch else {}
    print(f"{args.model}, GPU capped at {args.memory_gib} GiB")
    print("mode      largest batch   samples/s   GiB swapped/step")
    for lms, batch, result in rows:
        print(f"{'LMS' if lms else 'no LMS':<9} {batch:>13}   {result.get('samples_per_s', 0):>9.1f}   "
              f"{result.get('swapped_bytes_per_step', 0) / 2**30:>16.2f}")
    if plain_batch and rows[0][2] and at_plain.get("ok"):
        ratio = at_plain["samples_per_s"] / rows[0][2]["samples_per_s"]
        print(f"LMS at the largest no-LMS batch ({plain_batch}): {at_plain['samples_per_s']:.1f} samples/s, "
              f"{ratio:.2f} of no-LMS throughput")
    if plain_batch:
        print(f"batch ratio with/without LMS: {rows[1][1] / plain_batch:.1f}x")


if __name__ == "__main__":
    main()
