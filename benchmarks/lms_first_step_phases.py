"""Where the first LMS fit's time goes where something moves: each step, the rewrite of each trace and the
check after each checked step, for one keras.applications model (64x64, batch 8, SGD with momentum, the
default plan, every tensor size eligible, the CPU split in two), beside a plain 1-step fit.

    python benchmarks/lms_first_step_phases.py DenseNet121
    REPO=/path/to/another/checkout python benchmarks/lms_first_step_phases.py DenseNet121  # that code's phases
    R=2 ...  # repeats
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.environ.get("REPO", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")))


def main() -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    import numpy as np

    from lms_magic import LMS
    from lms_magic.lms.tensorflow.backend import TensorFlowBackend

    name = sys.argv[1] if len(sys.argv) > 1 else "DenseNet121"
    print(f"{name}: TensorFlow {tf.__version__}, code from {sys.path[0]}; seconds", flush=True)
    phases: list[tuple[str, float]] = []

    def timed(attribute: str, label: str, owner=TensorFlowBackend) -> None:
        original = getattr(owner, attribute)

        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                phases.append((label, time.perf_counter() - started))

        setattr(owner, attribute, wrapper)

    timed("first_step_done", "check")
    timed("_rewrite", "rewrite")
    timed("on_train_begin", "LMS's train begin", LMS)
    timed("on_train_end", "LMS's train end", LMS)
    timed("on_train_batch_end", "LMS's batch end", LMS)
    timed("_install", "LMS's train function made", LMS)
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    timed("train_step", "Keras's train step traced", TensorFlowTrainer)  # called only while tracing

    class StepTimes(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            phases.append(("step", time.perf_counter() - self.started))

    rng = np.random.default_rng(0)
    x, y = rng.random((16, 64, 64, 3), dtype="float32"), rng.integers(0, 10, 16)

    def model_of():
        keras.utils.set_random_seed(5)
        model = getattr(keras.applications, name)(weights=None, input_shape=(64, 64, 3), classes=10,
                                                  classifier_activation=None)
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    def plain_first_step() -> float:
        started = time.perf_counter()
        model_of().fit(x[:8], y[:8], batch_size=8, verbose=0)
        return time.perf_counter() - started

    print(f"  warm-up plain 1 step {plain_first_step():.1f}", flush=True)
    for _ in range(int(os.environ.get("R", "1"))):
        first = plain_first_step()
        model, callback = model_of(), LMS(device="/CPU:0", host_device="/CPU:1", min_bytes=0, verbose=0)
        phases.clear()
        started = time.perf_counter()
        model.fit(x, y, batch_size=8, verbose=0, shuffle=False, callbacks=[StepTimes(), callback])
        stats = callback.stats
        print(f"  plain 1 step {first:.1f}; LMS 2 steps {time.perf_counter() - started:.1f} "
              f"({stats.swapped_tensors} of {stats.candidates} swapped, planning {stats.planning_s or 0:.1f}): "
              + ", ".join(f"{label} {seconds:.2f}" for label, seconds in phases), flush=True)


if __name__ == "__main__":
    main()
