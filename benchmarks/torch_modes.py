"""LMS's modes on Keras's PyTorch backend, on this machine's CPU: ``lean_ops`` and ``recompute="only"``.

For each model (keras.applications, ``--size`` x ``--size``, 10 classes, SGD with momentum, batch ``--batch``,
``--steps`` steps), a plain fit, then:

- ``--mode lean``: two LMS fits that offload every saved activation (``n_tensors=-1, min_bytes=0``), with Keras's
  BatchNormalization and with the lean one (PyTorch's fused kernel). Offloading every saved activation counts what
  autograd keeps for the backward pass: its bytes a step (``stats.swapped_bytes_per_step``). Also each step's loss
  against the plain fit's (Keras's variance on PyTorch is E[x^2] - E[x]^2, off by 1e-4 relative where a channel's
  mean is 30 times its spread; PyTorch's kernel computes it stably, so the lean losses move away from Keras's, not
  from the exact ones).
- ``--mode recompute``: ``LMS(recompute="only")`` (cheap layers under ``torch.utils.checkpoint``, nothing
  offloaded): the predicted peak with and without, the tensors recomputed, the losses against plain's, the step time.

A CPU has no allocator to measure a peak: the peaks are LMS's replay of the first step's saves.

    KERAS_BACKEND=torch python benchmarks/torch_modes.py --mode lean [--size 64] [--batch 8] [--steps 3] [MODEL ...]
    KERAS_BACKEND=torch python benchmarks/torch_modes.py --mode recompute ResNet50 DenseNet121 MobileNetV2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ["KERAS_BACKEND"] = "torch"

from common import CODE, Figure, report  # noqa: E402

MIB = 2**20


def fit(name: str, size: int, batch: int, steps: int, callback=None):
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


def lean(name: str, size: int, batch: int, steps: int) -> list[Figure]:
    from lms_magic import LMS

    plain_losses, _ = fit(name, size, batch, steps)
    saved, gaps = {}, {}
    for lean_ops in (False, True):
        callback = LMS(n_tensors=-1, min_bytes=0, verbose=0, lean_ops=lean_ops)
        losses, step_s = fit(name, size, batch, steps, callback)
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


def recompute(name: str, size: int, batch: int, steps: int) -> list[Figure]:
    from lms_magic import LMS

    plain_losses, plain_s = fit(name, size, batch, steps)
    only = LMS(recompute="only", min_bytes=0, verbose=0)
    losses, step_s = fit(name, size, batch, steps, only)
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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=["ResNet50", "DenseNet121"])
    parser.add_argument("--mode", choices=("lean", "recompute"), default="lean")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(CODE))
    measure = lean if args.mode == "lean" else recompute
    report([figure for name in args.models for figure in measure(name, args.size, args.batch, args.steps)])


if __name__ == "__main__":
    main()
