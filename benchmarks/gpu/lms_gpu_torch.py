"""LMS on a real GPU with Keras's PyTorch backend: largest batch, throughput, copy overlap.

Run on a machine with an NVIDIA GPU, PyTorch and keras (no TensorFlow needed):

    KERAS_BACKEND=torch python benchmarks/lms_gpu_torch.py --memory-gib 16 --steps 10

The GPU is capped at --memory-gib with torch.cuda.set_per_process_memory_fraction
(a stand-in for a 16 GiB card). For each model (ResNet-50 at 224x224, a plain
24-layer CNN at 128x128) and each mode (without LMS, with LMS), the batch size
is doubled until training runs out of memory, then bisected; each trial runs in
a fresh subprocess, so an OOM cannot poison the next. Printed per model: the
largest batch each way and its throughput, LMS's throughput at the largest
no-LMS batch, the pinned copy bandwidth, the bytes moved per step, the ratio of
the LMS step time to max(compute, bytes moved / bandwidth), and %%gpumem's
figures (NVML device use, PyTorch allocator peak) for the largest LMS run.
--device cpu --max-batch 8 runs the whole script on a CPU, as a smoke test.
--batches 128,256 trains those batches once each with LMS, without the search;
--lms-options '{"min_bytes": 0}' (the default) are the LMS keyword arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

TRIAL = r"""
import json, os, sys, time
args = json.loads(sys.argv[1])
os.environ["KERAS_BACKEND"] = "torch"
import torch
if args["device"] == "cuda":
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, args["memory_gib"] * 2**30 / total))
import keras, numpy as np
from lms_magic import LMS, profile_memory
from lms_magic.memory.bandwidth import host_link_bandwidth
size = args["size"]
if args["model"] == "resnet50":
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=1000)
else:
    layers = [keras.Input((size, size, 3))] + [keras.layers.Conv2D(64, 3, padding="same", activation="relu")
                                               for _ in range(24)]
    model = keras.Sequential(layers + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1000)])
model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
batch, steps = args["batch"], args["steps"]
x = np.random.rand(batch, size, size, 3).astype("float32"); y = np.random.randint(0, 1000, batch)
callback = LMS(verbose=0, device=args["device"], **args["lms_options"]) if args["lms"] else None
times = []
class Timer(keras.callbacks.Callback):
    def on_train_batch_begin(self, *a, **k):
        self.t = time.perf_counter()
    def on_train_batch_end(self, *a, **k):
        if args["device"] == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - self.t)
try:
    with profile_memory(interval_s=0.05) as report:
        model.fit(np.tile(x, (steps + 2, 1, 1, 1)), np.tile(y, steps + 2), batch_size=batch, epochs=1, verbose=0,
                  callbacks=[Timer()] + ([callback] if callback else []))
except torch.OutOfMemoryError:
    print(json.dumps({"ok": False})); sys.exit(0)
