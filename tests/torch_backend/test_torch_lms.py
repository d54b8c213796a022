"""LMS on Keras's PyTorch backend (run with KERAS_BACKEND=torch: `make test` does).

LMS offloads from the device the model trains on (`device` left unset): on a
CPU machine the hooks copy with plain synchronous copies, on a GPU machine
with the CUDA path; the same code selects, offloads, brings back and reports.
The gpu-marked tests check the memory saving on CUDA.
"""

import weakref

import keras
import numpy as np
import pytest
import torch

from lms_magic import LMS
from lms_magic.lms import torch_offload
from lms_magic.lms.plan import Selection
from lms_magic.lms.torch_offload import TorchOffloader

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch", reason="needs KERAS_BACKEND=torch")


@pytest.fixture(autouse=True)
def deterministic_cudnn():
    """Exact equality on a GPU needs cuDNN to pick the same algorithms run after run (a no-op on the CPU)."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


def cnn(seed=1, layers=4, size=16):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((size, size, 3))]
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
    callback = LMS(min_bytes=0, verbose=0)
    swapped, lms_history = train(build, data, callback)
    assert callback.stats["active"] and callback.stats["swapped_tensors"] > 0
    assert lms_history == plain_history
    for a, b in zip(plain.variables, swapped.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_the_same_plan_options_as_on_tensorflow(data):
    every = LMS(min_bytes=0, verbose=0)
    train(cnn, data, every, epochs=1)
    first_two = LMS(n_tensors=2, min_bytes=0, verbose=0)
    train(cnn, data, first_two, epochs=1)
    assert first_two.stats["swapped_tensors"] == 2
    assert every.stats.backend == "torch" and every.stats.lb_counts == "layers"
    assert every.stats.peak_source == ("measured" if torch.cuda.is_available() else None)
    without_names = lambda plan: [{k: v for k, v in row.items() if k != "layer"} for row in plan]  # noqa: E731
    assert without_names(first_two.stats["plan"]) == without_names(every.stats["plan"][:2])  # forward order
    big_only = LMS(min_bytes=every.stats["plan"][0]["bytes"] + 1, verbose=0)
    train(cnn, data, big_only, epochs=1)
    assert all(row["bytes"] > every.stats["plan"][0]["bytes"] for row in big_only.stats["plan"])
    no_conv = LMS(exclude_types=("Conv2D",), min_bytes=0, verbose=0)
    train(cnn, data, no_conv, epochs=1)
    assert all(row["layer_type"] != "Conv2D" for row in no_conv.stats["plan"])
    off = LMS(n_tensors=0, verbose=0)
    train(cnn, data, off, epochs=1)
    assert off.stats["active"] is False


class RecordingOffloader(TorchOffloader):
    """Logs when each offloaded storage comes back and when the backward pass reads a tensor saved on it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events = []

    def _copy_in(self, stored):
        if stored.device_flat is None:
            self.events.append(("in", stored))
        super()._copy_in(stored)

    def _unpack(self, packed):
        tensor = super()._unpack(packed)
        if not isinstance(packed, torch.Tensor):
            self.events.append(("read", packed))
        return tensor


@pytest.mark.parametrize("lb", [1, 2])
def test_copies_back_start_lb_layers_ahead_of_the_backward_pass(data, lb):
    model = cnn(layers=6)
    offloader = RecordingOffloader(Selection(min_bytes=0), lb=lb)
    x, y = keras.ops.convert_to_tensor(data[0][:16]), keras.ops.convert_to_tensor(data[1][:16])  # where the model is
    offloader.run(model.train_step, (x, y))
    reads = [i for i, (kind, _) in enumerate(offloader.events) if kind == "read"]
    assert reads
    for position in reads:
        view = offloader.events[position][1]
        arrived = [stored for kind, stored in offloader.events[:position] if kind == "in"]
        pending = [stored for kind, stored in offloader.events[position:] if kind == "in"]
        # when the backward pass reads a tensor of layer L, every offloaded storage that layers L-lb and later
        # read is on its way
        assert any(stored is view.stored for stored in arrived)
        assert not any(stored.layer_index >= view.layer_index - lb for stored in pending)


