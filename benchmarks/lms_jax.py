"""LMS on Keras's JAX backend, on this machine's CPU: the tests' models (tests/lms/jax) and a keras.applications one.

For each model: a plain fit and LMS fits (every layer output offloaded, the default plan, and
``recompute="only"`` every layer output), two epochs of 64 images in batches of 16: the predicted device
peak with and without LMS (the jaxpr replay, ``stats.prediction_source``), what moved, and the largest
relative difference of the losses from the plain fit's. JAX on a CPU runs the offload (its memory kinds
are ``device``, ``pinned_host``, ``unpinned_host``) but no allocator measures it here.

    KERAS_BACKEND=jax python benchmarks/lms_jax.py
"""

from __future__ import annotations

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"

from common import CODE, Figure, report  # noqa: E402

sys.path.insert(0, str(CODE))

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from lms_magic import LMS  # noqa: E402
from tests.models import small_transformer as transformer  # noqa: E402
from tests.models import small_cnn as cnn, small_images as images, small_residual_bn_dropout as residual_bn_dropout, train# noqa: E402

MIB = 2**20


def mobilenet_v2():
    keras.utils.set_random_seed(5)
    model = keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10,
                                           classifier_activation=None)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main():
    print(f"Keras {keras.__version__}, JAX {jax.__version__} on {jax.devices()[0].platform}; memories "
          f"{[m.kind for m in jax.devices()[0].addressable_memories()]}")
    figures = []
    for build, size in ((cnn, 16), (residual_bn_dropout, 16), (transformer, 16), (mobilenet_v2, 32)):
        data = images(size=size)
        _, plain = train(build, data)
        print(f"{build.__name__} ({size}x{size}, batch 16):")
        for label, options in (("every output offloaded", dict(n_tensors=-1)), ("default plan", {}),
                               ("recompute='only', every output", dict(n_tensors=-1, recompute="only"))):
            callback = LMS(min_bytes=0, verbose=0, **options)
            _, history = train(build, data, callback)
            stats = callback.stats
            gap = float(np.max(np.abs(np.array(history["loss"]) - plain["loss"]) / np.abs(plain["loss"])))
            moved = stats.recomputed_tensors or stats.swapped_tensors
            print(f"  {label}: {moved} of {stats.candidates} layer outputs "
                  f"({(stats.recomputed_bytes_per_step or stats.swapped_bytes_per_step) / MIB:.2f} MiB); predicted "
                  f"peak {stats.device_peak_bytes / MIB:.2f} MiB against {stats.device_peak_bytes_without_lms / MIB:.2f}"
                  f" MiB without ({stats.device_peak_bytes / stats.device_peak_bytes_without_lms - 1:+.1%}); losses "
                  f"{'identical' if history['loss'] == plain['loss'] else f'{gap:.1e} apart (relative, largest)'}")
            what = f"JAX, {build.__name__} {size}x{size} batch 16, {label}"
            figures += [Figure(f"{what}: predicted peak over without LMS", "one fit",
                               round(stats.device_peak_bytes / stats.device_peak_bytes_without_lms, 3), "x"),
                        Figure(f"{what}: largest relative gap of the losses from plain's", "one fit", float(f"{gap:.1e}"),
                               "")]
    report(figures)


if __name__ == "__main__":
    main()
