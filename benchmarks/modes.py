"""LMS's modes on keras.applications models, measured on this machine's CPU, on the backend Keras runs.

TensorFlow (``--mode recompute``, ``hybrid``, ``order``): each fit runs in a fresh process (TensorFlow's allocator
counts whole chunks, so a peak depends on what earlier models left in it) on the two logical CPUs the tests use:
/CPU:0 plays the accelerator, /CPU:1 the host, one inter-op thread as on a GPU stream. Measured per fit: the step's
allocator peak on /CPU:0 over what was held before it and the step time (medians of the steps after the first), and
LMS's own figures. Whether a mode changes the math is not asked here (these fits are not made reproducible):
``tests/lms/tensorflow/test_same_math.py`` and ``test_hybrid.py`` compare to the bit, each fit in a fresh process in
reproducible mode.

- ``recompute``: plain against ``LMS(recompute="only", n_tensors=-1)``. A recomputed tensor never leaves /CPU:0, so
  its allocator peak shows the saving as measured.
- ``hybrid``: LMS's default plan (swaps alone) against the same plan made hybrid (``recompute=True``: the plan's
  tensors recomputed on the device where their clones read only what the backward pass holds or swaps back in).
  The figure is the host-link traffic: on a CPU both roles share one memory, so a swap costs no transfer.
- ``order``: every candidate swapped, with the backward pass one layer's gradient at a time (``order_backward``)
  and without. Both logical CPUs share one allocator, so the measured peaks hold the host copies too.

PyTorch (``--mode lean``, ``recompute``; 10 classes, SGD with momentum; a CPU has no allocator to measure a peak:
the peaks are LMS's replay of the first step's saves):

- ``lean``: two LMS fits that offload every saved activation (``n_tensors=-1, min_bytes=0``), with Keras's
  BatchNormalization and with the lean one (PyTorch's fused kernel). Offloading every saved activation counts what
  autograd keeps for the backward pass: its bytes a step (``stats.swapped_bytes_per_step``). Also each step's loss
  against the plain fit's (Keras's variance on PyTorch is E[x^2] - E[x]^2, off by 1e-4 relative where a channel's
  mean is 30 times its spread; PyTorch's kernel computes it stably, so the lean losses move away from Keras's, not
  from the exact ones).
- ``recompute``: ``LMS(recompute="only")`` (cheap layers under ``torch.utils.checkpoint``, nothing offloaded): the
  predicted peak with and without, the tensors recomputed, the losses against plain's, the step time.

    python benchmarks/modes.py --mode recompute [--size 64] [--batch 8] [--steps 5] [MODEL ...]
    python benchmarks/modes.py --mode hybrid DenseNet121 ResNet50
    KERAS_BACKEND=torch python benchmarks/modes.py --mode lean [--size 64] [--batch 8] [--steps 3] [MODEL ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from common import CODE, MODELS, Figure, compiled_application, fit_step_peaks, fresh_runs, header, report

MIB = 2**20
VARIANTS = {"plain": None, "recompute": dict(recompute="only", n_tensors=-1), "swap": {},
            "hybrid": dict(recompute=True), "swap ordered": dict(n_tensors=-1, order_backward=True),
            "swap unordered": dict(n_tensors=-1)}
MODES = {"recompute": ("plain", "recompute"), "hybrid": ("swap", "hybrid"),
         "order": ("plain", "swap ordered", "swap unordered")}
TORCH_MODES = ("lean", "recompute")
STEPS = {"recompute": 5, "hybrid": 3, "order": 4}


def measure(name: str, variant: str, size: int, batch: int, steps: int) -> dict:
    """One fit in this process, as ``variant`` (a key of VARIANTS) says."""
    from lms_magic import LMS

    model, x, y = compiled_application(name, size, batch, steps)
    lms = None if VARIANTS[variant] is None else LMS(device="/CPU:0", host_device="/CPU:1", verbose=0,
                                                     **VARIANTS[variant])
    out = fit_step_peaks(model, x, y, batch, lms)
    if lms is not None:
        stats = lms.stats
        out.update(predicted=stats.device_peak_bytes, predicted_without=stats.device_peak_bytes_without_lms,
                   source=stats.prediction_source, swapped=stats.swapped_tensors,
                   swapped_bytes=stats.swapped_bytes_per_step, recomputed=stats.recomputed_tensors,
                   recomputed_bytes=stats.recomputed_bytes_per_step, candidates=stats.candidates,
                   ordered=stats.ordered_layers, persistent=stats.persistent_bytes)
    return out


def figures_of(mode: str, name: str, runs: dict, shape: str) -> list[Figure]:
    """What each mode's runs of one model print, and the figures they report."""
    plain = runs.get("plain")
    if mode == "recompute":
        lms = runs["recompute"]
        print(f"{name}: measured step peak {plain['step_peak_bytes'] / MIB:.1f} -> {lms['step_peak_bytes'] / MIB:.1f} "
              f"MiB; predicted {lms['predicted_without'] / MIB:.1f} -> {lms['predicted'] / MIB:.1f} MiB; "
              f"{lms['recomputed']} of {lms['candidates']} recomputed; step {plain['step_s'] * 1000:.0f} -> "
              f"{lms['step_s'] * 1000:.0f} ms")
        return [Figure(f'recompute="only", {name} {shape}: the step\'s allocator peak, plain', "median of the steps",
                       round(plain["step_peak_bytes"] / MIB, 1), "MiB"),
                Figure(f'recompute="only", {name} {shape}: the step\'s allocator peak, recompute', "median of the steps",
                       round(lms["step_peak_bytes"] / MIB, 1), "MiB")]
    if mode == "hybrid":
        swap, hybrid = runs["swap"], runs["hybrid"]
        for variant in ("swap", "hybrid"):
            run = runs[variant]
            print(f"{name} {variant}: predicted {run['predicted'] / MIB:.1f} MiB ({run['source']}); host link "
                  f"{2 * run['swapped_bytes'] / MIB:.1f} MiB a step; {run['recomputed']} recomputed")
        if not swap["swapped_bytes"]:
            return []
        return [Figure(f"hybrid plan, {name} {shape}: host-link bytes over swaps alone", "one fit each",
                       round(hybrid["swapped_bytes"] / swap["swapped_bytes"], 3), "x"),
                Figure(f"hybrid plan, {name} {shape}: predicted peak over swaps alone", "one fit each",
                       round(hybrid["predicted"] / swap["predicted"], 3), "x")]
    ordered, unordered = runs["swap ordered"], runs["swap unordered"]
    print(f"{name}: plain {plain['step_peak_bytes'] / MIB:.1f} MiB; ordered {ordered['step_peak_bytes'] / MIB:.1f} MiB "
          f"({ordered['ordered']} layers), unordered {unordered['step_peak_bytes'] / MIB:.1f} MiB")
    return [Figure(f"order_backward, {name} {shape}: the step's allocator peak, every candidate swapped, ordered over "
                   "unordered", "median of the steps", round(ordered["step_peak_bytes"] / unordered["step_peak_bytes"], 3),
                   "x")]


