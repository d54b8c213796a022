"""explain_fit with Python's collector paused (as it runs) and with it left on, on any backend: seconds, peak RSS.

ResNet-50 224x224 (SGD with momentum) against 16 GiB, without a frontier: the out-of-memory account. Each way in a
fresh process, alternately; the backend from ``KERAS_BACKEND``.

    KERAS_BACKEND=jax python benchmarks/explain_collector.py --batch 256
"""

import argparse
import contextlib
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def account(paused: bool, batch: int) -> None:
    import keras
    import numpy as np

    import lms_magic.lms.explain as explain

    if not paused:
        explain.collector_paused = contextlib.nullcontext
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = (np.random.rand(8, 224, 224, 3).astype("float32"), np.random.randint(0, 1000, 8))
    started = time.perf_counter()
    found = explain.explain_fit(model, data, batch_size=batch, capacity="16GiB")
    print(f"{keras.backend.backend()}, collector {'paused' if paused else 'on'}: explain_fit "
          f"{time.perf_counter() - started:.1f} s, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}"
          f" MiB; largest batches {[mode.largest_batch for mode in found.modes]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--one", choices=("paused", "on"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        sys.path.insert(0, str(ROOT))
        account(args.one == "paused", args.batch)
        return
    for _ in range(args.runs):
        for way in ("paused", "on"):
            done = subprocess.run([sys.executable, __file__, "--one", way, "--batch", str(args.batch)],
                                  capture_output=True, text=True, cwd=ROOT)
            print(done.stdout.strip() or done.stderr[-3000:], flush=True)


if __name__ == "__main__":
    main()
