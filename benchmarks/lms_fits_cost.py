"""What `LMS()` costs on a model that fits the device: a whole fit's wall time with and without it.

A simulated accelerator with a capacity the step fits many times over (8 GiB by default), keras.applications
models at 96x96, batch 8, 20 steps, SGD with momentum; plain and LMS fits alternate (the order swapped each
pair), each on a fresh model from the same seed, in one process (the first, untimed fit warms TensorFlow up).
Prints each fit's time and the ratio of each pair. Goal: LMS / plain <= 1.05.

    python benchmarks/lms_fits_cost.py --models densenet121 resnet50 --pairs 2
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from common import Figure, report  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["densenet121", "resnet50"])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--memory", default="8GiB")
    args = parser.parse_args()

    import lms_magic

    lms_magic.simulate_accelerator(memory=args.memory)
    import keras
    import numpy as np

    from lms_magic import LMS

    rng = np.random.default_rng(0)
    x = rng.random((args.batch * args.steps, args.size, args.size, 3), dtype="float32")
    y = rng.integers(0, 10, args.batch * args.steps)
    builders = {"densenet121": keras.applications.DenseNet121, "resnet50": keras.applications.ResNet50,
                "mobilenetv2": keras.applications.MobileNetV2, "efficientnetb0": keras.applications.EfficientNetB0}

    def fit(name: str, with_lms: bool) -> tuple[float, object]:
        keras.utils.set_random_seed(1)
        model = builders[name](weights=None, input_shape=(args.size, args.size, 3), classes=10)
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        callbacks = [LMS(verbose=0)] if with_lms else []
        started = time.perf_counter()
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
        return time.perf_counter() - started, (callbacks[0].stats if callbacks else None)

    print(f"{args.size}x{args.size}, batch {args.batch}, {args.steps} steps, simulated accelerator of {args.memory}")
    figures = []
    for name in args.models:
        fit(name, False)  # warm-up, untimed
        ratios = []
        for pair in range(args.pairs):
            order = (False, True) if pair % 2 == 0 else (True, False)
            times = {}
            for with_lms in order:
                times[with_lms], stats = fit(name, with_lms)
                if stats is not None:
                    note = stats.notes[-1] if stats.notes else ""
                    print(f"  {name} LMS: plan {stats.plan_rule}, {stats.swapped_tensors} swapped, "
                          f"{stats.steps} LMS steps; {note[:110]}")
            ratios.append(times[True] / times[False])
            print(f"  {name} pair {pair + 1}: plain {times[False]:.1f} s, LMS {times[True]:.1f} s, "
                  f"ratio {ratios[-1]:.3f}")
        print(f"{name}: LMS / plain {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} pairs")
        figures.append(Figure(f"LMS() on a model that fits ({name} {args.size}x{args.size}, {args.steps} steps, "
                              f"{args.memory}): a whole fit's time over a plain fit's", f"{len(ratios)} alternating "
                              "pairs, the middle", round(sorted(ratios)[len(ratios) // 2], 3), "x", round(min(ratios), 3),
                              round(max(ratios), 3), "min-max of the pairs", "<= 1.05"))
    report(figures)


if __name__ == "__main__":
    main()
