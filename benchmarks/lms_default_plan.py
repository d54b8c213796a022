"""LMS's default plan on real architectures, trained as a user would on a CPU (no GPU needed).

`lms_magic.simulate_accelerator()` splits the CPU into an accelerator and a host, and each model
(keras.applications at --size x --size with 10 classes, and the tests' two-block Transformer; batch
--batch) is fitted for two steps with `LMS(min_bytes=0)` (the default plan, every tensor size eligible)
and once with `LMS(n_tensors=-1, min_bytes=0)` (every candidate swapped), with SGD (momentum) and Adam.
The first step of the default plan is the probe; the plan is made on the graphs TensorFlow executed and
the second step runs it. Prints per model and optimizer: the predicted peaks without -> with the plan and
with every candidate swapped, what the plan moves, the plan search's time, where the peak is; and the step bytes of
the first step with every candidate swapped as LMS measured them (the simulated device's allocator less what the
host held) against the plan's prediction.
--memory gives the simulated accelerator a capacity ("512MiB"): the default then fits it.

    python benchmarks/lms_default_plan.py --models ResNet50,DenseNet121
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from common import CODE, Figure, report  # noqa: E402

MIB = 2**20
MODELS = "MobileNetV2,ResNet50,DenseNet121,EfficientNetB0,MobileNetV3Small,Transformer"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--optimizers", default="sgd,adam")
    parser.add_argument("--memory", default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(CODE))
    import lms_magic

    lms_magic.simulate_accelerator(memory=args.memory)
    import keras
    import numpy as np
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # the retracing warnings of fitting many models in one process

    from lms_magic import LMS
    from lms_magic.lms.core.peak import format_peak
    from tests.lms.tensorflow.real_models import application, transformer

    figures = []
    optimizers = {"sgd": lambda: keras.optimizers.SGD(0.01, momentum=0.9), "adam": lambda: keras.optimizers.Adam(1e-3)}
    for name in args.models.split(","):
        build = transformer() if name == "Transformer" else application(name, args.size)
        for optimizer in args.optimizers.split(","):
            def fit(callback, steps):
                model = build()
                model.compile(optimizers[optimizer](), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
                rng = np.random.default_rng(0)
                shape, n = tuple(model.inputs[0].shape[1:]), args.batch * steps
                x = (rng.integers(0, 1000, (n,) + shape).astype("int32") if model.inputs[0].dtype.startswith("int")
                     else rng.random((n,) + shape, dtype="float32"))
                model.fit(x, rng.integers(0, 10, n), batch_size=args.batch, epochs=1, verbose=0, shuffle=False,
                          callbacks=[callback])
                return callback.stats

            default = fit(LMS(min_bytes=0, verbose=0), 2)
            everything = fit(LMS(n_tensors=-1, min_bytes=0, verbose=0), 1)
            print(f"{name} {optimizer}: {default.device_peak_bytes_without_lms / MIB:.1f} -> "
                  f"{default.device_peak_bytes / MIB:.1f} MiB (every candidate swapped: "
                  f"{everything.device_peak_bytes / MIB:.1f} MiB, {everything.swapped_bytes_per_step / MIB:.1f} MiB moved); "
                  f"plan: {default.plan_rule}, {default.swapped_tensors} of {default.candidates} tensors, "
                  f"{default.swapped_bytes_per_step / MIB:.1f} MiB moved, {default.plans_tried} predictions in "
                  f"{default.planning_s:.1f} s, {default.steps} steps with LMS; predicted step ratio "
                  f"{default.predicted_step_ratio}", flush=True)
            print(f"  {format_peak(default.peak)}", flush=True)
            figures.append(Figure(f"LMS's default plan, {name} {args.size}x{args.size} batch {args.batch} {optimizer}: "
                                  "predicted peak over without LMS", "one fit (the executed graphs' replay)",
                                  round(default.device_peak_bytes / default.device_peak_bytes_without_lms, 3), "x"))
            if everything.measured_step_peak_bytes is not None:  # its first step, measured on the simulated device
                persistent = everything.persistent_bytes
                measured, predicted = (everything.measured_step_peak_bytes - persistent,
                                       everything.predicted_step_peak_bytes - persistent)
                print(f"  every candidate swapped, the first step's own bytes measured ({everything.measured_source}): "
                      f"{measured / MIB:.2f} MiB, predicted {predicted / MIB:.2f} MiB", flush=True)
                figures.append(Figure(f"LMS's first step, every candidate swapped, {name} {args.size}x{args.size} batch "
                                      f"{args.batch} {optimizer}: measured over predicted step bytes",
                                      "one fit (the allocator less what the host held)",
                                      round(measured / max(1, predicted), 3), "x"))
    report(figures)


if __name__ == "__main__":
    main()
