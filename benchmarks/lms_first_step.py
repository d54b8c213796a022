"""What the first steps of an LMS fit cost where something moves, and what a second fit of the same model costs.

The CPU split in two logical devices (the accelerator and the host), keras.applications models, SGD with momentum,
the default plan (every tensor size eligible), fits of ``--steps`` steps (two by default): the first LMS step probes (every eligible
tensor swapped), the graphs TensorFlow executed are replayed to plan, and the second step traces the plan. Each
fit is timed whole, on a fresh model from the same seed; then the same model is fit again (the plan remembered).

Printed per model: a plain 1-step fit (its first step: trace and run), plain and LMS fits of ``--steps`` steps,
LMS's extra time over plain, that extra over the plain first step (the goal: <= 1), the median of the later steps
(plain and LMS: what the swaps that stand cost a step), and a second fit of the same model, plain and with LMS (the
plan reused), and its extra.

    python benchmarks/lms_first_step.py --models ResNet50 DenseNet121 --size 64 --batch 8 --repeats 2
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from common import CODE, report, runs_figure  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ResNet50", "DenseNet121", "MobileNetV2", "EfficientNetB0"])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, str(CODE))
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    import numpy as np

    from lms_magic import LMS

    rng = np.random.default_rng(0)
    x = rng.random((args.steps * args.batch, args.size, args.size, 3), dtype="float32")
    y = rng.integers(0, 10, args.steps * args.batch)

    def model_of(name):
        keras.utils.set_random_seed(5)
        model = getattr(keras.applications, name)(weights=None, input_shape=(args.size, args.size, 3), classes=10,
                                                  classifier_activation=None)
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    class StepTimes(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times = getattr(self, "times", []) + [time.perf_counter() - self.started]

        def later_median(self):
            later = sorted(getattr(self, "times", [])[1:])
            return later[len(later) // 2] if later else float("nan")

    def timed(model, steps, with_lms, step_times=None):
        callback = LMS(device="/CPU:0", host_device="/CPU:1", min_bytes=0, verbose=0) if with_lms else None
        started = time.perf_counter()
        model.fit(x[:steps * args.batch], y[:steps * args.batch], batch_size=args.batch, epochs=1, verbose=0,
                  shuffle=False, callbacks=[c for c in (callback, step_times) if c is not None])
        return time.perf_counter() - started, callback

    print(f"TensorFlow {tf.__version__}, {args.size}x{args.size}, batch {args.batch}, SGD with momentum, the default "
          f"plan, CPU split in two, fits of {args.steps} steps; seconds")
    firsts, agains = [], []  # LMS's extra time over a plain first step: a first fit, a second fit of the same model
    for name in args.models:
        timed(model_of(name), 1, False)  # warm-up: TensorFlow's own first-use costs
        for repeat in range(args.repeats):
            first, _ = timed(model_of(name), 1, False)
            plain_model, lms_model = model_of(name), model_of(name)
            plain_steps, lms_steps = StepTimes(), StepTimes()
            plain, _ = timed(plain_model, args.steps, False, plain_steps)
            lms, callback = timed(lms_model, args.steps, True, lms_steps)
            again_plain, _ = timed(plain_model, args.steps, False)
            again_lms, again = timed(lms_model, args.steps, True)
            stats, reused = callback.stats, again.stats
            extra, again_extra = lms - plain, again_lms - again_plain
            firsts.append(extra / first)
            agains.append(again_extra / first)
            print(f"  {name} #{repeat + 1}: plain first step {first:.1f}; {args.steps} steps plain {plain:.1f}, LMS {lms:.1f} "
                  f"({stats.swapped_tensors} of {stats.candidates} swapped, rewrite {stats.rewrite_s or 0:.1f}, "
                  f"planning {stats.planning_s or 0:.1f}): extra {extra:.1f} = {extra / first:.2f}x the first step; "
                  f"later steps' median: plain {plain_steps.later_median():.3f}, LMS {lms_steps.later_median():.3f}; "
                  f"again: plain {again_plain:.1f}, LMS {again_lms:.1f} "
                  f"({'plan reused' if any('earlier fit' in n for n in reused.notes) else 'planned again'}): "
                  f"extra {again_extra:.1f} = {again_extra / first:.2f}x", flush=True)
    models = ", ".join(args.models)
    report([runs_figure(f"a first fit with LMS where something moves ({models}, {args.size}x{args.size}, "
                        f"{args.steps} steps): extra time over a plain first step", firsts, "x", goal="<= 1"),
            runs_figure(f"a second fit of the same model with LMS (the plan reused; {models}): extra time over a plain "
                        "first step", agains, "x")])


if __name__ == "__main__":
    main()
