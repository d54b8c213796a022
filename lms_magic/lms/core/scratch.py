"""What each kernel holds beyond its inputs and outputs while it runs (its scratch), from the allocator's events of
measured steps, and how it grows with the batch (pure Python).

A convolution's backward kernels on a CPU allocate blocking buffers sized from the machine's caches; cuDNN's
algorithms allocate workspaces. The allocator counts them while the kernel runs; the graph's tensors do not show
them. :func:`kernel_scratch` reads each op's scratch off one step's events (the most its scratch allocations held at
once); :class:`KernelScratch` holds it at the batch sizes measured, as a line in the batch for each op (a fixed part
and a part that grows with the batch, or a size the batch does not change), and the replay adds it at the op (``TracedStep``'s nodes): it lives while
that kernel runs, with or without LMS.

Example:
    >>> MiB = 2**20
    >>> events = [Allocation("conv/Conv2DBackpropFilter", "temp", 3 * MiB, 1, False),
    ...           Allocation("conv/Conv2DBackpropFilter", "output", 4 * MiB, 2, False),
    ...           Allocation("", "", 3 * MiB, 1, True)]
    >>> kernel_scratch(events) == {"conv/Conv2DBackpropFilter": 3 * MiB}
    True
    >>> found = KernelScratch({4: {"conv/Conv2DBackpropFilter": 300}, 8: {"conv/Conv2DBackpropFilter": 600}})
    >>> found.at(16)
    {'conv/Conv2DBackpropFilter': 1200}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple

SCRATCH_REGION = "temp"  # the profiler's region of an allocation a kernel makes for itself
# an op's scratch under this many bytes is left out: the kernels' bookkeeping buffers, whose sizes move from step to
# step with the threads' shares; one kernel runs at a time, so what is left out is under this at any point
MIN_SCRATCH_BYTES = 2**20


class Allocation(NamedTuple):
    """One allocator event: the op that made the allocation (empty for a free), its region ("output", "temp"...),
    its bytes (the chunk the allocator gave) and address, whether it is a free, when (ps), the allocator's bytes in
    use after it, and the bytes the op asked for (0 where not read)."""

    op: str
    region: str
    nbytes: int
    address: int
    freed: bool
    time_ps: int = 0
    in_use_bytes: int = 0
    requested: int = 0


@dataclass(frozen=True)
class StepProfile:
    """What a profiler saw in one step: the device allocator's ``events`` in time order (:class:`Allocation`) and
    each op's run (``runs``: the op's name as the profiler gives it -> its first start and last end, in ps)."""

    events: list
    runs: dict


def kernel_scratch(events: Iterable[Allocation], op_name: Callable[[str], str] = str) -> dict[str, int]:
    """Each op's scratch in one step's allocator ``events`` (in time order): the most bytes its scratch
    allocations held at once (a free is matched to its allocation by address); ``op_name`` maps the profiler's
    op name to the graph's. Ops under ``MIN_SCRATCH_BYTES`` are left out."""
    held: dict[str, int] = {}
    most: dict[str, int] = {}
    owner: dict[int, tuple[str, int]] = {}
    for event in events:
        if event.freed:
            op, nbytes = owner.pop(event.address, ("", 0))
            if op:
                held[op] -= nbytes
        elif event.region == SCRATCH_REGION and event.op:
            op = op_name(event.op)
            owner[event.address] = (op, event.nbytes)
            held[op] = held.get(op, 0) + event.nbytes
            most[op] = max(most.get(op, 0), held[op])
    return {op: nbytes for op, nbytes in most.items() if nbytes >= MIN_SCRATCH_BYTES}


OUTPUT_REGION = "output"  # the profiler's region of an op's output tensor
# an output's chunk excess under this is left out: small requests come from split chunks, and what a few MiB
# tensor gets beyond its bytes moves with what the process freed before (0-2 MiB on the tests' 2 MiB activations,
# from fit to fit in one process), where a chunk left whole for a large tensor recurs (issue 60's 32 MiB logits:
# 55.5-63 MiB in fresh processes)
MIN_CHUNK_EXCESS_BYTES = 4 * 2**20


