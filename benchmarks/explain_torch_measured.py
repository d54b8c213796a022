"""explain_fit's peak without LMS on PyTorch, every tensor the step makes counted on this CPU, against the allocator
peaks an H200 measured for the same model and batches (benchmarks/results/gpu-2026-11-26/run2-2-resnet50-torch.log).

ResNet-50 224x224, SGD with momentum. For each batch the H200 trained (plain fits in 16 GiB, one process each):
the predicted peak (weights and optimizer state, and the step's tensors counted after each operator at batch 2 and
3, read off as lines), the H200's ``torch.cuda.max_memory_allocated()``, and their ratio; then the largest batch
explain_fit finds for 16 GiB, beside the measured one.

    KERAS_BACKEND=torch python benchmarks/explain_torch_measured.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ["KERAS_BACKEND"] = "torch"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from lms_magic import explain_fit  # noqa: E402
from lms_magic.lms.torch.predictor import TorchStepPredictor  # noqa: E402

LOG = ROOT / "benchmarks/results/gpu-2026-11-26/run2-2-resnet50-torch.log"
GIB = 2**30


def main() -> None:
    measured = {}
    for line in LOG.read_text().splitlines():
        if line.startswith("fit trial: "):
            trial = json.loads(line[len("fit trial: "):])
            if trial.get("trains"):
                measured[trial["batch"]] = trial["measured_peak_bytes"]
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = (np.random.rand(8, 224, 224, 3).astype("float32"), np.random.randint(0, 1000, 8))
    started = time.perf_counter()
    predictor = TorchStepPredictor(model, (data[0][:2], data[1][:2]))
    print(f"two runs counted in {time.perf_counter() - started:.1f} s")
    print(f"{'batch':>6}{'predicted (GiB)':>17}{'H200 allocator (GiB)':>22}{'ratio':>8}")
    for batch, peak in sorted(measured.items()):
        predicted = predictor.plain_peak_bytes(batch)
        print(f"{batch:>6}{predicted / GIB:>17.2f}{peak / GIB:>22.2f}{predicted / peak:>8.3f}")
    started = time.perf_counter()
    found = explain_fit(model, data, batch_size=256, capacity="16GiB", modes=("without LMS",))
    print(found)
    print(f"explain_fit took {time.perf_counter() - started:.1f} s; the H200 trained 69 and not 72")


if __name__ == "__main__":
    main()
