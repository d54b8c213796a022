"""The %%lms_fit headline from results made by hand: what it says of the device peaks."""

from lms_magic.fit.results import LmsFitResult, VariantResult
from lms_magic.memory.report import MemoryReport
from lms_magic.units import format_size

MIB = 2**20
ON_THE_SIMULATED_DEVICE = "its allocator less what the host held there, on the simulated device"


def variant(name, stats=None):
    return VariantResult(name=name, status="ok", steps=4, time_per_step_s=0.1, batch_size=8, memory=MemoryReport(),
                         step_losses=[0.9, 0.5], history={"loss": [0.5]}, lms_stats=stats or {})


def lms_stats(**measured):
    return {"active": True, "peak_source": "predicted", "plan_rule": "budget", "budget_bytes": 12 * MIB,
            "device_peak_bytes": 6 * MIB, "device_peak_bytes_without_lms": 18 * MIB, "swapped_tensors": 8,
            "swapped_bytes_per_step": 16 * MIB, **measured}


def test_the_headline_gives_what_the_checked_step_held_beside_the_prediction():
    """Off a GPU the device peaks are LMS's predictions; where LMS read its own checked step, the user reads that
    figure and how it was read, in the same line."""
    held = int(8.1 * MIB)
    stats = lms_stats(measured_step_peak_bytes=held, predicted_step_peak_bytes=6 * MIB,
                      measured_source=ON_THE_SIMULATED_DEVICE)
    headline = LmsFitResult(calls=[[variant("no_lms"), variant("lms", stats)]]).headline()
    assert "predicted device peak -67% (18.0 MiB -> 6.0 MiB" in headline
    assert f"its checked step held {format_size(held)} ({ON_THE_SIMULATED_DEVICE})" in headline
    unread = LmsFitResult(calls=[[variant("no_lms"), variant("lms", lms_stats())]]).headline()
    assert "checked step held" not in unread  # nothing read, nothing said
    # a step read under a plan LMS made again after it: not the step of the plan that stands
    earlier = lms_stats(measured_step_peak_bytes=34 * MIB, predicted_step_peak_bytes=18 * MIB)
    assert "checked step held" not in LmsFitResult(calls=[[variant("no_lms"), variant("lms", earlier)]]).headline()
