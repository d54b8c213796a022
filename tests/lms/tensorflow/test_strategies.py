"""LMS under tf.distribute: every replica's device relieved with one plan, as a user on two GPUs (Kaggle's T4 x2)
runs it; here on ``simulate_accelerator(accelerators=2)`` in a fresh process (the tests' own process has its CPU
split in two already), TensorFlow made reproducible (oneDNN off, op determinism) so that a plain fit under the
same strategy is the reference to the bit."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import computed_once
from tests.lms.tensorflow.strategies import mirrored_fits

@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    return computed_once(tmp_path_factory, "mirrored_fits", mirrored_fits)


def replicas_of(swap_outs: list[str]) -> dict[str, set[str]]:
    """Each replica's swapped tensors, by their name in the step (the replica's scope taken off)."""
    by_replica: dict[str, set[str]] = {}
    for name in swap_outs:
        tensor = name.split("/", 1)[1]
        replica, _, rest = tensor.partition("/")
        key, tensor = (replica, rest) if replica.startswith("replica_") else ("replica_0", tensor)
        by_replica.setdefault(key, set()).add(tensor)
    return by_replica


def test_every_replica_swaps_the_same_tensors_to_the_host(mirrored):
    assert mirrored["devices"] == ["/CPU:0", "/CPU:1"]
    by_replica = replicas_of(mirrored["swap_outs"])
    assert set(by_replica) == {"replica_0", "replica_1"}
    assert by_replica["replica_0"] == by_replica["replica_1"]
    assert len(by_replica["replica_0"]) == mirrored["swapped"] == mirrored["candidates"] > 3  # counted per device
    assert "to /CPU:2 on each of 2 devices (/CPU:0, /CPU:1)" in mirrored["summary"]
    assert "predicted per-device peak" in mirrored["summary"]


def test_each_device_peak_is_predicted_lower_with_lms(mirrored):
    for peaks in (mirrored["device_peaks"], mirrored["planned_peaks"]):
        assert set(peaks) == {"/CPU:0", "/CPU:1"}
        for device, figures in peaks.items():
            assert figures["with_lms"] < figures["without_lms"], (device, figures)


def test_the_default_plan_is_made_once_and_run_on_every_replica(mirrored):
    assert mirrored["planned_devices"] == ["/CPU:0", "/CPU:1"]
    by_replica = replicas_of(mirrored["planned_swap_outs"])
    assert by_replica and by_replica.get("replica_0") == by_replica.get("replica_1")


def test_losses_and_weights_are_those_of_a_plain_fit_under_the_strategy_to_the_bit(mirrored):
    assert mirrored["same_loss"] and mirrored["same_weights"], mirrored["loss"]


def test_a_device_given_among_the_strategys_relieves_them_all(mirrored):
    given = mirrored["given"]
    assert given["devices"] == ["/CPU:0", "/CPU:1"] and given["peak"] < given["without"]
    assert all(peaks["with_lms"] < peaks["without_lms"] for peaks in given["peaks"].values())


def test_recomputing_under_the_strategy_trains_to_the_bit_as_a_plain_fit(mirrored):
    for mode, run in mirrored["modes"].items():
        assert run["same"] and run["recomputed"] > 0, (mode, run)
    only = mirrored["modes"]["only"]
    assert only["records"] == 2 * only["recomputed"]  # each replica recomputes its own


def test_devices_that_cannot_work_under_the_strategy_are_refused_before_training(mirrored):
    host, device = mirrored["refused"].values()
    assert "host_device='/CPU:1': is a device the distribution strategy trains on" in host
    assert "device='/CPU:2': is not one of the distribution strategy's devices (/CPU:0, /CPU:1)" in device
    assert mirrored["unchanged"] and not mirrored["train_step"]


def test_lms_fit_compare_shows_each_devices_predicted_peak(mirrored):
    assert mirrored["magic_error"] == "None"
    assert mirrored["headline"].startswith("LMS: predicted per-device peak -")
    device_bars = ["predicted peak, /CPU:0", "predicted peak, /CPU:1"]
    assert mirrored["bars"] == {"no_lms": device_bars, "lms": device_bars}


SEVERAL_WORKERS = textwrap.dedent("""
    import json, os, socket
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{port}"]},
                                          "task": {"type": "worker", "index": 0}})
    import keras, numpy as np, tensorflow as tf
    from lms_magic import LMS
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        model.compile("sgd", "mse")
    before = [w.copy() for w in model.get_weights()]
    try:
        model.fit(np.ones((16, 8)), np.ones((16, 4)), epochs=1, verbose=0, callbacks=[LMS()])
        said = ""
    except ValueError as error:
        said = str(error)
    print(json.dumps({"said": said, "untouched": all(np.array_equal(a, b) for a, b in
                                                      zip(before, model.get_weights()))}))
""")


def test_the_multi_worker_strategy_is_refused_before_training_with_what_to_use():
    """Keras 3's fit under MultiWorkerMirroredStrategy fails across machines (keras-team/keras#20585): LMS says so,
    and what to use, before a step runs (one worker here, where Keras gets as far as the fit)."""
    done = subprocess.run([sys.executable, "-c", SEVERAL_WORKERS], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "MultiWorkerMirroredStrategy is not supported" in found["said"] and "keras-team/keras#20585" in found["said"]
    assert "keras.distribution.initialize" in found["said"] and found["untouched"]
