"""LMS's default plan on keras.applications models, predicted on this machine (no GPU, no training).

For each model at --size x --size (default 224) with SGD and momentum, from the
liveness replay of the traced train step (the plan LMS makes before the first
step; `LMS` then checks it on the executed graphs):
  - the predicted device peak at --batch (default 32) without LMS, with the
    default plan, and with every candidate swapped (TFLMS's default);
  - the tensors and bytes the default plan moves per step;
  - the planning time (candidates + search + replays; the trace is separate);
  - the plan LMS makes for a device of --memory-gib (default 16; the capacity
    default: nothing moves where the step fits 80% of it, else the fewest bytes
    that fit) and its predicted_step_ratio (core/costs.py) on a device that
    runs the step's matrix FLOPs at --device-tflops with a --link-gbps host link
    (the defaults are the H100 of benchmarks/results/h100-2026-11-23: its link
    measured 54.8 GB/s with pinned copies, and 7.3 TFLOP/s is the rate at which
    ResNet-50 224x224's counted FLOPs, 23.2 GFLOP a sample, ran in its measured
    plain step: 316 samples/s at batch 64 on Keras's PyTorch backend);
  - with --largest, the largest batch whose predicted peak fits --memory-gib
    without LMS and with the default plan, their ratio, and the predicted step
    ratio of the capacity plan at LMS's largest batch.

  - with --lean-ops, all of it with LMS(lean_ops=True)'s BatchNormalization
    gradient (lms/tensorflow/lean.py) in both columns;
  - with --order, LMS's plan with the backward pass one layer's gradient at a
    time where that lowers the predicted peak (LMS(order_backward=True):
    lms/core/order.py).

    python benchmarks/lms_models.py --models ResNet50,DenseNet121 --largest [--lean-ops] [--order]
"""

import argparse
import contextlib
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from lms_magic.lms.core.costs import StepCost  # noqa: E402
from lms_magic.lms.core.plan import Selection  # noqa: E402
from lms_magic.lms.tensorflow.compute import step_flops  # noqa: E402
from lms_magic.lms.tensorflow.lean import LeanOps  # noqa: E402
from lms_magic.lms.tensorflow.predictor import TensorFlowStepPredictor  # noqa: E402
from lms_magic.lms.tensorflow.probe import largest_batch  # noqa: E402

GIB, MIB = 2**30, 2**20
MODELS = "MobileNetV2,ResNet50,DenseNet121,EfficientNetB0,MobileNetV3Small"


def build(name: str, size: int):
    model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=1000,
                                              classifier_activation=None)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--largest", action="store_true", help="also search the largest batch within --memory-gib")
    parser.add_argument("--memory-gib", type=float, default=16)
    parser.add_argument("--device-tflops", type=float, default=7.3)
    parser.add_argument("--link-gbps", type=float, default=54.8)
    parser.add_argument("--lean-ops", action="store_true", help="BatchNormalization's lean gradient (lean_ops=True)")
    parser.add_argument("--order", action="store_true",
                        help="the backward pass one layer's gradient at a time (LMS(order_backward=True))")
    args = parser.parse_args()
    memory = int(args.memory_gib * GIB)

    def capacity_plan(predictor, batch: int) -> str:
        planned = predictor.planned(1, batch, capacity_bytes=memory)
        flops = step_flops(predictor.trace(batch).ops, batch)
        cost = StepCost(flops / (args.device_tflops * 1e12), "assumed", args.link_gbps * 1e9, args.link_gbps * 1e9)
        return (f"at {args.memory_gib:g} GiB: {planned.swapped_bytes_per_step / GIB:.2f} GiB moved, predicted peak "
                f"{planned.peak_bytes / GIB:.2f} GiB, predicted_step_ratio {cost.ratio(planned.swapped_bytes_per_step):.2f} "
                f"({flops / 1e9:.0f} GFLOP a step)")

    def measure(model, name):
        sample = (np.zeros((1, args.size, args.size, 3), "float32"), np.zeros((1,), "int64"))
        predictor = TensorFlowStepPredictor(model, sample, Selection(),  # LMS's defaults: min_bytes 64 KiB
                                  order_backward=args.order)
        predictor.trace(args.batch)
        started = time.perf_counter()
        planned = predictor.predict(None, 1, args.batch)
        planning_s = time.perf_counter() - started
        everything = predictor.predict(-1, 1, args.batch)
        lean = (" lean_ops" if args.lean_ops else "") + (" order_backward" if args.order else "")
        print(f"{name} {args.size}x{args.size} batch {args.batch}{lean}: predicted peak {planned.peak_bytes_without_lms / GIB:.2f}"
              f" GiB without LMS, {planned.peak_bytes / GIB:.2f} GiB with the default plan ({planned.n_tensors} of "
              f"{planned.candidates} tensors, {planned.swapped_bytes_per_step / GIB:.2f} GiB out per step), "
              f"{everything.peak_bytes / GIB:.2f} GiB with all swapped ({everything.swapped_bytes_per_step / GIB:.2f} "
              f"GiB); trace {predictor.trace_s:.1f} s, planning {planning_s:.2f} s", flush=True)
        print(f"  {capacity_plan(predictor, args.batch)}", flush=True)
        if args.largest:
            plain = largest_batch(model, sample, memory, with_lms=False, min_bytes=64 * 1024)
            lms = largest_batch(model, sample, memory, with_lms=True, n_tensors=None, min_bytes=64 * 1024)
            print(f"  largest batch within {args.memory_gib:g} GiB by prediction: {plain} without LMS, {lms} with "
                  f"({lms / max(plain, 1):.1f}x); batch {lms} {capacity_plan(predictor, lms)}", flush=True)

    for name in args.models.split(","):
        model = build(name, args.size)
        with LeanOps(model).applied() if args.lean_ops else contextlib.nullcontext():
            measure(model, name)


if __name__ == "__main__":
    main()
