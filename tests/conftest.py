"""Shared fixtures: a real IPython shell with the extension loaded, the simulated accelerator, and the markers.

Markers:
    gpu: needs an NVIDIA GPU (skipped without one).
    release: the full real-model matrix (full-size keras.applications models, both optimizers, every
        fault case); deselected by ``make test``, run by ``make test-release`` before a release.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import weakref
from dataclasses import dataclass

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The same CPU kernels on every machine: TensorFlow turns oneDNN on by itself only on some CPUs
# (not on the AMD EPYC of some CI machines), and keeps CPU allocator statistics, which the
# measured-peak proofs read, only with it on (or with BFC below).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
# The allocator a GPU has (BFC) on the CPU, as simulate_accelerator() sets it: oneDNN's counts no tensor under
# 256 KiB, so the measured peaks the tests hold predictions to would miss them.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")


@dataclass(frozen=True)
class Devices:
    """TensorFlow's CPU split in two: ``accelerator`` plays the GPU, ``host`` the host memory."""

    accelerator: str = "/CPU:0"
    host: str = "/CPU:1"

    @property
    def magic_options(self) -> str:
        """``%%lms_fit`` options that put LMS on them, every tensor size a candidate."""
        return f"--device {self.accelerator} --host-device {self.host} --min-bytes 0"


DEVICES = Devices()


def _gpu_available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:
        return False


def pytest_ignore_collect(collection_path, config):
    """The PyTorch and JAX backends' tests (tests/lms/torch, lms_magic/lms/torch; tests/lms/jax,
    lms_magic/lms/jax) run in their own pytest runs with KERAS_BACKEND=torch or jax (Keras picks one backend a
    process, and the TensorFlow run stays free of PyTorch and JAX). A conftest reaches only its own directory: the
    Makefile's TensorFlow run leaves lms_magic/lms/{torch,jax} out with --ignore."""
    parts = collection_path.parts
    for backend in ("torch", "jax"):
        if backend in parts and "lms" in parts and os.environ.get("KERAS_BACKEND") != backend:
            return True
    return None