step_s = sorted(times[2:])[len(times[2:]) // 2]
stats = callback.stats if callback else {}
link = host_link_bandwidth()
gpu = report.gpus[0] if report.gpus else None
print(json.dumps({"ok": True, "step_s": step_s, "samples_per_s": batch / step_s,
                  "swapped_bytes": stats.get("swapped_bytes_per_step", 0), "bandwidth": link.slowest,
                  "bandwidth_source": link.source, "h2d": link.host_to_device, "d2h": link.device_to_host,
                  "nvml_peak_mib": None if gpu is None or gpu.peak_bytes is None else gpu.peak_bytes / 2**20,
                  "allocator_peak_mib": None if not stats.get("device_peak_bytes") else stats["device_peak_bytes"] / 2**20,
                  "reserved_peak_mib": torch.cuda.max_memory_reserved() / 2**20 if args["device"] == "cuda" else None}))
"""


def trial(model: str, batch: int, lms: bool, args) -> dict:
    size = 224 if model == "resnet50" else 128
    if args.device == "cpu":
        size = 32
    payload = json.dumps({"model": model, "batch": batch, "lms": lms, "steps": args.steps, "size": size,
                          "memory_gib": args.memory_gib, "device": args.device,
                          "lms_options": json.loads(args.lms_options)})
    try:
        done = subprocess.run([sys.executable, "-c", TRIAL, payload], capture_output=True, text=True,
                              timeout=args.trial_timeout_s, env={**os.environ, "KERAS_BACKEND": "torch"})
    except subprocess.TimeoutExpired:
        print(f"trial {model} batch {batch} lms={lms} ran past {args.trial_timeout_s} s: counted as not fitting",
              file=sys.stderr, flush=True)
        return {"ok": False, "timed_out": True}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:  # a crash rather than a CUDA OOM (host memory, say): printed, and counted as "does not fit"
        print(f"trial {model} batch {batch} lms={lms} crashed (exit {done.returncode}):\n{done.stderr[-3000:]}",
              file=sys.stderr, flush=True)
        return {"ok": False, "crashed": True}
    result = json.loads(lines[-1])
    print(f"trial {model} batch {batch} lms={lms}: " + (f"{result['samples_per_s']:.1f} samples/s" if result["ok"]
                                                          else "out of memory"), file=sys.stderr, flush=True)
    return result


def largest(model: str, lms: bool, args) -> tuple[int, dict | None]:
    low, best, batch = 0, None, 8
    while batch <= args.max_batch:
        result = trial(model, batch, lms, args)
        if not result["ok"]:
            break
        low, best, batch = batch, result, batch * 2
    high = min(batch, args.max_batch + 1)
    while high - low > max(1, low // 8):  # within 12.5%: each trial is a fresh process
        middle = (low + high) // 2
        result = trial(model, middle, lms, args)
        low, high, best = (middle, high, result) if result["ok"] else (low, middle, best)
    return low, best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory-gib", type=float, default=16)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--max-batch", type=int, default=4096)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--models", default="resnet50,cnn")
    parser.add_argument("--trial-timeout-s", type=float, default=300)
    parser.add_argument("--lms-options", default='{"min_bytes": 0}',
                        help="keyword arguments of LMS, as JSON (default: every saved activation offloaded)")
    parser.add_argument("--batches", default="",
                        help="comma-separated batch sizes: train each once with LMS (no search) and print the result")
    args = parser.parse_args()
    if args.batches:
        for model in args.models.split(","):
            for batch in [int(b) for b in args.batches.split(",")]:
                print(f"{model} batch {batch} lms {args.lms_options}: {json.dumps(trial(model, batch, True, args))}",
                      flush=True)
        return
    for model in args.models.split(","):
        plain_batch, plain = largest(model, False, args)
        lms_batch, lms = largest(model, True, args)
        at_plain = trial(model, plain_batch, True, args) if plain_batch else None
        print(f"\n{model} (cap {args.memory_gib} GiB, {args.device}):")
        print(f"  largest batch without LMS {plain_batch}, with LMS {lms_batch} "
              f"({lms_batch / max(plain_batch, 1):.1f}x; goal >= 5x)")
        if plain and lms:
            print(f"  throughput: without LMS {plain['samples_per_s']:.1f} samples/s at {plain_batch}; "
                  f"with LMS {lms['samples_per_s']:.1f} at {lms_batch}")
        if at_plain and at_plain["ok"] and plain:
            ratio = at_plain["samples_per_s"] / plain["samples_per_s"]
            moved = 2 * at_plain["swapped_bytes"]
            bound = max(plain["step_s"], moved / at_plain["bandwidth"])
            print(f"  at batch {plain_batch}: LMS {at_plain['samples_per_s']:.1f} samples/s = {ratio:.2f} of no-LMS "
                  f"(goal >= 0.70); {moved / 2**30:.2f} GiB moved per step; step {at_plain['step_s'] * 1e3:.1f} ms "
                  f"vs bound {bound * 1e3:.1f} ms: ratio {at_plain['step_s'] / bound:.2f} (goal <= 1.25)")
            print(f"  link: {at_plain['h2d'] / 1e9:.1f} GB/s host-to-device, {at_plain['d2h'] / 1e9:.1f} GB/s "
                  f"device-to-host ({at_plain['bandwidth_source']})")
        if lms:
            print(f"  %%gpumem for the largest LMS run: NVML peak {lms['nvml_peak_mib']} MiB, PyTorch allocator "
                  f"peak {lms['allocator_peak_mib']} MiB (last step), reserved peak {lms['reserved_peak_mib']} MiB (whole fit)")


if __name__ == "__main__":
    main()
