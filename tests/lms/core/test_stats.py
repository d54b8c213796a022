"""LmsStats: one typed record, read by attribute or key, exported plain."""

import pytest

from lms_magic import LmsStats


def test_keys_attributes_and_the_export_agree():
    stats = LmsStats(active=True, backend="tensorflow", swapped_tensors=2, swapped_bytes_per_step=300,
                     device_peak_bytes=1000, peak_source="predicted", plan=[{"bytes": 100}, {"bytes": 200}],
                     records=["an op"], partition_graphs=["a graph"])
    assert stats.swapped_tensors == stats["swapped_tensors"] == 2 and "plan" in stats
    assert stats.predicted_device_peak_bytes == 1000 and stats.measured_device_peak_bytes is None
    exported = stats.to_dict()
    assert {"swapped_tensors", "swapped_bytes_per_step", "device_peak_bytes", "device_peak_bytes_without_lms",
            "peak_source", "lb_counts", "plan", "notes", "steps"} <= set(exported)
    assert "records" not in exported and "partition_graphs" not in exported  # graph objects stay behind
    exported["plan"].append({})
    assert len(stats.plan) == 2  # lists are copied


def test_a_misspelt_name_is_an_error_that_names_the_real_ones():
    stats = LmsStats()
    with pytest.raises(KeyError, match="swapped_tensors"):
        stats["swaped_tensors"]
    with pytest.raises(AttributeError):
        stats.update(swaped_tensors=1)
    assert stats.get("swaped_tensors", "none") == "none"
