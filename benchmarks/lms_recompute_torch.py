"""recompute on Keras's PyTorch backend (cheap layers under torch.utils.checkpoint), on this machine's CPU.

For each model (keras.applications, --size x --size, 10 classes, SGD with momentum, batch --batch,
--steps steps): a plain fit; ``LMS(recompute="only")`` (nothing offloaded: the predicted peak with and
without, the layers and tensors recomputed, each step's loss against the plain fit's, the median step
time); and the same again with the offloader watching every saved activation from the second step on
(``TorchOffloader.watch_all``, as in the first step), so the bytes autograd keeps for the backward pass
are counted as the steps run (the last step's layers' saves against the first step's, which ran without
recomputes) and the plan's model of them is checked against them. A CPU has no allocator to measure a
peak: the peaks are the replay's.

    KERAS_BACKEND=torch python benchmarks/lms_recompute_torch.py [--size 64] [--batch 8] [--steps 3] [MODEL ...]
"""

from __future__ import annotations

import os
from collections import Counter

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402

from lms_magic import LMS  # noqa: E402
from lms_magic.lms.torch import backend  # noqa: E402
from lms_magic.lms.torch.backend import TorchBackend  # noqa: E402

from lms_lean_torch import MIB, arguments, fit  # noqa: E402


def main():
    args = arguments(["ResNet50", "DenseNet121", "MobileNetV2", "EfficientNetB0"])
    for name in args.models:
        plain_losses, plain_s = fit(name, args.size, args.batch, args.steps)
        only = LMS(recompute="only", min_bytes=0, verbose=0)
        only_losses, only_s = fit(name, args.size, args.batch, args.steps, only)
        engines, choices = [], []
        watched = LMS(recompute="only", min_bytes=0, verbose=0,
                      backend=lambda *made: engines.append(TorchBackend(*made)) or engines[-1])

        class WatchAll(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                engines[-1].offloader.watch_all = batch > 0

        choose = backend.choose_recomputes
        backend.choose_recomputes = lambda *given: choices.append(choose(*given)) or choices[-1]
        try:
            watched_losses, _ = fit(name, args.size, args.batch, args.steps, watched, WatchAll())
        finally:
            backend.choose_recomputes = choose
        offloader = engines[-1].offloader
        probe_bytes = sum(c.nbytes for c in offloader.candidates if c.layer)
        kept = [(c.layer, c.shape, c.nbytes) for c in offloader.last_candidates if c.layer]
        modelled = [(c.layer, c.shape, c.nbytes) for c in choices[-1].saved if c.layer]
        kept_bytes = sum(nbytes for *_, nbytes in kept)
        stats = only.stats
        print(f"{name}: plain step {plain_s * 1000:.0f} ms")
        print(f"  recompute='only': {stats.recomputed_tensors} saved activations recomputed "
              f"({stats.recomputed_bytes_per_step / MIB:.1f} MiB a step), none offloaded; predicted peak "
              f"{stats.device_peak_bytes / MIB:.1f} MiB against {stats.device_peak_bytes_without_lms / MIB:.1f} MiB "
              f"without ({stats.device_peak_bytes / stats.device_peak_bytes_without_lms - 1:+.1%}); losses "
              f"{'identical to plain' if only_losses == plain_losses else f'{only_losses} vs {plain_losses}'}; "
              f"step {only_s * 1000:.0f} ms ({only_s / plain_s:.2f} of plain)")
        extra, missing = Counter(modelled) - Counter(kept), Counter(kept) - Counter(modelled)
        model_says = "matches them" if kept == modelled else (
            f"counts {sum(extra.values())} more ({sum(k[2] * n for k, n in extra.items()) / MIB:.2f} MiB, in "
            f"{sorted({k[0] for k in extra})[:3]}...) and {sum(missing.values())} fewer "
            f"({sum(k[2] * n for k, n in missing.items()) / MIB:.2f} MiB)")
        print(f"  counted (the layers' saves, every one watched): autograd kept {kept_bytes / MIB:.1f} MiB in the "
              f"last step against {probe_bytes / MIB:.1f} MiB in the first, without recomputes "
              f"({kept_bytes / probe_bytes - 1:+.1%}); the plan's model of those saves {model_says} ({len(kept)} "
              f"tensors); losses "
              f"{'identical to plain' if watched_losses == plain_losses else f'{watched_losses} vs {plain_losses}'}")
        print(f"  notes: {' | '.join(stats.notes)}")


if __name__ == "__main__":
    main()
