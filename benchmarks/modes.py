"""LMS's modes on keras.applications models, measured on this machine's CPU (TensorFlow).

Each fit runs in a fresh process (TensorFlow's allocator counts whole chunks, so a peak depends on what earlier
models left in it) on the two logical CPUs the tests use: /CPU:0 plays the accelerator, /CPU:1 the host, one
inter-op thread as on a GPU stream. Measured per fit: the step's allocator peak on /CPU:0 over what was held before
it and the step time (medians of the steps after the first), and LMS's own figures. Whether a mode changes the
math is not asked here (these fits are not made reproducible): ``tests/lms/tensorflow/test_same_math.py`` and
``test_hybrid.py`` compare to the bit, each fit in a fresh process in reproducible mode. ``--mode``:

- ``recompute``: plain against ``LMS(recompute="only", n_tensors=-1)``. A recomputed tensor never leaves /CPU:0, so
  its allocator peak shows the saving as measured.
- ``hybrid``: LMS's default plan (swaps alone) against the same plan made hybrid (``recompute=True``: the plan's
  tensors recomputed on the device where their clones read only what the backward pass holds or swaps back in).
  The figure is the host-link traffic: on a CPU both roles share one memory, so a swap costs no transfer.
- ``order``: every candidate swapped, with the backward pass one layer's gradient at a time (``order_backward``)
  and without. Both logical CPUs share one allocator, so the measured peaks hold the host copies too.

    python benchmarks/modes.py --mode recompute [--size 64] [--batch 8] [--steps 5] [MODEL ...]
    python benchmarks/modes.py --mode hybrid DenseNet121 ResNet50
"""

from __future__ import annotations

import argparse
import json

from common import MODELS, Figure, compiled_application, fit_step_peaks, fresh_runs, header, report

MIB = 2**20
VARIANTS = {"plain": None, "recompute": dict(recompute="only", n_tensors=-1), "swap": {},
            "hybrid": dict(recompute=True), "swap ordered": dict(n_tensors=-1, order_backward=True),
            "swap unordered": dict(n_tensors=-1)}
MODES = {"recompute": ("plain", "recompute"), "hybrid": ("swap", "hybrid"),
         "order": ("plain", "swap ordered", "swap unordered")}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--mode", choices=list(MODES), default="recompute")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps = args.steps or STEPS[args.mode]
    if args.one:
        print(json.dumps(measure(*args.one, args.size, args.batch, steps)))
        return
    print(header(args.size, args.batch, steps))
    figures = []
    for name in args.models:
        runs = fresh_runs(__file__, name, MODES[args.mode], args.size, args.batch, steps)
        figures += figures_of(args.mode, name, runs, f"{args.size}x{args.size}")
    report(figures)


if __name__ == "__main__":
    main()
