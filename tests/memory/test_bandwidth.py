"""The host link's bandwidth: timed copies with an injected clock, and the stated default without a GPU."""

import sys


from lms_magic.memory import bandwidth
from lms_magic.memory.bandwidth import DEFAULT_BYTES_PER_S, LinkBandwidth, host_link_bandwidth, time_copies


def test_the_median_of_timed_copies_after_a_warm_up():
    copies = []
    ticks = iter([0.0, 1.0, 10.0, 10.5, 20.0, 24.0])  # 1 s, 0.5 s, 4 s
    rate = time_copies(lambda: copies.append(1), lambda: None, 1000, repeats=3, clock=lambda: next(ticks))
    assert rate == 1000.0 and len(copies) == 4  # the warm-up is not timed


def test_the_slowest_direction_bounds_a_step():
    assert LinkBandwidth(25e9, 20e9, "measured").slowest == 20e9


def test_without_a_gpu_the_default_is_stated(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # neither framework can measure here
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    host_link_bandwidth.cache_clear()
    try:
        found = host_link_bandwidth()
    finally:
        host_link_bandwidth.cache_clear()
    assert found.host_to_device == found.device_to_host == DEFAULT_BYTES_PER_S
    assert found.source.startswith("no GPU: a stated default of 12 GB/s")


def test_a_measurement_that_fails_falls_back_and_is_measured_once(monkeypatch):
    calls = []

    def failing():
        calls.append(1)
        raise RuntimeError("no CUDA after all")

    monkeypatch.setattr(bandwidth, "MEASURES", (failing,))
    host_link_bandwidth.cache_clear()
    try:
        assert host_link_bandwidth().source.startswith("no GPU") and host_link_bandwidth() is host_link_bandwidth()
    finally:
        host_link_bandwidth.cache_clear()
    assert calls == [1]