def split_tensorflow_cpu() -> None:
    """TensorFlow's CPU as the two logical devices of ``DEVICES``, one op at a time (as on a GPU's compute stream:
    what the liveness replay models), by ``lms_magic``'s own ``split_cpu``. TensorFlow fixes its devices when its
    runtime starts, so this runs once, after collection and before any test. Under pytest-xdist each worker takes
    its share of the cores for an op's threads: every worker's TensorFlow taking them all made small ops wait on
    each other's threads."""
    from lms_magic.lms.devices import split_cpu

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    threads = max(1, (os.cpu_count() or 1) // workers) if workers > 1 else None
    if not split_cpu(2, intra_op_threads=threads):
        raise RuntimeError("TensorFlow started before the tests split its CPU")


def share_the_cores_with_other_workers() -> None:
    """Under pytest-xdist, PyTorch's CPU ops take this worker's share of the cores (as TensorFlow's do above): each
    worker's PyTorch taking every core made the parallel run slower than one process."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and os.environ.get("KERAS_BACKEND") == "torch":
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(config, items):
    share_the_cores_with_other_workers()
    if any("gpu" in item.keywords for item in items) and not _gpu_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (NVML finds none on this machine)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow" and \
            any("devices" in getattr(item, "fixturenames", ()) for item in items):
        split_tensorflow_cpu()


def pytest_collection_finish(session):
    """What collection imported (the frameworks and the test modules: over half a million objects) lives to the
    end of the run: frozen out of Python's cyclic collector, whose every full collection would walk it again."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_terminal_summary(terminalreporter):
    """The machine, at the end of the run where a CI log's tail shows it: the allocator's figures differ by CPU."""
    from lms_magic.memory.machine import cpu_name

    terminalreporter.write_line(f"machine: {cpu_name()}, {os.cpu_count()} cores")


@pytest.fixture(scope="session")
def devices() -> Devices:
    """The simulated accelerator and host (TensorFlow's CPU, split before any test ran)."""
    import tensorflow as tf

    assert len(tf.config.list_logical_devices("CPU")) >= 2, "the CPU was not split at collection"
    return DEVICES


@pytest.fixture
def lms_options(devices):
    """Options that put LMS on the two logical CPUs, printing nothing, swapping every candidate (the tests of
    the swaps themselves; the real-model tests test the default plan)."""
    return {"device": devices.accelerator, "host_device": devices.host, "min_bytes": 0, "verbose": 0,
            "n_tensors": -1}


@pytest.fixture
def costly_copies(monkeypatch):
    """A host link so slow (1 kB/s) that a probe's extra copies outlast a retrace: the plan LMS searches on the
    probe's graphs is traced again (where the copies hide, the probe's swaps stand instead)."""
    from lms_magic.memory import bandwidth

    slow = bandwidth.LinkBandwidth(1e3, 1e3, "a test's slow link")
    monkeypatch.setattr(bandwidth, "host_link_bandwidth", lambda: slow)


@pytest.fixture
def free_copies(monkeypatch):
    """A host link so fast (1 PB/s) that any copies hide under the compute, on any machine: where the plan LMS
    searches on the probe's graphs costs no less, the probe's swaps stand."""
    from lms_magic.memory import bandwidth

    fast = bandwidth.LinkBandwidth(1e15, 1e15, "a test's fast link")
    monkeypatch.setattr(bandwidth, "host_link_bandwidth", lambda: fast)


@pytest.fixture
def accelerator_memory(monkeypatch, devices):
    """Gives the simulated accelerator a capacity (``lms_magic.simulate_accelerator(memory=...)``; the tests'
    CPU is split already, so the call only marks it simulated and sets the memory), put back as it was after the
    test."""
    import lms_magic
    from lms_magic.lms import devices as lms_devices

    for name in ("_simulated", "_simulated_memory_bytes"):
        monkeypatch.setattr(lms_devices, name, getattr(lms_devices, name))
    return lambda memory: lms_magic.simulate_accelerator(memory=memory)


@pytest.fixture
def shell():
    """IPython's test shell with lms_magic loaded and a clean user namespace."""
    from IPython.testing.globalipapp import get_ipython

    import builtins

    if hasattr(builtins, "_"):
        del builtins._  # left by a doctest's last value; while it exists IPython does not set `_`
    ip = get_ipython()
    ip.run_line_magic("load_ext", "lms_magic")
    before = set(ip.user_ns)
    yield ip
    for name in set(ip.user_ns) - before:
        del ip.user_ns[name]
    ip.run_line_magic("unload_ext", "lms_magic")


@pytest.fixture
def no_new_threads():
    """Fails the test if it leaves a thread running."""
    before = set(threading.enumerate())
    yield
    left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not left, f"threads left running: {left}"


_made_iterators: weakref.WeakSet | None = None  # the tf.data iterators made since the last test that left one


def _watch_tf_data_iterators() -> weakref.WeakSet:
    import tensorflow as tf

    made, own_iter = weakref.WeakSet(), tf.data.Dataset.__iter__

    def watched_iter(dataset):
        iterator = own_iter(dataset)
        made.add(iterator)
        return iterator

    tf.data.Dataset.__iter__ = watched_iter
    return made


@pytest.fixture(autouse=True)
def failed_fits_released():
    """Frees now what a fit that raised left behind. Its tf.data iterator stays in a cycle with Keras's suspended
    epoch (which the error's traceback held) until a full collection, and freeing it then waits for its autotuning
    thread's next round, which comes at doubling intervals: the later the collection, the longer the test it runs in
    waits. After a test that left an iterator it made alive, one collection frees it seconds after it was made."""
    global _made_iterators
    yield
    if "tensorflow" not in sys.modules:
        return
    if _made_iterators is None:
        _made_iterators = _watch_tf_data_iterators()
    elif len(_made_iterators):
        gc.collect()
        _made_iterators.clear()


FIT_SETUP = """
import keras, numpy as np
keras.utils.set_random_seed(0)
x = np.random.rand(256, 3).astype("float32")
y = (x.sum(axis=1) > 1.5).astype("float32")
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dropout(0.2), keras.layers.Dense(1, activation="sigmoid")])
model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
def batches(x, y, n):
    while True:
        for start in range(0, len(x) - n + 1, n):
            yield x[start:start + n], y[start:start + n]
"""


@pytest.fixture
def fit_shell(shell, devices):
    """The shell with a small compiled binary classifier ``model``, its data ``x``, ``y`` and a generator
    function ``batches(x, y, n)``, for ``%%lms_fit`` cells."""
    assert shell.run_cell(FIT_SETUP).success
    return shell


@pytest.fixture
def tuning_data(devices):
    """96 images of 32x32 and their labels, for the tuning tests (which tune on the simulated devices)."""
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.normal(size=(96, 32, 32, 3)).astype("float32"), rng.integers(0, 10, 96)


@pytest.fixture
def tuning_session(tuning_data, devices):
    """A TuningSession over the small reference CNN, batch 16, two timed steps a trial, on the split CPU."""
    from lms_magic.tuning.session import TuningSession
    from tests.models import reference_cnn_small

    return TuningSession(reference_cnn_small(), tuning_data, batch_size=16, steps=2, min_bytes=0,
                         device=devices.accelerator, host_device=devices.host)


def computed_once(tmp_path_factory, key: str, compute):
    """``compute()``'s result (JSON), computed once for the whole run: under pytest-xdist the first worker that
    needs it computes it under a file lock and the others read it (the run's shared temporary folder); without
    xdist, computed here."""
    import json

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return compute()
    from filelock import FileLock

    path = tmp_path_factory.getbasetemp().parent / f"{key}.json"  # the run's folder, shared by its workers
    with FileLock(f"{path}.lock"):
        if not path.is_file():
            path.write_text(json.dumps(compute()))
        return json.loads(path.read_text())


def state_of(model):
    """The values of a model's and its optimizer's variables."""
    import numpy as np

    variables = list(model.variables) + list(model.optimizer.variables)
    return [np.array(v.numpy(), copy=True) for v in variables]
