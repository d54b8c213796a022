"""The PyTorch offloader (KERAS_BACKEND=torch): when storages go and come back, what they cost the device on
the way, and the agreement with PyTorch's own ``torch.autograd.graph.save_on_cpu``.

The offloader's observer (``TorchOffloader(observer=...)``, ``TorchBackend(observer=...)``) reports each
storage's offload, copy back and read; the tests watch through it and change nothing.
"""

import weakref

import keras
import numpy as np
import pytest
import torch

from lms_magic import LMS
from lms_magic.lms.core.plan import Selection
from lms_magic.lms.torch.backend import TorchBackend
from lms_magic.lms.torch.offload import TorchOffloader

from tests.models import small_cnn as cnn, small_residual_bn_dropout as residual_bn_dropout

ACTIVATION_BYTES = 16 * 16 * 16 * 8 * 4  # one conv layer's output for 16 samples


def batch(data, n=16):
    """``n`` samples as tensors on the device the model trains on."""
    return keras.ops.convert_to_tensor(data[0][:n]), keras.ops.convert_to_tensor(data[1][:n])


@pytest.mark.parametrize("lb", [1, 2])
def test_copies_back_start_lb_layers_ahead_of_the_backward_pass(data, lb):
    events = []
    offloader = TorchOffloader(Selection(min_bytes=0), lb=lb,
                               observer=lambda event: events.append((event.kind, event.candidate, event.layer_index)))
    offloader.run(cnn(layers=6).train_step, batch(data))
    reads = [position for position, (kind, _, _) in enumerate(events) if kind == "read"]
    assert reads and len({candidate for kind, candidate, _ in events if kind == "offload"}) >= 6
    for position in reads:
        _, read, layer = events[position]
        arrived = [candidate for kind, candidate, _ in events[:position] if kind == "copy_in"]
        pending = [index for kind, _, index in events[position:] if kind == "copy_in"]
        # when the backward pass reads a tensor of layer L, every offloaded storage that layers L-lb and later
        # read is on its way
        assert read in arrived
        assert not any(index >= layer - lb for index in pending)


def watched_fit(build, data, observer):
    """One LMS step of ``build``'s model with the PyTorch backend's engine watched by ``observer``."""
    model = build()
    callback = LMS(min_bytes=0, verbose=0,
                   backend=lambda model, options, stats: TorchBackend(model, options, stats, observer=observer))
    model.fit(data[0][:16], data[1][:16], batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    return model


@pytest.mark.parametrize("build", [lambda: cnn(layers=8), residual_bn_dropout])
def test_offloaded_activations_leave_the_device_during_the_forward_pass(build, data):
    """Keras's graph holds every layer's output to the end of the forward pass; under LMS it lets each go
    after its last reader, so the device copies of offloaded activations do not pile up to the peak."""
    offloaded, alive_at_offload = [], []

    def observe(event):
        if event.kind == "offload":
            alive_at_offload.append(sum(nbytes for ref, nbytes in offloaded if ref() is not None))
            offloaded.append((weakref.ref(event.tensor.untyped_storage()), event.candidate.nbytes))

    model = watched_fit(build, data, observe)
    assert sum(nbytes for _, nbytes in offloaded) >= 8 * ACTIVATION_BYTES
    # at most the input of the layer running and a residual branch's input waiting for its Add (plus the
    # few bytes of batch statistics): not every activation so far
    assert max(alive_at_offload) <= 2.1 * ACTIVATION_BYTES
    arguments = [node.arguments for layer in model.layers for node in layer._inbound_nodes]
    assert not any("fill_in" in vars(argument) for argument in arguments)  # the graph is Keras's own again


@pytest.mark.parametrize("build", [lambda: cnn(layers=8), residual_bn_dropout])
def test_activations_brought_back_leave_the_device_after_their_layer(build, data):
    """An activation copied back for the backward pass is freed once its layer's gradient is computed, so the
    copies back do not pile up to the peak either."""
    restored, alive_at_copy_in = [], []

    def observe(event):
        if event.kind == "copy_in":
            alive_at_copy_in.append(sum(nbytes for ref, nbytes in restored if ref() is not None))
            restored.append((weakref.ref(event.tensor.untyped_storage()), event.candidate.nbytes))

    watched_fit(build, data, observe)
    assert sum(nbytes for _, nbytes in restored) >= 8 * ACTIVATION_BYTES
    # the layer whose gradient is being computed and the lb=1 layer fetched ahead (plus batch statistics)
    assert max(alive_at_copy_in) <= 3.1 * ACTIVATION_BYTES


class RecordingSaveOnCpu(torch.autograd.graph.save_on_cpu):
    """PyTorch's own offloading of every saved tensor, noting the shape and dtype of each that autograd made."""

    def __init__(self):
        super().__init__(pin_memory=False)
        pack, self.activations = self.pack_hook, []

        def recording(tensor):
            if tensor.grad_fn is not None:  # made by the step (weights and inputs have none)
                self.activations.append((tuple(tensor.shape), tensor.dtype))
            return pack(tensor)

        self.pack_hook = recording


@pytest.mark.parametrize("build", [lambda: cnn(layers=4), residual_bn_dropout])
def test_agrees_with_pytorchs_save_on_cpu(build, data):
    """The same loss and weights after a step as with save_on_cpu (and as without either), and nothing moved
    that save_on_cpu would not move: each storage the offloader moves is a tensor autograd saved."""
    def step(hooks=None, offloader=None):
        model = build()
        keras.utils.set_random_seed(7)
        if offloader is not None:
            logs = offloader.run(model.train_step, batch(data))
        else:
            with hooks if hooks is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                logs = model.train_step(batch(data))
        return float(logs["loss"]), [w.copy() for w in model.get_weights()]

    reference = RecordingSaveOnCpu()
    moved = []
    offloader = TorchOffloader(Selection(min_bytes=0),
                               observer=lambda e: moved.append(e.candidate) if e.kind == "offload" else None)
    (plain_loss, plain_weights), (cpu_loss, cpu_weights), (lms_loss, lms_weights) = \
        step(), step(reference), step(offloader=offloader)
    assert lms_loss == cpu_loss == plain_loss
    assert all(np.array_equal(a, b) and np.array_equal(a, c) for a, b, c in zip(plain_weights, cpu_weights,
                                                                                lms_weights))
    assert moved and len(moved) <= len(reference.activations)
    saved_sizes = {np.prod(shape) * torch.tensor([], dtype=dtype).element_size() for shape, dtype in reference.activations}
    assert all(candidate.nbytes in saved_sizes for candidate in moved)
