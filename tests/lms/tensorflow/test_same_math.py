"""LMS never changes the math: checked to the bit, with TensorFlow made reproducible.

TensorFlow's CPU runs are not always reproducible (oneDNN's threaded kernels; BatchNormalization on random data
amplifies rounding), so a comparison with one plain fit could pass or fail by chance. Each case here trains in a
process of its own (``same_math.py``) with oneDNN off and ``enable_op_determinism()`` on: two plain fits agree to
the bit there, which the test checks first, and then every candidate swapped, and every recomputable one
recomputed, must give the same per-step losses and final weights, to the bit. ``make test`` runs the Transformer;
``make test-release`` the reduced architectures and the whole keras.applications models too, where recompute has
exceptions (docs/lms_modes.md, "Same math").

"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lms.tensorflow.same_math import PLANS
from tests.lms.tensorflow.real_models import FULL, QUICK

ROOT = Path(__file__).resolve().parents[3]


# recompute="only" differs at float rounding on these (docs/lms_modes.md, "Same math": the causes traced)
RECOMPUTE_DIFFERS = {"ResNet50", "MobileNetV2", "MobileNetV3Small"}


# make test: the Transformer (the GELU whose gradient Grappler regrouped around a swap; make test stays under 10
# minutes); the reduced CNNs and the whole models in make test-release
IN_MAKE_TEST = {"transformer-adam"}


@pytest.mark.parametrize("case", [pytest.param(case, id=case.id, marks=() if case.id in IN_MAKE_TEST else
                                               pytest.mark.release) for case in QUICK] +
                         [pytest.param(case, id="full-" + case.id, marks=pytest.mark.release) for case in FULL])
def test_every_lms_plan_trains_bit_identically_to_a_reproducible_plain_fit(case):
    env = {key: value for key, value in os.environ.items() if key != "TF_ENABLE_ONEDNN_OPTS"}
    run = subprocess.run([sys.executable, "-m", "tests.lms.tensorflow.same_math", case.id],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    again = result["plain again"]
    assert again["losses"] and again["weights"], f"two plain fits differ ({again}): the check below would mean nothing"
    for plan in PLANS:
        outcome = result[plan]
        assert outcome["steps"] == case.steps, (plan, outcome)
        if plan == "recompute only" and case.name in RECOMPUTE_DIFFERS:
            assert outcome["first_loss"], (plan, outcome)  # the first update is where they part
            continue
        assert outcome["losses"] and outcome["weights"], (plan, outcome)
    moved = {plan: result[plan]["swapped"] + result[plan]["recomputed"] for plan in PLANS}
    assert moved["swap every candidate"] > 0 and result["recompute only"]["recomputed"] > 0, moved
