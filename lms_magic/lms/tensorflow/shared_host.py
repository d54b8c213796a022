"""An LMS step's own device bytes on ``simulate_accelerator``'s device, whose host shares the device's allocator
(no TensorFlow import).

The profiler's allocator events of the step (``internals.step_profiled``) count the device's bytes and the host's
together. Along each swapped tensor's route in the executed partition graphs (``partitions.swap_routes``), the same
profile says when the host held it: from the end of its last reader on the device until it lands back (or, where
the host's swap-in copied it, until that copy ran; the copy itself until it is freed or lands).
``core.shared_allocator`` takes those bytes off the allocator's.
"""

from __future__ import annotations

from typing import Callable

from ..core.scratch import OUTPUT_REGION
from ..core.shared_allocator import HostHeld, device_held
from .graph import op_name_in_step, swapped_tensor_name
from .partitions import SwapRoute

GRANULE_BYTES = 256  # the BFC allocator rounds each allocation up to this


def host_held(profile, routes: list[SwapRoute], size_of: Callable[[str, str, int], int | None]
              ) -> tuple[list[HostHeld], int]:
    """What the host held in the profiled step (``profile``: a ``core.scratch.StepProfile``) along ``routes``, and
    how many routes the profile did not show (their tensor's size unknown to the trace and the allocator, or no
    reader of it seen run).

    Example:
        >>> from lms_magic.lms.core.scratch import Allocation, StepProfile
        >>> profile = StepProfile([Allocation("relu", "output", 512, 1, False, 10, 1512),
        ...                        Allocation("grad/lms_landed_0", "output", 512, 2, False, 60, 2024),
        ...                        Allocation("", "", 512, 1, True, 61, 1512)],
        ...                       {"relu": (5, 10), "pool": (12, 20), "grad/lms_landed_0": (60, 61)})
        >>> route = SwapRoute("relu", "Relu", 0, ("pool",), ("lms_swap_in/relu",), ("grad/lms_landed_0",))
        >>> host_held(profile, [route], lambda name, op, index: 500)  # from pool's end to the landing's copy
        ([HostHeld(start_ps=20, end_ps=61, nbytes=512)], 0)
        >>> chunk = StepProfile([Allocation("relu", "output", 1024, 1, False, 10, 2024)] + profile.events[1:],
        ...                     profile.runs)  # the allocator gave relu a chunk of twice its bytes
        >>> host_held(chunk, [route], lambda name, op, index: 500)[0]
        [HostHeld(start_ps=20, end_ps=61, nbytes=1024)]
    """
    runs = {op_name_in_step(name): span for name, span in profile.runs.items()}
    allocated: dict[str, list] = {}  # op -> its allocations (time, address, bytes)
    outputs: dict[str, list] = {}  # op -> those of its outputs (not its kernel's scratch)
    frees: dict[int, list[int]] = {}  # address -> when freed
    for event in profile.events:
        if event.freed:
            frees.setdefault(event.address, []).append(event.time_ps)
        elif event.op:
            allocated.setdefault(op_name_in_step(event.op), []).append((event.time_ps, event.address, event.nbytes))
            if event.region == OUTPUT_REGION:
                outputs.setdefault(op_name_in_step(event.op), []).append((event.time_ps, event.address, event.nbytes))
    step_end = profile.events[-1].time_ps + 1 if profile.events else 0
    held, unseen = [], 0
    for route in routes:
        nbytes = _size(route, size_of, allocated)
        read = [runs[name][1] for name in map(op_name_in_step, route.readers) if name in runs]
        producer = runs.get(op_name_in_step(route.producer))
        if not nbytes or not (read or producer):
            unseen += 1
            continue
        start = max(read) if read else producer[1]
        landings = [runs[name] for name in map(op_name_in_step, route.landings) if name in runs]
        landing_start = min((span[0] for span in landings), default=step_end)
        landing_end = max((span[1] for span in landings), default=step_end)
        landed_as_copy = any(op_name_in_step(name) in allocated for name in route.landings)
        returned = landing_end if landed_as_copy else landing_start  # a buffer the landing took on is the device's
        copies = [found for name in route.swap_ins for found in allocated.get(op_name_in_step(name), ())]
        counted = _counted(route, nbytes, outputs, frees, start)
        if not copies:
            held.append(HostHeld(start, returned, counted))
            continue
        copied = max((runs[name][1] for name in map(op_name_in_step, route.swap_ins) if name in runs),
                     default=returned)
        held.append(HostHeld(start, copied, counted))
        for time_ps, address, size in copies:
            freed = [at for at in frees.get(address, ()) if at > time_ps]
            held.append(HostHeld(time_ps, min([returned] + freed[:1]), size))
    return held, unseen


def _counted(route: SwapRoute, nbytes: int, outputs: dict, frees: dict, start_ps: int) -> int:
    """What the allocator counts for ``route``'s tensor while the host holds it (from ``start_ps``): the chunk its
    producer was given for an output (``outputs``: by op, (time, address, bytes)), still allocated then (BFC serves
    a request from a free chunk up to twice its size and counts the whole chunk), else its bytes rounded to the
    allocator's granule."""
    rounded = -(-nbytes // GRANULE_BYTES) * GRANULE_BYTES
    chunks = [size for time_ps, address, size in outputs.get(op_name_in_step(route.producer), ())
              if rounded <= size <= 2 * rounded and time_ps <= start_ps
              and not any(time_ps < at <= start_ps for at in frees.get(address, ()))]
    return min(chunks, default=rounded)


def _size(route: SwapRoute, size_of, allocated: dict) -> int | None:
    """The bytes of ``route``'s tensor: the traced step's size of its producer, or (an op Grappler made in its place)
    of the traced tensor its swap-in names, or what the allocator gave the producer or a copy of it."""
    found = size_of(route.producer, route.op_type, route.index)
    for swap_in in route.swap_ins:
        if found:
            break
        traced, _, index = (swapped_tensor_name(swap_in) or "").rpartition("_")
        found = size_of(traced, route.op_type, int(index)) if traced and index.isdigit() else None
    return found or max((size for name in (route.producer, *route.swap_ins, *route.landings)
                         for _, _, size in allocated.get(op_name_in_step(name), ())), default=None)


def lms_step_held(profile, routes: list[SwapRoute], size_of) -> tuple[int, int, int]:
    """(what the device held before the step, the most it held in it, the routes not seen): the profiled step's
    allocator less what the host held along ``routes``."""
    held, unseen = host_held(profile, routes, size_of)
    before, peak = device_held(profile.events, held)
    return before, peak, unseen


__all__ = ["GRANULE_BYTES", "host_held", "lms_step_held"]
