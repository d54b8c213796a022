"""LMS on Keras's PyTorch backend (run with KERAS_BACKEND=torch: `make test` does).

On the CPU the hooks copy with plain synchronous copies; the same code path
selects, offloads, brings back and reports. The gpu-marked test checks the
memory saving on CUDA.
"""

import keras
import numpy as np
import pytest
import torch

from lms_magic import LMS
from lms_magic.lms.plan import Selection
from lms_magic.lms.torch_offload import TorchOffloader

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch", reason="needs KERAS_BACKEND=torch")


def cnn(seed=1, layers=4):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((16, 16, 3))]
                             + [keras.layers.Conv2D(8, 3, padding="same", activation="relu") for _ in range(layers)]
                             + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def residual_bn_dropout(seed=3):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, padding="same")(inputs)
    for _ in range(3):
        branch = keras.layers.Conv2D(8, 3, padding="same")(x)
        branch = keras.layers.BatchNormalization()(branch)
        branch = keras.layers.Dropout(0.2)(keras.layers.Activation("relu")(branch))
        x = keras.layers.Add()([x, branch])
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x)))
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 16, 16, 3)).astype("float32"), rng.integers(0, 10, 64)


def train(build, data, callback=None, epochs=2):
    model = build()
    keras.utils.set_random_seed(7)
    history = model.fit(*data, batch_size=16, epochs=epochs, verbose=0, callbacks=[callback] if callback else [])
    return model, history.history


@pytest.mark.parametrize("build", [cnn, residual_bn_dropout])
def test_same_losses_and_weights_with_and_without_lms(build, data):
    plain, plain_history = train(build, data)
    callback = LMS(min_bytes=0, device="/CPU:0", verbose=0)
    swapped, lms_history = train(build, data, callback)
    assert callback.stats["active"] and callback.stats["swapped_tensors"] > 0
    assert lms_history == plain_history
    for a, b in zip(plain.variables, swapped.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_the_same_plan_options_as_on_tensorflow(data):
    every = LMS(min_bytes=0, device="cpu", verbose=0)
    train(cnn, data, every, epochs=1)
    first_two = LMS(n_tensors=2, min_bytes=0, device="cpu", verbose=0)
    train(cnn, data, first_two, epochs=1)
    assert first_two.stats["swapped_tensors"] == 2
    without_names = lambda plan: [{k: v for k, v in row.items() if k != "layer"} for row in plan]  # noqa: E731
    assert without_names(first_two.stats["plan"]) == without_names(every.stats["plan"][:2])  # forward order
    big_only = LMS(min_bytes=every.stats["plan"][0]["bytes"] + 1, device="cpu", verbose=0)
    train(cnn, data, big_only, epochs=1)
    assert all(row["bytes"] > every.stats["plan"][0]["bytes"] for row in big_only.stats["plan"])
    no_conv = LMS(exclude_types=("Conv2D",), min_bytes=0, device="cpu", verbose=0)
    train(cnn, data, no_conv, epochs=1)
    assert all(row["layer_type"] != "Conv2D" for row in no_conv.stats["plan"])
    off = LMS(n_tensors=0, device="cpu", verbose=0)
    train(cnn, data, off, epochs=1)
    assert off.stats["active"] is False


class RecordingOffloader(TorchOffloader):
    """Logs when each offloaded tensor comes back and when the backward pass reads it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events = []

    def _copy_in(self, handle):
        if handle.device_tensor is None:
            self.events.append(("in", handle.layer_index))
        super()._copy_in(handle)

    def _unpack(self, packed):
        tensor = super()._unpack(packed)
        if not isinstance(packed, torch.Tensor):
            self.events.append(("read", packed.layer_index))
        return tensor


@pytest.mark.parametrize("lb", [1, 2])
def test_copies_back_start_lb_layers_ahead_of_the_backward_pass(data, lb):
    model = cnn(layers=6)
    offloader = RecordingOffloader(Selection(min_bytes=0), lb=lb, device="cpu")
    x, y = torch.as_tensor(data[0][:16]), torch.as_tensor(data[1][:16])
    offloader.run(model.train_step, (x, y))
    reads = [i for i, (kind, _) in enumerate(offloader.events) if kind == "read"]
    assert reads
    for position in reads:
        layer = offloader.events[position][1]
        arrived = {index for kind, index in offloader.events[:position] if kind == "in"}
        pending = {index for kind, index in offloader.events[position:] if kind == "in"}
        # when the backward pass reads layer L, every offloaded tensor of layers L-lb and later is on its way
        assert layer in arrived
        assert not any(index >= layer - lb for index in pending)


def test_pinned_pool_is_reused_step_after_step(data):
    callback = LMS(min_bytes=0, device="cpu", verbose=0)
    model = cnn()
    model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[callback])  # 4 steps
    offloader_allocations = callback.stats["pinned_allocations"]
    assert offloader_allocations == callback.stats["swapped_tensors"]  # one buffer per tensor of one step


def test_summary_line_and_the_model_left_plain(data, capsys):
    model = cnn()
    model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[LMS(min_bytes=0, device="cpu")])
    assert "LMS (PyTorch): offloading" in capsys.readouterr().out
    assert "train_step" not in model.__dict__


def test_an_error_mid_step_leaves_the_model_plain(data):
    model = cnn()

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[LMS(min_bytes=0, device="cpu", verbose=0),
                                                                          Boom()])
    model.fit(*data, batch_size=16, epochs=1, verbose=0)  # a plain fit after it heals the model first
    assert "train_step" not in model.__dict__


def test_lms_fit_compare_on_torch(shell, data):
    shell.user_ns.update(model=cnn(), x=data[0], y=data[1])
    result = shell.run_cell_magic("lms_fit", "-q -o --compare --min-bytes 0 --device cpu",
                                  "model.fit(x, y, batch_size=16, epochs=2, verbose=0)")
    no_lms, lms = result.variants
    assert no_lms.status == lms.status == "ok"
    assert no_lms.step_losses == lms.step_losses
    assert lms.lms_stats["swapped_tensors"] > 0
    assert lms.lms_stats["lb_counts"] == "layers"  # backward ops on TensorFlow
    exported = lms.to_dict()  # no CUDA here: no measured peak, and never one labelled as predicted
    assert exported["device_peak_source"] is None and exported["predicted_device_peak_bytes"] is None


@pytest.mark.gpu
def test_on_cuda_the_peak_drops_and_the_math_stays(data):
    def peak_and_losses(callback):
        torch.cuda.reset_peak_memory_stats()
        model = cnn(layers=8)
        keras.utils.set_random_seed(7)
        x = np.random.default_rng(0).normal(size=(256, 64, 64, 3)).astype("float32")
        model.build((None, 64, 64, 3))
        history = model.fit(x, np.arange(256) % 10, batch_size=64, epochs=1, verbose=0,
                            callbacks=[callback] if callback else [])
        return torch.cuda.max_memory_allocated(), history.history["loss"]

    plain_peak, plain_losses = peak_and_losses(None)
    lms_peak, lms_losses = peak_and_losses(LMS(min_bytes=0, verbose=0))
    assert lms_losses == plain_losses
    assert lms_peak < plain_peak
