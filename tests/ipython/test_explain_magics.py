"""A fit that runs out of memory, explained above the error (%%gpumem, %%lms_fit), and %%gpumem --explain, which
gives the same account without training (lms/explain/account.py)."""

import numpy as np
import pytest

from tests.conftest import DEVICES

CNN_SETUP = """
import keras, numpy as np, tensorflow as tf
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((32, 32, 3))] + [keras.layers.Conv2D(32, 3, padding="same", activation="relu")
                          for _ in range(6)] + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x = np.random.default_rng(0).random((256, 32, 32, 3), dtype="float32")
y = np.random.default_rng(0).integers(0, 10, 256)

class RunsOutOfMemory(keras.callbacks.Callback):
    # what a GPU does at a batch that does not fit, without needing one
    def on_train_batch_begin(self, batch, logs=None):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[256,32,32,32]")
"""


@pytest.fixture
def cnn_shell(shell, accelerator_memory):
    """The shell with a 6-layer CNN ``model``, images ``x``, ``y``, and a simulated accelerator of 16 MiB."""
    accelerator_memory("16MiB")
    assert shell.run_cell(CNN_SETUP).success
    return shell


def weights(shell):
    return [w.copy() for w in shell.user_ns["model"].get_weights()]


def test_gpumem_explains_a_fit_that_runs_out_of_memory_above_the_error(cnn_shell, capsys):
    import keras

    fit_before = keras.Model.fit
    before = weights(cnn_shell)
    result = cnn_shell.run_cell("%%gpumem\nmodel.fit(x, y, batch_size=128, epochs=1, verbose=0, "
                                "callbacks=[RunsOutOfMemory()])")
    out = capsys.readouterr().out
    assert type(result.error_in_exec).__name__ == "ResourceExhaustedError"  # the cell fails as before
    assert "ran out of device memory" in out and "batch 128" in out
    assert "the device has 16.0 MiB" in out and "conv2d" in out  # what filled it, by layer
    assert out.index("host") < out.index("ran out of device memory")  # the report, then why, then the error
    assert "without LMS:" in out and "largest batch" in out and "%%lms_fit" in out, out
    assert keras.Model.fit is fit_before and all(np.array_equal(a, b) for a, b in zip(before, weights(cnn_shell)))


def test_an_out_of_memory_that_jax_says_after_fit_returned_is_explained(cnn_shell, capsys):
    """JAX runs steps asynchronously: on an H200, a step that ran out of memory let ``fit`` return, and the error came
    when the weights were next read. %%gpumem waits for the fit's last step, so the error is the fit's, explained."""
    import sys
    import types

    import keras

    class JaxRuntimeError(Exception):
        pass

    def block_until_ready(values):
        assert len(values) == len(cnn_shell.user_ns["model"].variables)
        fake.undo()  # the account that follows is made on the model's own backend
        raise JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 20.71GiB")

    with pytest.MonkeyPatch.context() as fake:
        fake.setitem(sys.modules, "jax", types.SimpleNamespace(block_until_ready=block_until_ready))
        fake.setattr(keras.backend, "backend", lambda: "jax")
        result = cnn_shell.run_cell("%%gpumem\nmodel.fit(x, y, batch_size=128, epochs=1, verbose=0)")
    assert type(result.error_in_exec).__name__ == "JaxRuntimeError"
    out = capsys.readouterr().out
    assert "ran out of device memory" in out and "batch 128: the step needs" in out, out
    assert "the device has 16.0 MiB" in out


def test_other_errors_are_not_explained(cnn_shell, capsys):
    result = cnn_shell.run_cell("%%gpumem\nmodel.fit(x, y[:10], batch_size=128, epochs=1, verbose=0)")
    assert result.error_in_exec is not None
    assert "ran out of device memory" not in capsys.readouterr().out


def test_gpumem_explain_trains_nothing_and_returns_the_account(cnn_shell, capsys):
    before = weights(cnn_shell)
    assert cnn_shell.run_cell("%%gpumem --explain\nfound = model.fit(x, y, batch_size=128, epochs=1, verbose=0)").success
    found = cnn_shell.user_ns["found"]
    assert found.batch_size == 128 and found.capacity_bytes == 16 * 2**20
    assert found.modes[0].mode == "without LMS" and found.modes[0].largest_batch is not None
    assert str(found).splitlines()[0] in capsys.readouterr().out
    assert all(np.array_equal(a, b) for a, b in zip(before, weights(cnn_shell)))


def test_lms_fit_explains_a_variant_that_runs_out_of_memory(cnn_shell, capsys):
    """%%lms_fit marks a variant that runs out of memory (the cell goes on) and says why, and what fits."""
    options = f"--device {DEVICES.accelerator} --host-device {DEVICES.host}"
    assert cnn_shell.run_cell(f"%%lms_fit {options}\nmodel.fit(x, y, batch_size=64, epochs=1, verbose=0, "
                              "callbacks=[RunsOutOfMemory()])").success
    out = capsys.readouterr().out
    assert "ran out of memory" in out and "ran out of device memory. Why" in out and "batch 64" in out


def test_lms_fit_batch_size_max_trains_at_the_largest_batch_it_chose_and_says_why(cnn_shell, capsys):
    import math
    import re

    result = cnn_shell.run_cell("%%lms_fit --batch-size max\nh = model.fit(x, y, epochs=1, verbose=0)")
    assert result.success, result.error_in_exec
    said = re.search(r"--batch-size max: batch (\d+), (with|without)", capsys.readouterr().out)
    assert said, "the batch chosen is printed"
    chosen = int(said.group(1))
    assert chosen > 1 and cnn_shell.user_ns["h"].params["steps"] == math.ceil(256 / chosen)


def test_lms_fit_batch_size_max_refuses_batched_data_and_leaves_the_model(cnn_shell):
    before = weights(cnn_shell)
    result = cnn_shell.run_cell("%%lms_fit --batch-size max\n"
                                "model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=1, verbose=0)")
    assert isinstance(result.error_in_exec, ValueError)
    assert "needs the data as arrays" in str(result.error_in_exec)
    assert all((a == b).all() for a, b in zip(before, weights(cnn_shell)))
