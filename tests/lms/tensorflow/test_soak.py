"""A long-running kernel: plain work after an LMS fit grows memory no more than without it."""

import importlib.util
import os
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "lms_soak.py"
CALLS = int(os.environ.get("LMS_SOAK_CALLS", "24"))  # graphs kept, 0.9 MiB a call, would pass the bound by 24; benchmarks/lms_soak.py runs 120 (and make test-release this test with LMS_SOAK_CALLS=120)
BOUND_BYTES = 10 * 2**20  # how much more the plain calls may grow after an LMS fit than without one


def _soak():
    spec = importlib.util.spec_from_file_location("lms_soak", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plain_calls_after_an_lms_fit_grow_memory_as_without_lms():
    soak = _soak()
    lms, plain = soak.measure("lms", CALLS), soak.measure("plain", CALLS)
    assert lms["swapped_tensors"] > 0  # the LMS side did swap (and read the executed graphs)
    assert lms["rss_growth_bytes"] - plain["rss_growth_bytes"] <= BOUND_BYTES, (lms, plain)
