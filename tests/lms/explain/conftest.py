"""The explain tests' simulated accelerator: the closed loop measures steps only on a device it can read."""

import pytest


@pytest.fixture
def simulated(accelerator_memory):
    """The tests' split CPU as simulate_accelerator's device of 32 MiB, put back after."""
    accelerator_memory("32MiB")


@pytest.fixture
def copies_costing(monkeypatch):
    """Sets the host link, for the test, to one over which the copies of every eligible tensor at a batch take a
    share of the step's estimated compute each way (this machine's rate: the same copies would hide under a slower
    CPU's compute): ``copies_costing(session, batch_size, device, share)``, ``session`` a ``TuningSession``. Over a
    third, a step with them takes longer than one with fewer."""
    from lms_magic.memory import bandwidth

    def set_link(session, batch_size: int, device: str, share: float) -> None:
        compute_s = session.predictor.estimated_compute_s(batch_size, device)
        bytes_per_s = session.predictor.predict(-1, 1, batch_size).swapped_bytes_per_step / (share * compute_s)
        link = bandwidth.LinkBandwidth(bytes_per_s, bytes_per_s, "a test's link")
        monkeypatch.setattr(bandwidth, "host_link_bandwidth", lambda: link)

    return set_link
