"""Recompute on PyTorch (``LMS(recompute=...)``): a cheap layer's saved activations dropped after the forward
pass and computed again when the backward pass reaches the layer.

A chosen layer's ``call`` runs under ``torch.utils.checkpoint`` (non-reentrant): autograd keeps the layer's
input (saved as the layer starts, through the offloading hooks like any saved activation), and the first
backward read of what the layer saved runs the call again. What the call changes besides its output is
set back for that run and restored after it, so the recomputed values and the state after the step are the
forward pass's to the bit: the layer's non-trainable variables (BatchNormalization's moving averages, a
Dropout's seed generator) hold their values from before the forward call, and PyTorch's random state is
the forward's (``preserve_rng_state``). The layers that may be recomputed are Keras's own cheap ones of a
single tensor input (:data:`CHEAP_LAYERS`: normalizations, activations, dropout; never a convolution or a
matrix product); which are is the plan's (``predict.choose_recomputes``), from what each one's call read
and saved in the first step (:class:`InputRecorder`).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

import torch
from torch.utils.checkpoint import checkpoint

from ... import internals
from ..core.plan import Candidate, Selection

CHEAP_LAYERS = frozenset({
    "BatchNormalization", "LayerNormalization", "GroupNormalization", "UnitNormalization",
    "Activation", "ReLU", "LeakyReLU", "ELU", "Softmax",
    "Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianDropout", "GaussianNoise",
})


def recomputable_layers(model, selection: Selection) -> list:
    """The layers of ``model`` (nested ones too) that may be recomputed: Keras's own classes of
    :data:`CHEAP_LAYERS` (a subclass that overrides ``call`` does not qualify) that the layer filters keep.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.BatchNormalization(),
        ...                           keras.layers.Activation("relu")])
        >>> [layer.__class__.__name__ for layer in recomputable_layers(model, Selection())]
        ['BatchNormalization', 'Activation']
    """
    import keras

    chosen = []
    for layer in internals.layers_of(model):
        name = type(layer).__name__
        base = getattr(keras.layers, name, None)
        if name not in CHEAP_LAYERS or base is None or type(layer).call is not base.call:
            continue
        if selection.eligible([Candidate("", layer.name, name, (), max(selection.min_bytes, 1), 0)]):
            chosen.append(layer)
    return chosen


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


def checkpointed_call(layer, call):
    """``call`` (the layer's current ``call``) under ``torch.utils.checkpoint`` where autograd records it (a
    single tensor input, gradients on); the plain call elsewhere (inference, validation, other inputs)."""
    state = list(layer.non_trainable_variables)

    def recomputed(inputs, *args, **kwargs):
        if not torch.is_grad_enabled() or not isinstance(inputs, torch.Tensor) or _tensors((args, kwargs)):
            return call(inputs, *args, **kwargs)
        before = [variable.value.detach().clone() for variable in state]

        @contextlib.contextmanager
        def as_in_the_forward_pass() -> Iterator[None]:
            now = [variable.value.detach().clone() for variable in state]
            for variable, value in zip(state, before):
                variable.assign(value)
            try:
                yield
            finally:
                for variable, value in zip(state, now):
                    variable.assign(value)

        return checkpoint(call, inputs, *args, use_reentrant=False, preserve_rng_state=True,
                          context_fn=lambda: (contextlib.nullcontext(), as_in_the_forward_pass()), **kwargs)

    return recomputed


def recomputed(layers: list):
    """A block in which ``layers`` are recomputed (see the module's docstring)."""
    return internals.layer_calls_replaced(layers, checkpointed_call)


class InputRecorder:
    """What each recomputable layer's call reads, as the plan needs it, recorded in the first step.

    The input of a layer is matched, by its storage, to the saved activation (a candidate of the offloader)
    some layer saved on it, before the call or after it; an input no one saved becomes a candidate of the
    layer's own (its bytes are what recomputing the layer adds). A layer called more than once is left out.

    Args:
        layers: the recomputable layers.
        selection: the LMS filters (an input too small for ``min_bytes`` is not planned with).
    """

    def __init__(self, layers: list, selection: Selection):
        self.layers, self.selection = layers, selection
        self._saved: dict[int, tuple] = {}  # storage address -> (weak storage, candidate)
        self._pending: dict[int, list] = {}  # storage address -> [(weak storage, layer name)]: no one saved it yet
        self._inputs: dict[str, list] = {}
        self._calls: dict[str, int] = {}

    def observe(self, event) -> None:
        """An offloader event (``OffloadEvent``): an "offload" or a "watch" says which storage a candidate is."""
        if event.kind not in ("offload", "watch"):
            return
        storage = event.tensor.untyped_storage()
        key = storage.data_ptr()
        self._saved[key] = (weakref.ref(storage), event.candidate)
        for ref, layer in self._pending.pop(key, []):
            if ref() is storage:
                self._inputs[layer] = [event.candidate]

    def recording(self):
        """The block of the first step: each layer's call noted with its input."""
        return internals.layer_calls_replaced(self.layers, self._recording_call)

    def _recording_call(self, layer, call):
        def recording(inputs, *args, **kwargs):
            outputs = call(inputs, *args, **kwargs)
            if torch.is_grad_enabled() and isinstance(inputs, torch.Tensor):
                self._note(layer, inputs)
            return outputs

        return recording

    def _note(self, layer, tensor) -> None:
        self._calls[layer.name] = self._calls.get(layer.name, 0) + 1
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        ref, candidate = self._saved.get(key, (None, None))
        if ref is None or ref() is not storage:
            candidate = Candidate(f"{layer.name}:input", layer.name, type(layer).__name__, tuple(tensor.shape),
                                  tensor.numel() * tensor.element_size(), -1)
            self._pending.setdefault(key, []).append((weakref.ref(storage), layer.name))
        self._inputs[layer.name] = [candidate]

    def layer_inputs(self) -> dict[str, list[Candidate]]:
        """Each layer called once with a tensor input: its input as a candidate (none where it is too small to
        plan with)."""
        return {name: [c for c in inputs if self.selection.eligible([c])] for name, inputs in self._inputs.items()
                if self._calls.get(name) == 1}

