"""Faults at seeded random points of `fit` and `%%lms_fit --compare`: how many leave a clean state.

Runs the fault-injection tests of tests/lms/test_faults.py with 200 cases
(make test runs the first 20, make test-all 60): each case trains with LMS and raises a
KeyboardInterrupt or an exception at a random point (data, callbacks, trace,
step, first-batch summary, out of memory), then checks the model's attributes,
Grappler's options, TensorFlow's graph collection, and that a plain fit trains
plainly. Goal: 200 clean states out of 200.

    python benchmarks/lms_interrupts.py [--cases 200]
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    cases = parser.parse_args().cases
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "-m", "release or not release",
                           "tests/lms/test_faults.py::test_faults_at_random_points_leave_nothing_behind",
                           "tests/lms/test_faults.py::test_more_faults_at_random_points_leave_nothing_behind"],
                          cwd=ROOT, env={**os.environ, "LMS_FAULT_CASES": str(cases)}, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        print(done.stdout[-4000:])
        print(f"FAILED: a case left state behind (above), {elapsed:.0f} s")
        sys.exit(1)
    print(f"{cases} faults at seeded random points: {cases} clean states out of {cases} ({elapsed:.0f} s)")


if __name__ == "__main__":
    main()
