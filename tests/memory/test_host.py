import sys

import pytest

from lms_magic.memory.host import PeakWindow, high_water_mark_bytes, rss_bytes

MIB = 2**20
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")


def touch(n_bytes: int) -> None:
    block = bytearray(n_bytes)  # bytearray zero-fills: every page becomes resident
    del block


def test_rss_grows_with_a_kept_block():
    before = rss_bytes()
    block = bytearray(128 * MIB)
    assert rss_bytes() - before >= 120 * MIB
    del block


@linux_only
def test_window_catches_a_short_spike_that_is_already_gone():
    window = PeakWindow().open()
    assert window.exact
    baseline = rss_bytes()
    touch(200 * MIB)
    peak = window.close()
    assert rss_bytes() - baseline < 50 * MIB  # the spike is gone...
    assert peak - baseline >= 195 * MIB  # ...but its peak was kept


@linux_only
def test_inner_window_does_not_hide_the_outer_peak():
    outer = PeakWindow().open()
    baseline = rss_bytes()
    touch(200 * MIB)
    inner = PeakWindow().open()  # resets the kernel's mark
    touch(20 * MIB)
    inner_peak = inner.close()
    outer_peak = outer.close()
    assert inner_peak - baseline < 100 * MIB
    assert outer_peak - baseline >= 195 * MIB


def test_disabled_window_is_not_exact():
    window = PeakWindow(enabled=False).open()
    assert not window.exact
    assert window.close() is None


@linux_only
def test_high_water_mark_is_at_least_rss():
    assert high_water_mark_bytes() >= rss_bytes() - MIB
