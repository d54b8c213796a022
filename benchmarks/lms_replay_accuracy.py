"""How close LMS's predicted device peak is to TensorFlow's measured one, on keras.applications models.

For each model (at --size x --size, 10 classes, SGD with momentum, batch --batch), --runs times, each
figure in a fresh process on two logical CPUs (`/CPU:0` the simulated accelerator, one inter-op thread
as on a GPU stream, oneDNN on, as in the tests):
  - predicted: the replay of the graphs TensorFlow executed in an LMS fit's first step
    (`stats.device_peak_bytes_without_lms` less the weights and optimizer state: the step's own bytes);
  - measured: TensorFlow's allocator peak of a plain train step over what was allocated before it
    (`get_memory_info`, the median of 3 steps after a warm-up), in another fresh process.
Prints one line per run and the ratio predicted / measured. A fresh process, because TensorFlow's
allocator counts a request served from a larger free chunk at that chunk's size (tests/lms/tensorflow/
fresh_peak.py).

    python benchmarks/lms_replay_accuracy.py --models ResNet50 --size 128 --batch 16 --runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

MIB = 2**20
ROOT = Path(__file__).resolve().parents[1]


def _model(name: str, size: int):
    import keras

    keras.utils.set_random_seed(5)
    model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10,
                                              classifier_activation=None)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data(size: int, batch: int, steps: int):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.random((batch * steps, size, size, 3), dtype="float32"), rng.integers(0, 10, batch * steps)


def _in_this_process(what: str, name: str, size: int, batch: int) -> dict:
    from tests.conftest import _split_tensorflow_cpu

    _split_tensorflow_cpu()
    model = _model(name, size)
    if what == "predicted":
        from lms_magic import LMS

        callback = LMS(device="/CPU:0", host_device="/CPU:1", n_tensors=-1, min_bytes=0, verbose=0)
        model.fit(*_data(size, batch, 1), batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
        stats = callback.stats
        return {"bytes": stats.device_peak_bytes_without_lms - stats.persistent_bytes,
                "source": stats.prediction_source}
    from tests.lms.tensorflow.fresh_peak import plain_step_peak

    return {"bytes": plain_step_peak(model, *_data(size, batch, 2), batch), "source": "TensorFlow's allocator"}


def fresh(what: str, name: str, size: int, batch: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "1"}
    done = subprocess.run([sys.executable, __file__, "--child", what, "--models", name, "--size", str(size),
                           "--batch", str(batch)], cwd=ROOT, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="ResNet50")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--child", choices=("predicted", "measured"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_in_this_process(args.child, args.models, args.size, args.batch)))
        return
    for name in args.models.split(","):
        for run in range(args.runs):
            predicted, measured = (fresh(what, name, args.size, args.batch) for what in ("predicted", "measured"))
            print(f"{name} {args.size}x{args.size} batch {args.batch}, run {run + 1}: predicted "
                  f"{predicted['bytes'] / MIB:.1f} MiB ({predicted['source']}), measured {measured['bytes'] / MIB:.1f} "
                  f"MiB: {predicted['bytes'] / measured['bytes']:.2f}", flush=True)


if __name__ == "__main__":
    main()
