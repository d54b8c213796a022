"""The explain tests' simulated accelerator: the closed loop measures steps only on a device it can read."""

import pytest


@pytest.fixture
def simulated(monkeypatch, devices):
    """The tests' split CPU as simulate_accelerator's device of 32 MiB, put back after."""
    import lms_magic
    from lms_magic.lms import devices as lms_devices

    for name in ("_simulated", "_simulated_memory_bytes"):
        monkeypatch.setattr(lms_devices, name, getattr(lms_devices, name))
    lms_magic.simulate_accelerator(memory="32MiB")
