"""lean_ops=True on Keras's PyTorch backend (BatchNormalization in PyTorch's fused kernel), on this machine's CPU.

For each model (keras.applications, --size x --size, 10 classes, SGD with momentum, batch --batch,
--steps steps): a plain fit, and two LMS fits that offload every saved activation (``n_tensors=-1,
min_bytes=0``), with Keras's BatchNormalization and with the lean one. Offloading every saved
activation counts what autograd keeps for the backward pass: its bytes a step
(``stats.swapped_bytes_per_step``) and the replay of the first step's saves without LMS
(``stats.device_peak_bytes_without_lms``: weights, optimizer state and the saved activations at
their peak; a CPU has no allocator to measure). Also each step's loss against the plain fit's (Keras's
variance on PyTorch is E[x^2] - E[x]^2, off by 1e-4 relative where a channel's mean is 30 times its
spread; PyTorch's kernel computes it stably, so the lean losses move away from Keras's, not from the
exact ones) and the median step time.

    KERAS_BACKEND=torch python benchmarks/lms_lean_torch.py [--size 64] [--batch 8] [--steps 3] [MODEL ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import numpy as np  # noqa: E402

from lms_magic import LMS  # noqa: E402

MIB = 2**20


def fit(name: str, size: int, batch: int, steps: int, callback=None, *more_callbacks):
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
              callbacks=[Record()] + ([callback] if callback else []) + list(more_callbacks))
    return losses, statistics.median(times[1:])


def arguments(models: list[str]):
    """The command line (models, --size, --batch, --steps), said in the output's first line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*", default=models)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.size}x{args.size}, batch {args.batch}, {args.steps} steps, SGD with momentum, Keras "
          f"{keras.__version__} on PyTorch, this machine's CPU")
    return args


def main():
    args = arguments(["ResNet50", "DenseNet121"])
    import torch

    generator = torch.Generator().manual_seed(0)
    for mean in (3, 30, 300):  # a channel's variance as Keras and as PyTorch's kernel compute it, against float64
        x = torch.randn(8, 2, 2, 64, generator=generator) * 2 + mean
        exact = x.double().var(dim=(0, 1, 2), unbiased=False)
        keras_variance = keras.ops.moments(x, [0, 1, 2])[1].double()
        torch_variance = torch.var_mean(x, dim=(0, 1, 2), unbiased=False)[0].double()
        print(f"variance of 64 channels of 32 values, mean {mean}, std 2: largest relative error Keras "
              f"{float(((keras_variance - exact).abs() / exact).max()):.1e}, PyTorch's "
              f"{float(((torch_variance - exact).abs() / exact).max()):.1e}")
    for name in args.models:
        plain_losses, plain_s = fit(name, args.size, args.batch, args.steps)
        results = {}
        for label, lean in (("Keras's BatchNormalization", False), ("lean_ops", True)):
            callback = LMS(n_tensors=-1, min_bytes=0, verbose=0, lean_ops=lean)
            losses, step_s = fit(name, args.size, args.batch, args.steps, callback)
            results[label] = (callback.stats, losses, step_s)
        print(f"{name}: plain step {plain_s * 1000:.0f} ms")
        for label, (stats, losses, step_s) in results.items():
            gaps = [abs(a - b) / abs(b) for a, b in zip(losses, plain_losses)]
            differ = "identical to plain" if losses == plain_losses else \
                "apart from plain's by " + ", ".join(f"{gap:.1e}" for gap in gaps) + " (relative, step by step)"
            print(f"  {label}: saved for the backward pass {stats.swapped_bytes_per_step / MIB:.1f} MiB a step "
                  f"({stats.candidates} tensors); predicted peak without offloading "
                  f"{stats.device_peak_bytes_without_lms / MIB:.1f} MiB; {stats.lean_layers} lean layers; losses "
                  f"{differ}; "
                  f"step {step_s * 1000:.0f} ms (offloading every saved activation)")


if __name__ == "__main__":
    main()
