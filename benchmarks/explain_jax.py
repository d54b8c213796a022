"""explain_fit on Keras's JAX backend, on this machine's CPU: the peak without LMS as XLA compiles it beside the
jaxpr replay's, how long the account takes, and what it names as filling the step.

ResNet-50 224x224 (SGD with momentum) at batch 256 against 16 GiB, as the H200 run's out-of-memory account
(benchmarks/results/gpu-2026-11-26/); KerasHub's GPT-2 from a config (12 layers, 4 heads, hidden 128, sequence
2048, batch 8, AdamW; tests/hub.py). Each in a fresh process; the account printed whole.

    python benchmarks/explain_jax.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import sys, time
import keras, numpy as np
from lms_magic import explain_fit
kind = sys.argv[1]
if kind == "resnet50":
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data, batch = (np.random.rand(8, 224, 224, 3).astype("float32"), np.random.randint(0, 1000, 8)), 256
else:
    from tests.hub import language_model, tokens
    model, data, batch = language_model("gpt2", layers=12, hidden=128, sequence=2048), tokens("gpt2", 16, 2048), 8
started = time.perf_counter()
found = explain_fit(model, data, batch_size=batch, capacity="16GiB")
print(found)
print(f"explain_fit took {time.perf_counter() - started:.1f} s")
"""


def main() -> None:
    for kind in ("resnet50", "gpt2"):
        print(f"--- {kind} ---", flush=True)
        done = subprocess.run([sys.executable, "-c", SCRIPT, kind], capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(ROOT)})
        print(done.stdout.strip() or done.stderr[-3000:], flush=True)


if __name__ == "__main__":
    main()
