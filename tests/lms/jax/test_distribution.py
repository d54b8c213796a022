"""LMS under keras.distribution on JAX: the plan and the prediction for one device of the mesh (its share of the
batch, its shards of the variables), on N host devices (``XLA_FLAGS=--xla_force_host_platform_device_count=N``,
set before JAX starts: the fits run in a fresh process with 4, on one, 2 or 4 of them)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import computed_once
from tests.lms.jax.distribution import ROOT, run as distributed_fits

@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    """One process with 4 host devices: fits on one device (no distribution), DataParallel over 2 and over 4,
    ModelParallel over a 2x2 mesh."""
    return computed_once(tmp_path_factory, "jax_distribution_fits", lambda: distributed_fits(4))


@pytest.mark.parametrize("count", [2, 4])
def test_data_parallel_plans_each_device_for_its_share_of_the_batch(fits, count):
    one, many = fits["one_device"], fits[f"data_parallel_{count}"]
    assert one["devices"] == [] and many["devices"] == [f"cpu:{index}" for index in range(count)]
    assert f"on each of {count} devices" in many["summary"] and "per-device peak" in many["summary"]
    # what the backward pass keeps of the activations, per device: about 1/N of one device's
    assert abs(many["moved_bytes"] / (one["moved_bytes"] / count) - 1) <= 0.10, (one, many)
    kept, kept_one = (run["peak_without"] - run["persistent"] for run in (many, one))
    assert abs(kept / (kept_one / count) - 1) <= 0.10, (kept_one, kept)
    assert many["persistent"] == one["persistent"]  # DataParallel replicates the variables
    assert many["peak"] < many["peak_without"]


def test_the_same_losses_and_weights_as_without_lms_under_the_distribution(fits):
    for layout, run in fits.items():
        assert run["same_loss"] and run["same_weights"], layout


def test_model_parallel_counts_each_devices_shards_of_the_variables(fits):
    run = fits["model_parallel"]
    assert run["devices"] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
    # every kernel and bias split over the 2-way "model" axis: half of every variable (and its Adam moments) each
    assert run["persistent"] < 0.55 * run["all_persistent"], run
    assert run["peak"] <= run["peak_without"]


XLA_CHECK = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, keras, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec
    from lms_magic import LMS

    width, batch = int(sys.argv[1]), int(sys.argv[2])
    devices = keras.distribution.list_devices("cpu")
    mesh = keras.distribution.DeviceMesh((2, 2), ["batch", "model"], devices)
    layout = keras.distribution.LayoutMap(mesh)
    layout[".*kernel"] = (None, "model")
    layout[".*bias"] = ("model",)
    keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch"))
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width, activation="relu"), keras.layers.Dense(16)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.random((2 * batch, 64), dtype="float32"), rng.integers(0, 10, 2 * batch).astype("int32")
    callback = LMS(n_tensors=-1, min_bytes=0, verbose=0)
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=[callback])

    # XLA's own figure for one device's program: the loss and gradient compiled under the layout's shardings
    spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
    rows = NamedSharding(keras.distribution.distribution().device_mesh.backend_mesh, PartitionSpec("batch"))
    values = [[spec(v.value) for v in group] for group in (model.trainable_variables, model.non_trainable_variables,
                                                           model.metrics_variables, model.optimizer.variables)]

    def inner(trainable, non_trainable, metrics, x, y, optimizer):
        return model.compute_loss_and_updates(trainable, non_trainable, metrics, x, y, None, training=True,
                                              optimizer_variables=optimizer)

    analysis = jax.jit(jax.value_and_grad(inner, has_aux=True)).lower(
        *values[:3], jax.ShapeDtypeStruct((batch, 64), np.float32, sharding=rows),
        jax.ShapeDtypeStruct((batch,), np.int32, sharding=rows), values[3]).compile().memory_analysis()
    xla = (analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
           - analysis.alias_size_in_bytes)
    print(json.dumps({"predicted": callback.stats.device_peak_bytes_without_lms, "xla": xla}))
""")


@pytest.mark.parametrize("width, batch", [(256, 64), (1024, 64)])
def test_model_parallel_per_device_peak_is_within_10_percent_of_xlas_figure_for_one_devices_program(width, batch):
    """Kernels split over the 2-way model axis of a 2x2 mesh: the predicted per-device peak without LMS counts each
    value's part on a device and the operands XLA gathers whole for a product (jax/sharded.py), against XLA's
    memory analysis of the partitioned program (counted whole, the prediction was 1.6x XLA's; parts alone, 0.66x)."""
    done = subprocess.run([sys.executable, "-c", XLA_CHECK, str(width), str(batch)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT,
                          env={**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert 0.9 <= found["predicted"] / found["xla"] <= 1.1, found
