"""The devices LMS uses: none without a GPU (and it says so), a simulated accelerator on a CPU
(lms_magic.simulate_accelerator()), and the devices a user names checked against the process's."""

import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

import lms_magic
from lms_magic import LMS
from lms_magic.lms import devices as lms_devices
from lms_magic.lms.callback import LmsNotice
from lms_magic.lms.options import OptionError
from tests import models


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})


def test_it_splits_the_cpu_before_tensorflow_starts_and_says_what_to_do_after():
    done = python("import lms_magic, tensorflow as tf\n"
                  "print(lms_magic.simulate_accelerator(), [d.name for d in tf.config.list_logical_devices('CPU')])\n"
                  "before = tf.config.experimental.get_memory_info('CPU:0')['current']\n"
                  "with tf.device('/CPU:0'):\n    small = tf.zeros([1000])\n"  # 4000 bytes: oneDNN's allocator misses it
                  "print(tf.config.experimental.get_memory_info('CPU:0')['current'] - before >= 4000)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "['/device:CPU:0',", "'/device:CPU:1']", "True"]
    late = python("import lms_magic, tensorflow as tf\ntf.constant(1.0) + 1\nlms_magic.simulate_accelerator()")
    assert late.returncode != 0
    assert "must run before TensorFlow initialises" in late.stderr and "restart the kernel" in late.stderr


def test_after_it_the_default_lms_swaps_to_the_simulated_host(monkeypatch, devices):
    monkeypatch.setattr(lms_devices, "_simulated", True)
    assert lms_magic.simulate_accelerator() is True  # the tests' process is split already: a second call is fine
    model = models.reference_cnn()
    x, y = models.images(32, 64)
    callback = LMS(verbose=0)  # no device, no host: a user's call
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[callback])
    stats = callback.stats
    assert stats.active and stats.swapped_tensors > 0
    assert stats.device_peak_bytes < stats.device_peak_bytes_without_lms
    assert callback.summary().startswith("LMS: swapping") and "to /CPU:1" in callback.summary()


def test_without_it_lms_on_a_cpu_does_nothing_and_says_so_once(monkeypatch):
    monkeypatch.setattr(lms_devices, "_simulated", False)
    model = models.reference_cnn_small()
    x, y = models.images(8, 32)
    first, second = LMS(), LMS()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("default")  # Python's own: a warning once per place
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[first])
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[second])
    notices = [str(w.message) for w in said if issubclass(w.category, LmsNotice)]
    assert len(notices) == 1 and "no GPU found, so nothing is swapped" in notices[0]
    assert "simulate_accelerator()" in notices[0]
    for callback in (first, second):
        assert not callback.stats.active and callback.stats.reason == "no GPU"
        assert callback.summary() == "LMS: inactive (no GPU)"
    assert np.isfinite(model.get_weights()[0]).all() and keras.backend.backend() == "tensorflow"


@pytest.mark.parametrize("options, words", [
    ({"device": "/GPU:7"}, "device='/GPU:7': is not a device of this process, which has /CPU:0, /CPU:1"),
    ({"device": "banana"}, "device='banana': is not a device of this process, which has /CPU:0, /CPU:1: pass one"),
    ({"device": "/CPU:0", "host_device": "/CPU:9"}, "host_device='/CPU:9': is not a device"),
])
def test_a_device_this_process_lacks_is_refused_before_training(options, words, devices):
    model = models.residual_bn_dropout()
    weights = [w.copy() for w in model.get_weights()]
    with pytest.raises(OptionError, match=words):
        model.fit(*models.images(16, 32), batch_size=16, verbose=0, callbacks=[LMS(verbose=0, **options)])
    assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
    assert "train_step" not in model.__dict__


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_other_backends_are_told_it_splits_tensorflow(monkeypatch, backend):
    monkeypatch.setenv("KERAS_BACKEND", backend)
    with pytest.raises(ValueError, match="splits TensorFlow's CPU"):
        lms_magic.simulate_accelerator()
