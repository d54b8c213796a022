"""LMS on Keras's PyTorch backend: saved activations wait in pinned host memory.

``torch.autograd.graph.saved_tensors_hooks`` sees every tensor that autograd
saves for the backward pass. The selected ones (the same plan as on
TensorFlow: ``n_tensors`` in forward order, ``min_bytes``, layer names and
types, or a ``budget``) are copied to pinned host memory on a side CUDA
stream as soon as they are saved, so their device memory is freed once the
forward pass no longer reads them; when the backward pass reaches a layer,
the offloaded tensors of the ``lb`` layers before it are copied back on the
side stream. Events make compute wait for a copy still in flight, and
``record_stream`` keeps the caching allocator from reusing a buffer that the
side stream still reads; at most ``COPIES_OUT_IN_FLIGHT`` copies out are
queued ahead. What goes is a storage: the saved tensors that view it (a
convolution saves a permuted view of the activation before it) share one copy
and come back with their own strides. The model's graph drops each layer
output after its last reader while LMS trains (``internals.graph_intermediates_released``),
so an offloaded activation's device memory is free before the forward pass ends;
a storage copied back is held only by the saved tensors autograd keeps, so it is
freed as soon as its layer's gradient is computed.
Pinned buffers come from a pool reused step after step (pinning a fresh buffer
per tensor synchronizes the device). The values are copied, never changed: the
losses and weights are the same as without LMS.

On a CPU device the same hooks run with plain synchronous copies (what the
tests use to check the math); there is nothing to gain in memory there.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import defaultdict, deque
from typing import Callable

import torch

from . import internals as torch_internals
from ..core.plan import Candidate, Rule, Selection


def torch_device(device=None):
    """A torch device from LMS's ``device`` option, TensorFlow's spelling accepted.

    Example:
        >>> torch_device("/GPU:1"), torch_device("/CPU:0"), torch_device("cpu")
        (device(type='cuda', index=1), device(type='cpu'), device(type='cpu'))
    """
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    text = str(device).strip("/").lower()
    kind, _, index = text.partition(":")
    if kind in ("gpu", "cuda"):
        return torch.device("cuda", int(index or 0))
    if kind == "cpu":
        return torch.device("cpu")
    raise ValueError(f"LMS: unknown device {device!r}; use '/GPU:0' (or 'cuda:0') or '/CPU:0'")


# Copies to the host still in flight when the forward pass may go on: the CPU queues kernels far ahead
# of the GPU, and the caching allocator can reuse an offloaded activation's memory only once its copy
# has run, so without a bound every activation of the forward pass would be held until the slow copies
# caught up. Two keep the link busy.
COPIES_OUT_IN_FLIGHT = 2


class PinnedPool:
    """Host buffers by size, reused step after step; pinned when the device is a GPU.

    A buffer goes back to the pool as soon as its copy back to the device is
    queued: every copy runs on one side stream, so a later copy into the
    buffer is ordered after that one. Pinned buffers are pooled by size
    rounded up to a power of two, as PyTorch's pinned (caching host)
    allocator rounds them anyway: a tensor of 600 KiB takes a 1 MiB buffer
    whatever the pool asks for, so tensors of nearby sizes share buffers and
    ``allocated_bytes`` counts what is really pinned.

    Args:
        pin: pin the buffers (a CUDA device).
        round_up: pool by the next power of two. Defaults to ``pin``.

    Example:
        >>> pool = PinnedPool(pin=False, round_up=True)
        >>> first = pool.acquire(1000); pool.release(first)
        >>> second = pool.acquire(600)
        >>> second.untyped_storage().data_ptr() == first.untyped_storage().data_ptr(), second.numel()
        (True, 600)
        >>> pool.allocated_bytes, pool.allocations
        (1024, 1)
    """

    def __init__(self, pin: bool, round_up: bool | None = None):
        self.pin = pin
        self.round_up = pin if round_up is None else round_up
        self._free: dict[int, list] = defaultdict(list)
        self.allocated_bytes = 0
        self.allocations = 0

    def bucket_bytes(self, nbytes: int) -> int:
        """The size of the pooled buffer that holds ``nbytes``."""
        return 1 << max(nbytes - 1, 0).bit_length() if self.round_up else nbytes

    def acquire(self, nbytes: int):
        """A uint8 tensor of ``nbytes``, the start of a pooled buffer."""
        bucket = self.bucket_bytes(nbytes)
        if self._free[bucket]:
            buffer = self._free[bucket].pop()
        else:
            self.allocated_bytes += bucket
            self.allocations += 1
            buffer = torch.empty(bucket, dtype=torch.uint8, pin_memory=self.pin)
        return buffer[:nbytes]

    def release(self, view) -> None:
        """Gives back the buffer that ``view`` (from :meth:`acquire`, or a view of it) lies in."""
        buffer = view if view._base is None else view._base
        self._free[buffer.numel()].append(buffer)


class _Stored:
    """One saved activation's device storage, waiting in host memory (one copy out and back however many
    saved tensors view it: Keras's convolutions save a channels-first view of the channels-last output
    that the activation before them saved)."""

    __slots__ = ("numel", "dtype", "host", "layer_index", "device_flat", "ready", "candidate", "__weakref__")

    def __init__(self, numel: int, dtype, host, layer_index: int, candidate: Candidate):
        self.numel, self.dtype, self.host, self.layer_index = numel, dtype, host, layer_index
        self.device_flat = None  # the storage back on the device, flat
        self.ready = None  # the event that the copy back recorded
        self.candidate = candidate


class _SavedView:
    """What autograd keeps for one saved tensor: its storage and how it views it (shape, strides, offset)."""

    __slots__ = ("stored", "shape", "stride", "offset", "layer_index")

    def __init__(self, stored: _Stored, tensor, layer_index: int):
        self.stored, self.layer_index = stored, layer_index
        self.shape, self.stride, self.offset = tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()


def flat_storage(tensor):
    """``tensor``'s whole storage as a flat tensor of its dtype, or None where ``tensor`` does not cover its
    storage exactly (a slice of a bigger tensor, overlapping strides): such a tensor stays on the device.

    A permuted or reshaped view qualifies, and comes back with its own strides, so the backward pass
    runs the same kernels on the same layout.

    Example:
        >>> x = torch.arange(6.0).reshape(2, 3)
        >>> flat_storage(x.t()).tolist(), flat_storage(x[:, :2]), flat_storage(x[1:])
        ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], None, None)
    """
    if tensor.storage_offset() != 0 or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
        return None
    expected = 1
    for size, stride in sorted(zip(tensor.shape, tensor.stride()), key=lambda pair: pair[1]):
        if size == 1:
            continue
        if stride != expected:
            return None
        expected *= size
    return tensor.as_strided((tensor.numel(),), (1,), 0)


@dataclasses.dataclass(frozen=True)
class OffloadEvent:
    """One thing the offloader did to a saved activation's storage.

    Attributes:
        kind: "offload" (copied to the host, its device memory free once the forward pass is done with
            it), "copy_in" (its copy back to the device started), "read" (the backward pass read it), or
            "watch" (saved and kept on the device, watched only: see ``TorchOffloader.watch_all``).
        candidate: the activation (its layer, shape, bytes, forward position).
        layer_index: the latest layer (in forward order) that saved a tensor on this storage.
        tensor: the device tensor: the one offloaded, the copy back, or the view the backward pass reads.
    """

    kind: str
    candidate: Candidate
    layer_index: int
    tensor: object


class TorchOffloader:
    """Runs train steps with the offloading hooks and keeps what they did.

    Args:
        selection: which saved activations may go (n_tensors, min_bytes, layers).
        lb: how many layers ahead of the backward pass the copies back start.
        budget_bytes: unused here (the backend plans for it: torch/backend.py); kept for the stats' rule.
        device: "cuda", "cuda:1", "cpu"... Defaults to the first GPU, else the CPU.
        observer: called with an :class:`OffloadEvent` as each storage goes to the host ("offload"),
            starts back ("copy_in") and is read by the backward pass ("read"): to watch the offloading
            (the tests do) without changing it. Defaults to None.

    Its state is its arguments, the storages of the step running (saved, offloaded, on their way back, read),
    their copy stream and events, and what the steps did (candidates, counts, the measured peak): the hooks
    PyTorch calls for each saved tensor share it within a step, so it is one object.
    """

    def __init__(self, selection: Selection, lb: int = 1, budget_bytes: int | None = None, device=None,
                 observer: Callable[[OffloadEvent], None] | None = None):
        self.selection, self.lb, self.budget_bytes = selection, lb, budget_bytes
        self.observer = observer
        self.device = torch_device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.pool = PinnedPool(pin=self.cuda)
        # how many eligible tensors go, in forward order (-1: all); the backend sets it after the first step
        self.n_tensors = -1 if budget_bytes is not None or selection.n_tensors is None else selection.n_tensors
        self.notes: list[str] = []
        self.steps = 0
        self.candidates: list[Candidate] = []  # the eligible saved activations of the first step
        self.last_candidates: list[Candidate] = []  # and of the latest step: what autograd kept
        # the first step's candidates that other layers saved too: [(layer, how many candidates were saved before)]
        self.shared: dict[str, list[tuple[str, int]]] = {}
        self.swapped: list[Candidate] = []
        self.peak_bytes: int | None = None
        self.other_devices: set[str] = set()  # where the saved activations that were not on `device` live
        # the eligible activations beyond n_tensors stay on the device, but are told ("watch") and their reads
        # too: the recompute plan's first step needs them all
        self.watch_all = False

    # -- one step ------------------------------------------------------------------------------
    def run(self, train_step, data):
        """``train_step(data)`` with the offloading hooks; everything is copied back by the end."""
        self._begin_step()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                return train_step(data)
        finally:
            self._end_step()

    def _begin_step(self) -> None:
        self._index = 0
        self._layers: dict[str, int] = {}
        self._waiting: list[_Stored] = []
        self._seen: dict[int, tuple] = {}
        self._step_candidates: list[Candidate] = []
        self._step_swapped: list[Candidate] = []
        self._copies_out: deque = deque()  # the events of the copies out still in flight, oldest first

    def _end_step(self) -> None:
        if self.cuda:
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
        if self.steps == 0:
            self.candidates = self._step_candidates
            if not self.candidates and self.other_devices:
                self.notes.append(f"no saved activation was on {self.device}: the model trains on "
                                  f"{', '.join(sorted(self.other_devices))}; leave `device` unset to offload from there")
        self.swapped = self._step_swapped
        self.last_candidates = self._step_candidates
        self._waiting = []
        self._seen = {}
        self.steps += 1

    # -- the hooks -----------------------------------------------------------------------------
    def _pack(self, tensor):
        base = tensor if tensor._base is None else tensor._base
        if tensor.grad_fn is None or base.grad_fn is None:
            return tensor  # weights, inputs and views of them (a transposed kernel) stay: their memory stays anyway
        if tensor.device != self.device:
            self.other_devices.add(str(tensor.device))
            return tensor
        if tensor.layout != torch.strided or tensor.numel() == 0:
            return tensor  # sparse and empty tensors stay where they are
        layer, layer_type = torch_internals.current_keras_layer()
        layer_index = self._layers.setdefault(layer, len(self._layers))
        key = tensor.untyped_storage().data_ptr()
        if key in self._seen:  # a storage already offloaded (saved again, or viewed by another op)
            ref, stored_ref = self._seen[key]
            stored = stored_ref()
            if ref() is not None and stored is not None and stored.dtype == tensor.dtype:  # not a reused address
                stored.layer_index = max(stored.layer_index, layer_index)
                if self.steps == 0 and layer != stored.candidate.layer:
                    self.shared.setdefault(stored.candidate.tensor, []).append((layer, self._index))
                return _SavedView(stored, tensor, layer_index)
        flat = flat_storage(tensor)
        if flat is None:
            return tensor
        candidate = Candidate(f"saved:{self._index}", layer, layer_type, tuple(tensor.shape),
                              tensor.numel() * tensor.element_size(), self._index, torch_internals.current_keras_layer_path())
        self._index += 1
        if not self.selection.eligible([candidate]):
            return tensor
        self._step_candidates.append(candidate)
        if self.n_tensors != -1 and len(self._step_swapped) >= self.n_tensors:
            if not self.watch_all:
                return tensor
            stored = _Stored(flat.numel(), flat.dtype, None, layer_index, candidate)
            stored.device_flat = flat  # kept where it is
            self._tell("watch", stored, flat)
        else:
            stored = self._copy_out(flat, layer_index, candidate)
            self._step_swapped.append(candidate)
        # weak: once autograd has used the saved tensors of a layer's backward, the copy back is freed
        self._seen[key] = (weakref.ref(tensor.untyped_storage()), weakref.ref(stored))
        return _SavedView(stored, tensor, layer_index)

    def _copy_out(self, flat, layer_index: int, candidate: Candidate) -> _Stored:
        host = self.pool.acquire(candidate.nbytes).view(flat.dtype)
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the activation is computed
            with torch.cuda.stream(self.stream):
                host.copy_(flat, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(self.stream)
            flat.record_stream(self.stream)  # its memory is not reused before the copy has read it
            self._copies_out.append(copied)
            while len(self._copies_out) > COPIES_OUT_IN_FLIGHT:  # the forward pass waits for the link
                self._copies_out.popleft().synchronize()
        else:
            host.copy_(flat)
        stored = _Stored(flat.numel(), flat.dtype, host, layer_index, candidate)
        self._waiting.append(stored)
        self._tell("offload", stored, flat)
        return stored

    def _unpack(self, packed):
        if not isinstance(packed, _SavedView):
            return packed
        stored = packed.stored
        self._prefetch(packed.layer_index - self.lb)
        self._copy_in(stored)
        if self.cuda and stored.ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(stored.ready)  # compute never reads a buffer still in flight
            stored.device_flat.record_stream(current)
        view = stored.device_flat.as_strided(packed.shape, packed.stride, packed.offset)
        self._tell("read", stored, view, packed.layer_index)
        return view

    def _prefetch(self, lowest_layer: int) -> None:
        """Starts the copies back of every waiting storage read by a layer at or after ``lowest_layer``."""
        for stored in [s for s in self._waiting if s.layer_index >= lowest_layer]:
            self._copy_in(stored)  # takes it off the waiting list

    def _copy_in(self, stored: _Stored) -> None:
        if stored.device_flat is not None:
            return
        if self.cuda:
            with torch.cuda.stream(self.stream):
                stored.device_flat = torch.empty(stored.numel, dtype=stored.dtype, device=self.device)
                stored.device_flat.copy_(stored.host, non_blocking=True)
                stored.ready = torch.cuda.Event()
                stored.ready.record(self.stream)
        else:
            stored.device_flat = stored.host.clone()
        self.pool.release(stored.host.view(torch.uint8))
        stored.host = None
        if stored in self._waiting:
            self._waiting.remove(stored)
        self._tell("copy_in", stored, stored.device_flat)

    def _tell(self, kind: str, stored: _Stored, tensor, layer_index: int | None = None) -> None:
        if self.observer is not None:
            self.observer(OffloadEvent(kind, stored.candidate, stored.layer_index if layer_index is None
                                       else layer_index, tensor))

    # -- reporting -----------------------------------------------------------------------------
    def stats(self) -> dict:
        """The TensorFlow LMS's ``stats`` keys; here the peak is measured and ``lb`` counts layers."""
        return {
            "active": True, "backend": "torch", "candidates": len(self.candidates),
            "swapped_tensors": len(self.swapped), "swapped_bytes_per_step": sum(c.nbytes for c in self.swapped),
            "device_peak_bytes": self.peak_bytes, "device_peak_bytes_without_lms": None,
            "prediction_source": "measured (PyTorch allocator)" if self.peak_bytes is not None else None,
            "peak_source": "measured" if self.peak_bytes is not None else None, "lb_counts": "layers",
            # None offloads every eligible tensor here (no graph to plan with): the rule -1 names
            "plan_rule": (Rule.BUDGET if self.budget_bytes is not None else
                          Rule.ALL if self.selection.n_tensors in (None, -1) else Rule.FIRST_N),
            "plan": [{"tensor": c.tensor, "layer": c.layer, "layer_type": c.layer_type, "shape": c.shape,
                      "bytes": c.nbytes} for c in self.swapped],
            "pinned": self.cuda, "pinned_pool_bytes": self.pool.allocated_bytes,
            "pinned_allocations": self.pool.allocations, "notes": list(self.notes),
        }

    def close(self) -> None:
        if self.cuda:
            self.stream.synchronize()
