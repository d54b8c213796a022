"""Does LMS change the math? keras.applications models trained with TensorFlow made reproducible.

oneDNN off and ``enable_op_determinism()`` on, so two plain fits agree to the bit (checked: the first row of each
model). Then each LMS plan trains the same model from the same seed on the same data; printed: whether the per-step
losses and the final weights equal the first plain fit's, and the largest difference of a weight, relative to the
largest weight. The CPU is split in two logical devices, the accelerator and the host, as in the tests.

    python benchmarks/lms_same_math.py --models MobileNetV3Small ResNet50 --size 64 --batch 8 --steps 3
    python benchmarks/lms_same_math.py --grappler-off constant_folding   # both fits without that Grappler pass
"""

import argparse
import os
import sys
import time

PLANS = {
    "swap every candidate": dict(n_tensors=-1),
    "recompute only": dict(n_tensors=-1, recompute="only"),
    "hybrid": dict(n_tensors=-1, recompute=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["DenseNet121", "ResNet50", "MobileNetV2", "EfficientNetB0",
                                                        "MobileNetV3Small"])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--plans", nargs="+", default=list(PLANS), choices=list(PLANS))
    parser.add_argument("--grappler-off", nargs="*", default=[], help="Grappler passes off for every fit")
    args = parser.parse_args()
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.experimental.enable_op_determinism()
    if args.grappler_off:
        tf.config.optimizer.set_experimental_options({name: False for name in args.grappler_off})
    import keras
    import numpy as np

    from lms_magic import LMS

    rng = np.random.default_rng(0)
    x = rng.random((args.batch * args.steps, args.size, args.size, 3), dtype="float32")
    y = rng.integers(0, 10, args.batch * args.steps)

    def per_step_losses(name, callback=None):
        losses = []

        class Record(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                losses.append(float(logs["loss"]))

        keras.utils.set_random_seed(5)
        model = getattr(keras.applications, name)(weights=None, input_shape=(args.size, args.size, 3), classes=10,
                                                  classifier_activation=None)
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False,
                  callbacks=[Record()] + ([callback] if callback else []))
        return losses, np.concatenate([w.ravel() for w in model.get_weights()])

    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, oneDNN off, op determinism on, "
          f"{args.size}x{args.size}, batch {args.batch}, {args.steps} steps, SGD with momentum"
          + (f", Grappler off: {', '.join(args.grappler_off)}" if args.grappler_off else ""))
    for name in args.models:
        started = time.perf_counter()
        plain_losses, plain_weights = per_step_losses(name)
        scale = float(np.max(np.abs(plain_weights)))

        def row(label, losses, weights, moved=""):
            same = losses == plain_losses and np.array_equal(weights, plain_weights)
            difference = float(np.max(np.abs(weights - plain_weights))) / scale
            first = "first loss identical" if losses[:1] == plain_losses[:1] else "first loss differs"
            print(f"  {name:16} {label:22} {'bit-identical' if same else 'differs':13} "
                  f"max weight difference {difference:.1e} ({first}){moved}", flush=True)

        row("plain again", *per_step_losses(name))
        for plan in args.plans:
            callback = LMS(device="/CPU:0", host_device="/CPU:1", min_bytes=0, verbose=0, **PLANS[plan])
            losses, weights = per_step_losses(name, callback)
            stats = callback.stats
            row(plan, losses, weights, f"; {stats.swapped_tensors} swapped, {stats.recomputed_tensors} recomputed")
        print(f"  ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