def test_pinned_pool_is_reused_step_after_step(data):
    callback = LMS(min_bytes=0, verbose=0)
    model = cnn()
    model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[callback])  # 4 steps
    offloader_allocations = callback.stats["pinned_allocations"]
    assert offloader_allocations == callback.stats["swapped_tensors"]  # one buffer per tensor of one step


def test_summary_line_and_the_model_left_plain(data, capsys):
    model = cnn()
    model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[LMS(min_bytes=0)])
    assert "LMS (PyTorch): offloading" in capsys.readouterr().out
    assert "train_step" not in model.__dict__


def test_an_error_mid_step_leaves_the_model_plain(data):
    model = cnn()

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[LMS(min_bytes=0, verbose=0),
                                                                          Boom()])
    model.fit(*data, batch_size=16, epochs=1, verbose=0)  # a plain fit after it heals the model first
    assert "train_step" not in model.__dict__


def test_lms_fit_compare_on_torch(shell, data):
    shell.user_ns.update(model=cnn(), x=data[0], y=data[1])
    result = shell.run_cell_magic("lms_fit", "-q -o --compare --min-bytes 0",
                                  "model.fit(x, y, batch_size=16, epochs=2, verbose=0)")
    no_lms, lms = result.variants
    assert no_lms.status == lms.status == "ok"
    assert no_lms.step_losses == lms.step_losses
    assert lms.lms_stats["swapped_tensors"] > 0
    assert lms.lms_stats["lb_counts"] == "layers"  # backward ops on TensorFlow
    exported = lms.to_dict()  # measured on CUDA, none on a CPU; never one labelled as predicted
    assert exported["device_peak_source"] == ("measured" if torch.cuda.is_available() else None)
    assert exported["predicted_device_peak_bytes"] is None


@pytest.mark.gpu
def test_on_cuda_the_peak_drops_and_the_math_stays(data):
    def peak_and_losses(callback):
        torch.cuda.reset_peak_memory_stats()
        model = cnn(layers=8, size=64)
        keras.utils.set_random_seed(7)
        x = np.random.default_rng(0).normal(size=(256, 64, 64, 3)).astype("float32")
        history = model.fit(x, np.arange(256) % 10, batch_size=64, epochs=1, verbose=0,
                            callbacks=[callback] if callback else [])
        return torch.cuda.max_memory_allocated(), history.history["loss"]

    plain_peak, plain_losses = peak_and_losses(None)
    lms_peak, lms_losses = peak_and_losses(LMS(min_bytes=0, verbose=0))
    assert lms_losses == plain_losses
    assert lms_peak < plain_peak


@pytest.mark.gpu
def test_a_device_the_model_is_not_on_is_said(data):
    callback = LMS(min_bytes=0, device="cpu", verbose=0)  # the model trains on cuda:0
    train(cnn, data, callback, epochs=1)
    assert callback.stats["swapped_tensors"] == 0
    assert any("leave `device` unset" in note for note in callback.stats["notes"])


