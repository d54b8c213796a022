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
side stream still reads. Pinned buffers come from a pool reused step after
step (pinning a fresh buffer per tensor synchronizes the device). The values
are copied, never changed: the losses and weights are the same as without LMS.

On a CPU device the same hooks run with plain synchronous copies (what the
tests use to check the math); there is nothing to gain in memory there.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import defaultdict

import torch

from .. import compat
from ..units import MIB
from .plan import Candidate, Selection


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


class PinnedPool:
    """Host buffers by size, reused step after step; pinned when the device is a GPU.

    A buffer goes back to the pool as soon as its copy back to the device is
    queued: every copy runs on one side stream, so a later copy into the
    buffer is ordered after that one.

    Example:
        >>> pool = PinnedPool(pin=False)
        >>> first = pool.acquire(1024); pool.release(first)
        >>> pool.acquire(1024) is first, pool.allocated_bytes
        (True, 1024)
    """

    def __init__(self, pin: bool):
        self.pin = pin
        self._free: dict[int, list] = defaultdict(list)
        self.allocated_bytes = 0
        self.allocations = 0

    def acquire(self, nbytes: int):
        if self._free[nbytes]:
            return self._free[nbytes].pop()
        self.allocated_bytes += nbytes
        self.allocations += 1
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)

    def release(self, buffer) -> None:
        self._free[buffer.numel()].append(buffer)


class _Offloaded:
    """One saved activation, waiting in host memory."""

    __slots__ = ("shape", "dtype", "host", "layer_index", "device_tensor", "ready", "candidate")

    def __init__(self, shape, dtype, host, layer_index: int, candidate: Candidate):
        self.shape, self.dtype, self.host, self.layer_index = shape, dtype, host, layer_index
        self.device_tensor = None
        self.ready = None  # the event that the copy back recorded
        self.candidate = candidate


