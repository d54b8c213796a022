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

SETUP = textwrap.dedent("""
    import json, os
    import lms_magic
    lms_magic.simulate_accelerator(accelerators=2)
    import keras, numpy as np, tensorflow as tf
    from lms_magic import LMS
    from lms_magic.lms.options import OptionError
    tf.config.experimental.enable_op_determinism()
    strategy = tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"])

    def build():
        keras.utils.set_random_seed(3)
        with strategy.scope():
            inputs = keras.Input((24, 24, 3))
            x = keras.layers.Dense(8, activation="relu")(inputs)  # no kernel scratch (a convolution's gradient
            y = keras.layers.Dense(8, activation="relu")(x)  # holds 32 MiB with oneDNN off, its activations 0.3)
            x = keras.layers.BatchNormalization()(keras.layers.Add()([x, y]))
            x = keras.layers.Dense(8, activation="relu")(x)
            outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x))
            model = keras.Model(inputs, outputs)
            model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    rng = np.random.default_rng(0)
    x, y = rng.random((64, 24, 24, 3), dtype="float32"), rng.integers(0, 10, 64)

    def fit(callbacks=()):
        model = build()
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False, callbacks=list(callbacks))
        return model, history.history["loss"]
""")


def run(body: str) -> dict:
    """Runs SETUP and ``body`` in a fresh Python; ``body`` prints one JSON line last."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}
    done = subprocess.run([sys.executable, "-c", SETUP + textwrap.dedent(body)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    return computed_once(tmp_path_factory, "mirrored_fits", mirrored_fits)


def mirrored_fits() -> dict:
    """One process: plain and LMS fits under MirroredStrategy over two simulated accelerators, the devices LMS
    refuses there, and %%lms_fit --compare in an IPython shell: what the tests read."""
    return run("""
        plain, plain_loss = fit()
        callback = LMS(n_tensors=-1, min_bytes=0, verbose=0)
        lms, lms_loss = fit([callback])
        again = LMS(min_bytes=0, verbose=0)  # the default plan: a probe, then the plan
        fit([again])
        stats = callback.stats
        found = {
            "same_loss": plain_loss == lms_loss, "loss": lms_loss,
            "same_weights": all(np.array_equal(a, b) for a, b in zip(plain.get_weights(), lms.get_weights())),
            "devices": stats.devices, "summary": callback.summary(),
            "swapped": stats.swapped_tensors, "candidates": stats.candidates,
            "swap_outs": [r.swap_out for r in stats.records], "device_peaks": stats.device_peaks,
            "planned_devices": again.stats.devices, "planned_swap_outs": [r.swap_out for r in again.stats.records],
            "planned_peaks": again.stats.device_peaks}
        found["modes"] = {}
        for mode in ("only", True):  # recompute only, and the hybrid plan (recomputes on the first replica)
            moved = LMS(n_tensors=-1, min_bytes=0, verbose=0, recompute=mode)
            model, mode_loss = fit([moved])
            found["modes"][str(mode)] = {
                "same": mode_loss == plain_loss and all(np.array_equal(a, b) for a, b in zip(plain.get_weights(),
                                                                                             model.get_weights())),
                "recomputed": moved.stats.recomputed_tensors, "records": len(moved.stats.records)}
        given = LMS(n_tensors=-1, min_bytes=0, verbose=0, device="/CPU:1")  # the second replica's device, named
        fit([given])
        found["given"] = {"devices": given.stats.devices, "peak": given.stats.device_peak_bytes,
                          "without": given.stats.device_peak_bytes_without_lms, "peaks": given.stats.device_peaks}

        model = build()
        before = [w.copy() for w in model.get_weights()]
        found["refused"] = {}
        for options in ({"host_device": "/CPU:1"}, {"device": "/CPU:2"}):
            try:
                model.fit(x, y, batch_size=16, verbose=0, callbacks=[LMS(verbose=0, **options)])
            except OptionError as error:
                found["refused"][str(options)] = str(error)
        found["unchanged"] = all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
        found["train_step"] = "train_step" in model.__dict__

        from IPython.core.interactiveshell import InteractiveShell
        from lms_magic.ui.plots import memory_bars_figure
        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "lms_magic")
        shell.user_ns.update(build=build, x=x, y=y)
        shell.run_cell("model = build()")
        cell = shell.run_cell("%%lms_fit --compare -o -q --n-tensors -1 --min-bytes 0\\n"
                              "model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)")
        found["magic_error"] = repr(cell.error_in_exec)
        found["headline"] = cell.result.headline() if cell.result is not None else None
        found["bars"] = {} if cell.result is None else {
            trace.name: list(trace.x) for trace in memory_bars_figure(cell.result.variants).data if trace.xaxis == "x"}
        print(json.dumps(found))
    """)


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