class LivenessOffloader(TorchOffloader):
    """Adds up, at each offload, the bytes of the device storages of earlier offloaded activations still alive."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.alive_bytes_at_offload, self._offloaded, self._stored = [], [], set()

    def _pack(self, tensor):
        packed = super()._pack(tensor)
        if not isinstance(packed, torch.Tensor) and id(packed.stored) not in self._stored:
            self._stored.add(id(packed.stored))
            self.alive_bytes_at_offload.append(sum(nbytes for ref, nbytes in self._offloaded if ref() is not None))
            self._offloaded.append((weakref.ref(tensor.untyped_storage()), packed.stored.candidate.nbytes))
        return packed


@pytest.mark.parametrize("build", [lambda: cnn(layers=8), residual_bn_dropout])
def test_offloaded_activations_leave_the_device_during_the_forward_pass(build, data, monkeypatch):
    """Keras's graph holds every layer's output to the end of the forward pass; under LMS it lets each go
    after its last reader, so the device copies of offloaded activations do not pile up to the peak."""
    offloaders = []
    monkeypatch.setattr(torch_offload, "TorchOffloader",
                        lambda *a, **k: offloaders.append(LivenessOffloader(*a, **k)) or offloaders[-1])
    model = build()
    model.fit(data[0][:16], data[1][:16], batch_size=16, epochs=1, verbose=0, callbacks=[LMS(min_bytes=0, verbose=0)])
    (offloader,) = offloaders
    activation_bytes = 16 * 16 * 16 * 8 * 4  # one conv layer's output for 16 samples
    assert sum(nbytes for _, nbytes in offloader._offloaded) >= 8 * activation_bytes
    # at most the input of the layer running and a residual branch's input waiting for its Add (plus the
    # few bytes of batch statistics): not every activation so far
    assert max(offloader.alive_bytes_at_offload) <= 2.1 * activation_bytes
    arguments = [node.arguments for layer in model.layers for node in layer._inbound_nodes]
    assert not any("fill_in" in vars(argument) for argument in arguments)  # the graph is Keras's own again


def test_an_interrupt_mid_forward_leaves_the_graph_as_keras_made_it(data):
    model = cnn()

    class Interrupt(keras.layers.Layer):
        def compute_output_shape(self, input_shape):  # built without calling `call`
            return input_shape

        def call(self, x):
            raise KeyboardInterrupt

    broken = keras.Sequential([keras.Input((16, 16, 3)), model.layers[0], Interrupt()])
    broken.compile("adam", "mse")
    with pytest.raises(KeyboardInterrupt):
        broken.fit(data[0][:16], data[0][:16], epochs=1, verbose=0, callbacks=[LMS(min_bytes=0, verbose=0)])
    nodes = [node for layer in broken._functional.layers for node in layer._inbound_nodes]
    assert nodes and not any("fill_in" in vars(node.arguments) for node in nodes)


class BackwardLivenessOffloader(TorchOffloader):
    """Adds up, at each copy back, the bytes of the earlier copies back whose device storage is still alive."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.alive_bytes_at_copy_in, self._restored = [], []

    def _copy_in(self, stored):
        if stored.device_flat is not None:
            return
        self.alive_bytes_at_copy_in.append(sum(nbytes for ref, nbytes in self._restored if ref() is not None))
        super()._copy_in(stored)
        self._restored.append((weakref.ref(stored.device_flat.untyped_storage()), stored.candidate.nbytes))


@pytest.mark.parametrize("build", [lambda: cnn(layers=8), residual_bn_dropout])
def test_activations_brought_back_leave_the_device_after_their_layer(build, data, monkeypatch):
    """An activation copied back for the backward pass is freed once its layer's gradient is computed, so the
    copies back do not pile up to the peak either."""
    offloaders = []
    monkeypatch.setattr(torch_offload, "TorchOffloader",
                        lambda *a, **k: offloaders.append(BackwardLivenessOffloader(*a, **k)) or offloaders[-1])
    model = build()
    model.fit(data[0][:16], data[1][:16], batch_size=16, epochs=1, verbose=0, callbacks=[LMS(min_bytes=0, verbose=0)])
    (offloader,) = offloaders
    activation_bytes = 16 * 16 * 16 * 8 * 4
    assert sum(nbytes for _, nbytes in offloader._restored) >= 8 * activation_bytes
    # the layer whose gradient is being computed and the lb=1 layer fetched ahead (plus batch statistics)
    assert max(offloader.alive_bytes_at_copy_in) <= 3.1 * activation_bytes
