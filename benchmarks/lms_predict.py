"""LMS on ResNet-50 (224x224), predicted on this machine (no GPU needed).

Prints:
  - the time to find and plan the swaps of the traced training step (goal < 5 s),
    and the time of the whole rewrite inside a real fit (batch 2, one step);
  - the predicted device peak at batch 64 with and without LMS;
  - the largest batch whose predicted peak fits 16 GiB, with and without LMS.
Predictions come from the liveness replay of the traced step (the same replay
that LMS reports; on a real fit it also replays the executed partition graphs).
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from lms_magic import LMS  # noqa: E402
from lms_magic.lms.tensorflow.probe import largest_batch, predict_step  # noqa: E402

GIB = 2**30


def resnet50():
    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy())
    return model


def rewrite_time_in_fit():
    model = resnet50()
    x, y = np.zeros((2, 224, 224, 3), "float32"), np.zeros((2,), "int64")
    callback = LMS(device="/CPU:0", n_tensors=-1, min_bytes=0, verbose=0)  # every candidate: the rewrite's cost
    started = time.perf_counter()
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[callback])
    return callback.stats, time.perf_counter() - started


def main():
    model = resnet50()
    sample = (np.zeros((1, 224, 224, 3), "float32"), np.zeros((1,), "int64"))
    prediction = predict_step(model, sample, 64)
    print(f"ResNet-50 training step traced in {prediction.trace_s:.2f} s; candidates found and swaps planned "
          f"in {prediction.plan_s:.2f} s (goal < 5 s)")
    stats, fit_s = rewrite_time_in_fit()
    print(f"inside fit (batch 2, 1 step): rewrite {stats['rewrite_s']:.2f} s of {fit_s:.1f} s total "
          f"(tracing and the step included); {stats['swapped_tensors']} swaps inserted")
    print(f"batch 64: predicted device peak {prediction.peak_bytes_without_lms / GIB:.2f} GiB without LMS, "
          f"{prediction.peak_bytes_with_lms / GIB:.2f} GiB with LMS ({prediction.swapped_tensors} tensors, "
          f"{prediction.swapped_bytes_per_step / GIB:.2f} GiB swapped out per step)")
    for with_lms in (False, True):
        started = time.perf_counter()
        batch = largest_batch(model, sample, 16 * GIB, with_lms=with_lms)
        print(f"largest batch within 16 GiB by prediction, {'with' if with_lms else 'without'} LMS: {batch} "
              f"({time.perf_counter() - started:.0f} s to search)")


if __name__ == "__main__":
    main()