def chunk_excess(events: Iterable[Allocation], op_name: Callable[[str], str] = str) -> dict[str, int]:
    """What each op's outputs held beyond the bytes they asked for, in one step's allocator ``events``: a BFC
    allocator hands a whole free chunk where the request is over half of it (a 32 MiB tensor in a 55 MiB chunk),
    and the tensor holds it while it lives. By op (``op_name`` maps the profiler's names to the graph's); an op's
    excess under ``MIN_CHUNK_EXCESS_BYTES`` is left out. The chunks depend on what was free, so they hold for the
    step measured, at its batch.

    Example:
        >>> MiB = 2**20
        >>> chunk_excess([Allocation("dense/MatMul", "output", 55 * MiB, 1, False, requested=32 * MiB),
        ...               Allocation("relu", "output", 4 * MiB + 256, 2, False, requested=4 * MiB)]) == {
        ...     "dense/MatMul": 23 * MiB}
        True
    """
    excess: dict[str, int] = {}
    for event in events:
        if not event.freed and event.region == OUTPUT_REGION and event.op and event.requested:
            extra = event.nbytes - event.requested
            if extra > 0:
                op = op_name(event.op)
                excess[op] = excess.get(op, 0) + extra
    return {op: nbytes for op, nbytes in excess.items() if nbytes >= MIN_CHUNK_EXCESS_BYTES}


# an op's scratch grows with the batch where, between two measured batch sizes, it grew by at least this share of
# the batch's growth; else it is sized otherwise (a CPU kernel's blocking buffers by the caches and threads: 20-52
# MiB, up and down, at batches 1 to 16 for one convolution's filter gradient)
GROWS_WITH_BATCH = 0.75


@dataclass(frozen=True)
class KernelScratch:
    """Each op's scratch at the batch sizes measured (``{batch: {op: bytes}}``), at any batch. Between the two
    measured batches farthest apart, an op whose scratch grew about as the batch did (``GROWS_WITH_BATCH``: a
    workspace per sample) follows the line through them (a fixed part and a per-sample part) at any batch, never
    below the smaller; any other op (a buffer sized by the caches and threads) follows it between them and holds
    the nearest measured outside them. An op measured at one batch only holds that at every batch.

    Example:
        >>> found = KernelScratch({2: {"per_sample": 200, "cache_sized": 300}, 4: {"per_sample": 400, "cache_sized": 280}})
        >>> found.at(8), found.at(3)["cache_sized"]
        ({'cache_sized': 280, 'per_sample': 800}, 290)
    """

    measured: dict[int, dict[str, int]]

    @property
    def ops(self) -> list[str]:
        """The ops that hold scratch at some measured batch, in name order."""
        return sorted({op for found in self.measured.values() for op in found})

    def at(self, batch_size: int) -> dict[str, int]:
        """Each op's scratch bytes at ``batch_size`` (every op of ``ops``)."""
        batches = sorted(self.measured)
        low, high = batches[0], batches[-1]
        result = {}
        for op in self.ops:
            low_bytes, high_bytes = self.measured[low].get(op), self.measured[high].get(op)
            if low == high or not low_bytes or not high_bytes:
                result[op] = max(low_bytes or 0, high_bytes or 0)
                continue
            slope = (high_bytes - low_bytes) / (high - low)
            if (high_bytes - low_bytes) / low_bytes >= GROWS_WITH_BATCH * (high - low) / low:  # per sample
                result[op] = max(low_bytes, int(round(low_bytes + slope * (batch_size - low))))
            else:  # between the two as a line, outside them the nearest's
                result[op] = int(round(low_bytes + slope * (min(max(batch_size, low), high) - low)))
        return result

    def words(self, batch_size: int, layer_of: Callable[[str], str], top: int = 3) -> str:
        """The layers whose kernels hold the most scratch at ``batch_size``, as a user reads them ("conv2d_3's
        kernel scratch 24.0 MiB"); empty where none does.

        Example:
            >>> KernelScratch({8: {"g/conv2d_3/Conv2DBackpropFilter": 24 * 2**20}}).words(8, lambda op: "conv2d_3")
            "conv2d_3's kernel scratch 24.0 MiB"
        """
        from ...units import format_size

        by_layer: dict[str, int] = {}
        for op, nbytes in self.at(batch_size).items():  # a layer's largest: its kernels run one at a time
            layer = layer_of(op) or op
            by_layer[layer] = max(by_layer.get(layer, 0), nbytes)
        largest = sorted(by_layer.items(), key=lambda item: -item[1])[:top]
        return ", ".join(f"{layer}'s kernel scratch {format_size(nbytes)}" for layer, nbytes in largest if nbytes)


__all__ = ["Allocation", "GROWS_WITH_BATCH", "KernelScratch", "MIN_CHUNK_EXCESS_BYTES", "MIN_SCRATCH_BYTES",
           "OUTPUT_REGION", "StepProfile", "chunk_excess", "kernel_scratch"]
