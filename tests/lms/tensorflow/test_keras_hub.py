"""KerasHub's GPT-2 backbone (built from a config) trained with LMS on TensorFlow, in a fresh process with TensorFlow
made reproducible (oneDNN off, op determinism) and a simulated accelerator: losses and weights bit-identical to a
plain fit's, at a lower predicted peak."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("keras_hub", reason="keras-hub is installed by `make install` (no-deps)")

SCRIPT = textwrap.dedent("""
    import json, sys
    import lms_magic
    lms_magic.simulate_accelerator()
    import numpy as np, tensorflow as tf
    from lms_magic import LMS
    from tests.hub import fit_both
    tf.config.experimental.enable_op_determinism()
    callback = LMS(min_bytes=0, verbose=0)  # the default plan: a probe, then the plan on the executed graphs
    (plain_loss, plain_weights), (loss, weights) = fit_both("gpt2", callback, epochs=2, layers=1, sequence=64)
    stats = callback.stats
    print(json.dumps({"same_loss": loss == plain_loss, "loss": loss,
                      "same_weights": all(np.array_equal(a, b) for a, b in zip(plain_weights, weights)),
                      "moved": stats.swapped_tensors, "peak": stats.device_peak_bytes,
                      "without": stats.device_peak_bytes_without_lms}))
""")


def test_a_kerashub_backbone_trains_bit_identically_at_a_lower_peak():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))),
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0",
                               "KERAS_BACKEND": "tensorflow"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["same_loss"] and found["same_weights"], found["loss"]
    assert found["moved"] > 0 and found["peak"] < found["without"]
