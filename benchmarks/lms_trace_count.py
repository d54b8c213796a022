"""How many times a fit traces the train step, plain and with ``LMS()`` (TensorFlow).

keras.applications' MobileNetV2 at 32x32 (no weights), SGD with momentum, with and without an accuracy metric,
16 samples in batches of 8, one epoch; the CPU split in two logical devices (the accelerator and the host), every
tensor size eligible, the default plan (the first step probes, the second traces the plan). Printed per fit: the
train step's traces, the final loss, and what LMS swapped. ``REPO`` picks the checkout whose ``lms_magic`` runs
(to count another commit's).

    REPO=/path/to/checkout python benchmarks/lms_trace_count.py
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    sys.path.insert(0, os.environ.get("REPO", os.path.join(os.path.dirname(__file__), "..")))
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import numpy as np

    import lms_magic

    print(f"lms_magic from {os.path.dirname(lms_magic.__file__)}; TensorFlow {tf.__version__}, Keras {keras.__version__}")
    x = np.random.default_rng(0).random((16, 32, 32, 3), dtype="float32")
    y = np.arange(16) % 10
    for metrics in ([], ["accuracy"]):
        for with_lms in (False, True):
            keras.utils.set_random_seed(0)
            model = keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10)
            model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy", metrics=metrics)
            traces, original = [], model.train_step

            def counted(data, original=original, traces=traces):
                if not tf.executing_eagerly():
                    traces.append(1)
                return original(data)

            object.__setattr__(model, "train_step", counted)
            callback = lms_magic.LMS(device="/CPU:0", host_device="/CPU:1", min_bytes=0, verbose=0)
            history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False,
                                callbacks=[callback] if with_lms else [])
            moved = f", {callback.stats.swapped_tensors} of {callback.stats.candidates} swapped" if with_lms else ""
            print(f"  metrics {metrics}, {'LMS' if with_lms else 'plain'}: {len(traces)} traces, loss "
                  f"{history.history['loss'][-1]!r}{moved}", flush=True)


if __name__ == "__main__":
    main()
