"""The device's own bytes in a step whose host shares the device's allocator (pure Python).

``simulate_accelerator``'s two logical devices are one CPU behind one allocator: the allocator counts what the device
and the host hold together. Between the two, a CPU passes a tensor on without a copy, so a swapped tensor's buffer
stays allocated while the host holds it. What the device itself held at an allocator event is the bytes in use then
less what the host held then (:class:`HostHeld`: a swapped tensor from its last reader on the device until it lands
back, a copy a host op made until it is freed or lands), and the step's device peak is the most of that at any event.

Example:
    >>> from lms_magic.lms.core.scratch import Allocation
    >>> events = [Allocation("relu", "output", 400, 1, False, time_ps=10, in_use_bytes=1400),
    ...           Allocation("conv", "output", 600, 2, False, time_ps=20, in_use_bytes=2000),
    ...           Allocation("", "", 600, 2, True, time_ps=30, in_use_bytes=1400)]
    >>> device_held(events, [HostHeld(15, 40, 400)])  # relu's output on the host from 15 on: 2000 in use at 20
    (1000, 1600)
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence


class HostHeld(NamedTuple):
    """Bytes the host held in the shared allocator from ``start_ps`` (included) to ``end_ps`` (excluded)."""

    start_ps: int
    end_ps: int
    nbytes: int


def device_held(events: Sequence, host_held: Iterable[HostHeld]) -> tuple[int, int]:
    """What the device held before the first of a step's allocator ``events`` (``core.scratch.Allocation``s in time
    order, each with the bytes in use after it), and the most it held after any of them: the bytes in use less the
    ``host_held`` at the event's time. (0, 0) where there are no events.

    Example:
        >>> from lms_magic.lms.core.scratch import Allocation
        >>> device_held([Allocation("", "", 100, 1, True, time_ps=5, in_use_bytes=900)], [])
        (1000, 1000)
    """
    if not events:
        return 0, 0
    first = events[0]
    before = first.in_use_bytes + (first.nbytes if first.freed else -first.nbytes)
    changes = sorted([(held.start_ps, held.nbytes) for held in host_held if held.end_ps > held.start_ps] +
                     [(held.end_ps, -held.nbytes) for held in host_held if held.end_ps > held.start_ps])
    host, index, most = 0, 0, before
    for event in events:
        while index < len(changes) and changes[index][0] <= event.time_ps:
            host += changes[index][1]
            index += 1
        most = max(most, event.in_use_bytes - host)
    return before, most


__all__ = ["HostHeld", "device_held"]
