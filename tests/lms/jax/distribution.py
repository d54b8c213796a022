"""The fits under keras.distribution on JAX that ``test_distribution.py`` (and ``benchmarks/lms_devices.py``)
read: one fresh process with N host devices (``XLA_FLAGS=--xla_force_host_platform_device_count=N``, set before
JAX starts)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # where the fresh processes import tests.* from

SCRIPT = textwrap.dedent("""
    import json, os, sys
    count = int(sys.argv[1])
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={count}"
    import keras, numpy as np
    from lms_magic import LMS
    from lms_magic.lms.persistent import persistent_bytes

    def cnn():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((24, 24, 3))]
                                 + [keras.layers.Conv2D(8, 3, padding="same", activation="relu") for _ in range(4)]
                                 + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    from tests.lms.jax.meshes import mlp

    def compare(build, x, y):
        fitted = {}
        for name, callbacks in (("plain", []), ("lms", [LMS(n_tensors=-1, min_bytes=0, verbose=0)])):
            model = build()
            history = model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
            fitted[name] = (model, history.history["loss"], callbacks)
        (plain, plain_loss, _), (lms, lms_loss, (callback,)) = fitted["plain"], fitted["lms"]
        stats = callback.stats
        return {"same_loss": plain_loss == lms_loss,
                "same_weights": all(np.array_equal(a, b) for a, b in zip(plain.get_weights(), lms.get_weights())),
                "devices": stats.devices, "moved_bytes": stats.swapped_bytes_per_step,
                "peak": stats.device_peak_bytes, "peak_without": stats.device_peak_bytes_without_lms,
                "persistent": stats.persistent_bytes, "all_persistent": persistent_bytes(lms),
                "summary": callback.summary()}

    rng = np.random.default_rng(0)
    images, labels = rng.random((32, 24, 24, 3), dtype="float32"), rng.integers(0, 10, 32)
    devices = keras.distribution.list_devices("cpu")
    found = {"one_device": compare(cnn, images, labels)}  # no distribution set yet: JAX's first device
    for each in (2, 4):
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices[:each]))
        found[f"data_parallel_{each}"] = compare(cnn, images, labels)
    if count == 4:
        mesh = keras.distribution.DeviceMesh((2, 2), ["batch", "model"], devices)
        layout = keras.distribution.LayoutMap(mesh)
        layout[".*kernel"] = (None, "model")
        layout[".*bias"] = ("model",)
        keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch"))
        found["model_parallel"] = compare(mlp, rng.random((32, 64), dtype="float32"), labels)
    print(json.dumps(found))
""")


def run(count: int) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(count)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT,
                          env={**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
