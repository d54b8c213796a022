"""The explain tests' simulated accelerator: the closed loop measures steps only on a device it can read."""

import pytest


@pytest.fixture
def simulated(accelerator_memory):
    """The tests' split CPU as simulate_accelerator's device of 32 MiB, put back after."""
    accelerator_memory("32MiB")
