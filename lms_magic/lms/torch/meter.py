"""The bytes of every tensor a piece of PyTorch code makes, live at once, at their most: a step's peak on any device,
a CPU included (PyTorch's CPU allocator keeps no statistics).

A dispatch mode sees each operator's outputs; each new storage is counted until PyTorch frees it (a finalizer on
the storage, which PyTorch keeps while its memory is in use). Views and in-place results share a storage and count
once. What existed before (the weights, the optimizer's state) is not counted; the allocator's rounding and a
library's workspaces are not either. Given the device allocator's counter (a GPU's), it also reads each
operator's workspace: what the allocator held at most while the operator ran beyond what it held after it
(cuDNN's and cuBLAS's scratch: ``workspaces``, and ``timeline_with_workspaces``).
"""

from __future__ import annotations

import itertools
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class StorageMeter(TorchDispatchMode):
    """While active, counts the storages operators make: ``live_bytes`` now, ``peak_bytes`` at most, and
    ``timeline``: the live bytes after each operator.

    Example:
        >>> with StorageMeter() as meter:
        ...     a = torch.ones(1024)          # 4 KiB
        ...     b = (a * 2).sum()             # a 4 KiB temporary and the 4-byte sum, then the temporary freed
        ...     view = a[:10]                 # a view: no new storage
        >>> meter.peak_bytes, meter.live_bytes, meter.timeline
        (8196, 4100, [4096, 8192, 8196, 4100])
    """

    def __init__(self, counter=None):
        super().__init__()
        self.counter = counter  # an AllocatorCounter (memory/frameworks.py) whose peak can be reset, or None
        self.workspaces: list[int] = []  # with a counter: each operator's workspace (bytes)
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, tuple[int, int]] = {}  # data pointer -> (registration, bytes)
        self._registrations = itertools.count()
        self.timeline: list[int] = []

    def _freed(self, pointer: int, registration: int) -> None:
        entry = self._live.get(pointer)
        if entry is not None and entry[0] == registration:
            del self._live[pointer]
            self.live_bytes -= entry[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.counter is not None:
            self.counter.reset()  # its peak from here is this operator's: its inputs, workspaces, outputs
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            pointer, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or pointer in self._live:
                continue
            registration = next(self._registrations)
            self._live[pointer] = (registration, size)
            self.live_bytes += size
            weakref.finalize(storage, self._freed, pointer, registration)
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.timeline.append(self.live_bytes)
        if self.counter is not None:
            held, peak = self.counter.read()
            self.workspaces.append(max(0, peak - held))
        return out

    @property
    def timeline_with_workspaces(self) -> list[int]:
        """The live bytes after each operator with its workspace added: the most each operator held."""
        return [live + workspace for live, workspace in zip(self.timeline, self.workspaces)]
