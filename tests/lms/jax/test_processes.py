"""LMS across JAX processes: two processes over localhost (``keras.distribution.initialize``, gloo collectives),
two host devices each, training under ``DataParallel`` over all four devices and ``ModelParallel`` over a 2x2 mesh
across the processes. Each process relieves its own devices with the same plan, process 0 alone prints, and the
losses and weights equal a plain fit's under the same layout."""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import computed_once

ROOT = Path(__file__).resolve().parents[3]  # where the fresh processes import tests.* from

WORKER = textwrap.dedent("""
    import contextlib, io, json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    process, port = int(sys.argv[1]), sys.argv[2]
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import keras, numpy as np, tensorflow as tf
    from lms_magic import LMS

    keras.distribution.initialize(job_addresses=f"localhost:{port}", num_processes=2, process_id=process)
    devices = keras.distribution.list_devices()
    rng = np.random.default_rng(0)
    x, y = rng.random((128, 64), dtype="float32"), rng.integers(0, 10, 128)

    from tests.lms.jax.meshes import mlp as mesh_mlp
    mlp = lambda: mesh_mlp("sgd")

    def compare(batches):
        fitted = {}
        for name, callbacks in (("plain", []), ("lms", [LMS(n_tensors=-1, min_bytes=0)])):
            model, printed = mlp(), io.StringIO()
            with contextlib.redirect_stdout(printed):
                history = model.fit(batches(), epochs=1, verbose=0, callbacks=callbacks)
            fitted[name] = (model, history.history["loss"], callbacks, printed.getvalue())
        (plain, plain_loss, _, _), (lms, lms_loss, (callback,), printed) = fitted["plain"], fitted["lms"]
        stats = callback.stats
        return {"same_loss": plain_loss == lms_loss,
                "same_weights": all(np.array_equal(a, b) for a, b in zip(plain.get_weights(), lms.get_weights())),
                "devices": stats.devices, "moved_bytes": stats.swapped_bytes_per_step,
                "moved": sorted(row["tensor"] for row in stats.plan), "printed": printed,
                "bytes": {row["tensor"]: row["bytes"] for row in stats.plan}}

    data = lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(32)  # each process feeds its share
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    found = {"data_parallel": compare(data)}
    mesh = keras.distribution.DeviceMesh((2, 2), ["batch", "model"], devices)
    layout = keras.distribution.LayoutMap(mesh)
    layout[".*kernel"] = (None, "model")
    layout[".*bias"] = ("model",)
    keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch"))
    found["model_parallel"] = compare(data)
    # this process alone, on one of its devices, at one device's share of the batch: 32 over 4 devices
    # (DataParallel), over the 2 of the mesh's batch axis (ModelParallel)
    keras.distribution.set_distribution(None)
    for share in (8, 16):
        callback = LMS(n_tensors=-1, min_bytes=0, verbose=0)
        mlp().fit(x, y, batch_size=share, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
        found[f"one_device_{share}"] = {"moved_bytes": callback.stats.swapped_bytes_per_step,
                                        "bytes": {row["tensor"]: row["bytes"] for row in callback.stats.plan}}
    found["process"], found["local_devices"] = jax.process_index(), len(jax.local_devices())
    print(json.dumps(found))
""")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def processes(tmp_path_factory):
    """The two processes' findings, process 0's first (run once for all of pytest-xdist's workers)."""
    return computed_once(tmp_path_factory, "jax_process_fits", run_processes)


def run_processes() -> list[dict]:
    port = free_port()
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    running = [subprocess.Popen([sys.executable, "-c", WORKER, str(index), str(port)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT) for index in (0, 1)]
    found = []
    try:
        for process in running:
            out, err = process.communicate(timeout=300)
            assert process.returncode == 0, err[-3000:]
            found.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for process in running:
            process.kill()
    return found


@pytest.mark.parametrize("layout", ["data_parallel", "model_parallel"])
def test_each_process_relieves_its_devices_with_the_same_plan_and_the_same_math(processes, layout):
    first, second = (found[layout] for found in processes)
    assert [found["process"] for found in processes] == [0, 1] and processes[0]["local_devices"] == 2
    for found in (first, second):
        assert found["same_loss"] and found["same_weights"], found
        assert len(found["devices"]) == 4 and found["moved_bytes"] > 0
    # the same step, the same tensors moved: a process that planned otherwise would compile another program
    assert first["moved"] == second["moved"] and first["moved_bytes"] == second["moved_bytes"]
    assert first["devices"] == second["devices"]


def test_under_data_parallel_each_device_moves_its_share_of_the_batch(processes):
    for found in processes:
        assert found["data_parallel"]["moved_bytes"] == found["one_device_8"]["moved_bytes"]


def test_under_model_parallel_a_split_layers_activations_count_one_devices_half(processes):
    """The Dense layers' kernels split over the 2-way model axis: their outputs are split so too, and each device
    moves half of what one device moves at the same share of the batch (16 of 32: the batch axis is 2-way)."""
    for found in processes:
        split, whole = found["model_parallel"]["bytes"], found["one_device_16"]["bytes"]
        layers = [tensor for tensor in whole if tensor.startswith(("wide/", "wider/"))]
        assert len(layers) >= 4
        for tensor in layers:
            assert abs(split[tensor] - whole[tensor] / 2) <= 0.1 * whole[tensor] / 2, (tensor, split[tensor])
        assert found["model_parallel"]["moved_bytes"] < 0.6 * found["one_device_16"]["moved_bytes"]


def test_process_0_alone_prints_the_summary(processes):
    first, second = processes
    for layout in ("data_parallel", "model_parallel"):
        assert "LMS (JAX)" in first[layout]["printed"] and "4 devices" in first[layout]["printed"]
        assert second[layout]["printed"] == ""