# PyTorch's modes: LMS's replay of each fit's first step, a fit each in this process


def torch_fit(name: str, size: int, batch: int, steps: int, callback=None):
    """A fresh model from seed 5 trained ``steps`` steps: each step's loss, and the median step time after the first."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(5)
    model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10,
                                              classifier_activation=None)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.random((batch * steps, size, size, 3), dtype="float32"), rng.integers(0, 10, batch * steps)
    times, losses = [], []

    class Record(keras.callbacks.Callback):
        def on_train_batch_begin(self, step, logs=None):
            self.started = time.perf_counter()

        def on_train_batch_end(self, step, logs=None):
            times.append(time.perf_counter() - self.started)
            losses.append(float(logs["loss"]))

    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False,
              callbacks=[Record()] + ([callback] if callback else []))
    return losses, statistics.median(times[1:])


def torch_lean(name: str, size: int, batch: int, steps: int) -> list[Figure]:
    from lms_magic import LMS

    plain_losses, _ = torch_fit(name, size, batch, steps)
    saved, gaps = {}, {}
    for lean_ops in (False, True):
        callback = LMS(n_tensors=-1, min_bytes=0, verbose=0, lean_ops=lean_ops)
        losses, step_s = torch_fit(name, size, batch, steps, callback)
        saved[lean_ops] = callback.stats.swapped_bytes_per_step
        gaps[lean_ops] = max(abs(a - b) / abs(b) for a, b in zip(losses, plain_losses))
        print(f"{name} lean_ops={lean_ops}: saved for the backward pass {saved[lean_ops] / MIB:.1f} MiB a step; "
              f"{callback.stats.lean_layers} lean layers; losses apart from plain's by at most {gaps[lean_ops]:.1e} "
              f"(relative); step {step_s * 1000:.0f} ms", flush=True)
    shape = f"{name} {size}x{size}, batch {batch}"
    return [Figure(f"lean_ops on PyTorch, {shape}: bytes saved for the backward pass, lean over Keras's", "one fit each",
                   round(saved[True] / saved[False], 3), "x"),
            Figure(f"lean_ops on PyTorch, {shape}: the lean losses' largest relative gap from plain's", "one fit",
                   float(f"{gaps[True]:.1e}"), "")]


def torch_recompute(name: str, size: int, batch: int, steps: int) -> list[Figure]:
    from lms_magic import LMS

    plain_losses, plain_s = torch_fit(name, size, batch, steps)
    only = LMS(recompute="only", min_bytes=0, verbose=0)
    losses, step_s = torch_fit(name, size, batch, steps, only)
    stats = only.stats
    ratio = stats.device_peak_bytes / stats.device_peak_bytes_without_lms
    print(f"{name}: recompute='only': {stats.recomputed_tensors} saved activations recomputed "
          f"({stats.recomputed_bytes_per_step / MIB:.1f} MiB a step); predicted peak {stats.device_peak_bytes / MIB:.1f} "
          f"MiB against {stats.device_peak_bytes_without_lms / MIB:.1f} MiB without; losses "
          f"{'identical to plain' if losses == plain_losses else 'DIFFERENT'}; step {step_s / plain_s:.2f} of plain's",
          flush=True)
    shape = f"{name} {size}x{size}, batch {batch}"
    return [Figure(f'recompute="only" on PyTorch, {shape}: predicted peak over without', "LMS's replay, one fit",
                   round(ratio, 3), "x"),
            Figure(f'recompute="only" on PyTorch, {shape}: losses identical to plain', "1 yes, 0 no",
                   int(losses == plain_losses), "")]


def main() -> None:
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*")
    parser.add_argument("--mode", choices=sorted({*MODES, *TORCH_MODES}), default="recompute")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if backend == "torch":
        if args.mode not in TORCH_MODES:
            parser.error(f"--mode {args.mode} is TensorFlow's; on PyTorch: {', '.join(TORCH_MODES)}")
        sys.path.insert(0, str(CODE))
        torch_measure = torch_lean if args.mode == "lean" else torch_recompute
        report([figure for name in args.models or ["ResNet50", "DenseNet121"]
                for figure in torch_measure(name, args.size, args.batch, args.steps or 3)])
        return
    if args.mode not in MODES:
        parser.error(f"--mode {args.mode} is PyTorch's (KERAS_BACKEND=torch); on TensorFlow: {', '.join(MODES)}")
    steps = args.steps or STEPS[args.mode]
    if args.one:
        print(json.dumps(measure(*args.one, args.size, args.batch, steps)))
        return
    print(header(args.size, args.batch, steps))
    figures = []
    for name in args.models or list(MODELS):
        runs = fresh_runs(__file__, name, MODES[args.mode], args.size, args.batch, steps)
        figures += figures_of(args.mode, name, runs, f"{args.size}x{args.size}")
    report(figures)


if __name__ == "__main__":
    main()