class TorchOffloader:
    """Runs train steps with the offloading hooks and keeps what they did.

    Args:
        selection: which saved activations may go (n_tensors, min_bytes, layers).
        lb: how many layers ahead of the backward pass the copies back start.
        budget_bytes: a device memory budget: the first step offloads every
            eligible tensor and measures its peak; later steps keep on the
            device the last ones (in forward order) that still fit.
        device: "cuda", "cuda:1", "cpu"... Defaults to the first GPU, else the CPU.
    """

    def __init__(self, selection: Selection, lb: int = 1, budget_bytes: int | None = None, device=None):
        self.selection, self.lb, self.budget_bytes = selection, lb, budget_bytes
        self.device = torch_device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.pool = PinnedPool(pin=self.cuda)
        self.n_tensors = -1 if budget_bytes is not None else selection.n_tensors
        self.notes: list[str] = []
        self.steps = 0
        self.candidates: list[Candidate] = []
        self.swapped: list[Candidate] = []
        self.peak_bytes: int | None = None
        if budget_bytes is not None and not self.cuda:
            self.notes.append("the budget needs a CUDA device to measure against: every eligible tensor is offloaded")

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
        self._waiting: list[_Offloaded] = []
        self._seen: dict[int, tuple] = {}
        self._step_candidates: list[Candidate] = []
        self._step_swapped: list[Candidate] = []

    def _end_step(self) -> None:
        if self.cuda:
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
        if self.steps == 0:
            self.candidates = self._step_candidates
            if self.budget_bytes is not None and self.cuda:
                self._fit_budget()
        self.swapped = self._step_swapped
        self._waiting = []
        self._seen = {}
        self.steps += 1

    def _fit_budget(self) -> None:
        """After a first step with everything eligible offloaded: keep on the device what still fits."""
        room = self.budget_bytes - self.peak_bytes
        eligible = self.selection.eligible(self.candidates)
        kept = 0
        while kept < len(eligible) and eligible[len(eligible) - 1 - kept].nbytes <= room:
            room -= eligible[len(eligible) - 1 - kept].nbytes
            kept += 1
        self.n_tensors = len(eligible) - kept
        if room < 0:
            self.notes.append(f"the measured peak with every eligible tensor offloaded, {self.peak_bytes / MIB:.1f} "
                              f"MiB, is above the budget of {self.budget_bytes / MIB:.1f} MiB")

    # -- the hooks -----------------------------------------------------------------------------
    def _pack(self, tensor):
        if tensor.grad_fn is None or tensor.device != self.device or not tensor.is_contiguous() \
                or tensor.is_sparse or tensor.numel() == 0:
            return tensor  # weights, inputs and odd layouts stay where they are
        key = id(tensor)
        if key in self._seen:  # saved twice (by two ops): offloaded once
            ref, handle = self._seen[key]
            if ref() is tensor:
                return handle
        layer, layer_type = compat.current_keras_layer()
        layer_index = self._layers.setdefault(layer, len(self._layers))
        candidate = Candidate(f"saved:{self._index}", layer, layer_type, tuple(tensor.shape),
                              tensor.numel() * tensor.element_size(), self._index)
        self._index += 1
        if not self.selection.eligible([candidate]):
            return tensor
        self._step_candidates.append(candidate)
        if self.n_tensors != -1 and len(self._step_swapped) >= self.n_tensors:
            return tensor
        handle = self._copy_out(tensor, layer_index, candidate)
        self._step_swapped.append(candidate)
        self._seen[key] = (weakref.ref(tensor), handle)
        return handle

    def _copy_out(self, tensor, layer_index: int, candidate: Candidate) -> _Offloaded:
        host = self.pool.acquire(candidate.nbytes).view(tensor.dtype).view(tensor.shape)
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the activation is computed
            with torch.cuda.stream(self.stream):
                host.copy_(tensor, non_blocking=True)
            tensor.record_stream(self.stream)  # its memory is not reused before the copy has read it
        else:
            host.copy_(tensor)
        handle = _Offloaded(tensor.shape, tensor.dtype, host, layer_index, candidate)
        self._waiting.append(handle)
        return handle

    def _unpack(self, packed):
        if not isinstance(packed, _Offloaded):
            return packed
        self._prefetch(packed.layer_index - self.lb)
        self._copy_in(packed)
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(packed.ready)  # compute never reads a buffer still in flight
            packed.device_tensor.record_stream(current)
        return packed.device_tensor

    def _prefetch(self, lowest_layer: int) -> None:
        """Starts the copies back of every waiting tensor of a layer at or after ``lowest_layer``."""
        for handle in [h for h in self._waiting if h.layer_index >= lowest_layer]:
            self._copy_in(handle)  # takes it off the waiting list

    def _copy_in(self, handle: _Offloaded) -> None:
        if handle.device_tensor is not None:
            return
        if self.cuda:
            with torch.cuda.stream(self.stream):
                handle.device_tensor = torch.empty(handle.shape, dtype=handle.dtype, device=self.device)
                handle.device_tensor.copy_(handle.host, non_blocking=True)
                handle.ready = torch.cuda.Event()
                handle.ready.record(self.stream)
        else:
            handle.device_tensor = handle.host.clone()
        self.pool.release(handle.host.view(torch.uint8).view(-1))
        handle.host = None
        if handle in self._waiting:
            self._waiting.remove(handle)

    # -- reporting -----------------------------------------------------------------------------
    def stats(self) -> dict:
        """The TensorFlow LMS's ``stats`` keys; here the peak is measured and ``lb`` counts layers."""
        return {
            "active": True, "backend": "torch", "candidates": len(self.candidates),
            "swapped_tensors": len(self.swapped), "swapped_bytes_per_step": sum(c.nbytes for c in self.swapped),
            "device_peak_bytes": self.peak_bytes, "device_peak_bytes_without_lms": None,
            "prediction_source": "measured (PyTorch allocator)" if self.peak_bytes is not None else None,
            "peak_source": "measured" if self.peak_bytes is not None else None, "lb_counts": "layers",
            "plan": [{"tensor": c.tensor, "layer": c.layer, "layer_type": c.layer_type, "shape": c.shape,
                      "bytes": c.nbytes} for c in self.swapped],
            "pinned": self.cuda, "pinned_pool_bytes": self.pool.allocated_bytes,
            "pinned_allocations": self.pool.allocations, "notes": list(self.notes),
        }

    def close(self) -> None:
        if self.cuda:
            self.stream.synchronize()


class TorchBackend:
    """One fit's LMS on the PyTorch backend, for the ``LMS`` callback (the TensorFlowBackend's counterpart).

    Args:
        selection, lb, budget_bytes, device: the LMS options.
        stats: the callback's dict, filled in after the first step.
    """

    jit_note = ("torch.compile (jit_compile) is off while LMS trains: it traces its own graph around autograd's "
                "saved-tensor hooks")

    def __init__(self, selection: Selection, lb: int, budget_bytes: int | None, device, stats: dict):
        self.offloader = TorchOffloader(selection, lb, budget_bytes, device)
        self.device, self.lb, self.stats = str(self.offloader.device), lb, stats
        self.step = None

    def train_step(self, original):
        return lambda data: self.offloader.run(original, data)

    def step_scope(self):
        return contextlib.nullcontext()

    def first_step_done(self) -> None:
        found = self.offloader.stats()
        found["notes"] = self.stats["notes"] + found["notes"]
        self.stats.update(found)

    def summary_line(self) -> str:
        stats = self.stats
        peak = stats["device_peak_bytes"]
        return (f"LMS (PyTorch): offloading {stats['swapped_tensors']} of {stats['candidates']} saved activations "
                f"({stats['swapped_bytes_per_step'] / MIB:.1f} MiB per step, lb={self.lb} layers) to "
                f"{'pinned ' if stats.get('pinned') else ''}host memory; "
                + (f"{self.device} peak {peak / MIB:.1f} MiB ({stats['prediction_source']})" if peak is not None
                   else "no device peak (not a CUDA device)"))

    def close(self) -> None:
        self.offloader.close()
