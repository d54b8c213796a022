"""The device's own bytes where the host shares its allocator (the simulated device): the allocator's bytes in use at
each event less what the host held then."""

from lms_magic.lms.core.scratch import Allocation
from lms_magic.lms.core.shared_allocator import HostHeld, device_held

MiB = 2**20


def event(time_ps: int, in_use_mib: float, nbytes_mib: float = 1, freed: bool = False) -> Allocation:
    return Allocation("" if freed else "op", "" if freed else "output", int(nbytes_mib * MiB), time_ps, freed,
                      time_ps, int(in_use_mib * MiB))


def test_the_host_share_of_the_allocator_is_not_the_devices_peak():
    # forward: three activations of 4 MiB (the first two go to the host after their readers); backward: a gradient
    events = [event(10, 5, 4), event(20, 9, 4), event(30, 13, 4), event(40, 17, 4), event(50, 13, 4, freed=True)]
    host = [HostHeld(15, 60, 4 * MiB), HostHeld(25, 60, 4 * MiB)]
    before, peak = device_held(events, host)
    assert before == 1 * MiB
    assert peak == 9 * MiB  # 17 in use at 40, 8 of them the host's; without the host's share: 17
    assert device_held(events, [])[1] == 17 * MiB


def test_the_host_holds_from_its_start_up_to_but_not_at_its_end():
    events = [event(10, 2), event(20, 6, 4), event(30, 10, 4)]
    assert device_held(events, [HostHeld(20, 30, 4 * MiB)])[1] == 10 * MiB  # back on the device at 30
    assert device_held(events, [HostHeld(20, 31, 4 * MiB)])[1] == 6 * MiB
    assert device_held(events, [HostHeld(21, 31, 4 * MiB)])[1] == 6 * MiB  # 20 is the device's: 6 in use then


def test_no_events_hold_nothing():
    assert device_held([], [HostHeld(0, 10, MiB)]) == (0, 0)
