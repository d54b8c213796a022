"""Trains one real-architecture case with TensorFlow made reproducible, plainly twice and with each LMS plan.

Run by ``test_same_math.py`` in a process of its own: TensorFlow reads ``TF_ENABLE_ONEDNN_OPTS`` once, at import, and
the other tests run with oneDNN on. Here oneDNN is off and ``enable_op_determinism()`` on, so two plain fits agree
to the bit and any difference LMS makes is LMS's own. Prints one JSON object: for the second plain fit and each LMS
plan, whether its per-step losses and final weights equal the first plain fit's, to the bit, and what the plan moved.

    python -m tests.lms.tensorflow.same_math transformer-adam
"""

from __future__ import annotations

import json
import os
import sys

# Each LMS plan as a user would ask for it; every tensor size eligible (at 32x32 and batch 4 most activations are
# below the default 64 KiB floor). The hybrid plan's bit-identity is test_hybrid.py's (and benchmarks/modes.py's).
PLANS = {
    "swap every candidate": dict(n_tensors=-1),
    "recompute only": dict(n_tensors=-1, recompute="only"),
}


def main(case_id: str) -> dict:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.experimental.enable_op_determinism()
    import numpy as np

    from lms_magic import LMS
    from tests.conftest import DEVICES
    from tests.lms.tensorflow.real_models import FULL, QUICK

    case = next(case for case in QUICK + FULL if case.id == case_id)
    _, plain_losses, (_, plain_weights) = case.fit()

    def same(losses, weights) -> dict:
        return {"losses": losses == plain_losses, "first_loss": losses[:1] == plain_losses[:1],
                "weights": bool(np.array_equal(weights, plain_weights)),
                "max_weight_difference": float(np.max(np.abs(weights - plain_weights)))}

    _, losses, (_, weights) = case.fit()
    result = {"plain again": same(losses, weights)}
    for plan, options in PLANS.items():
        callback = LMS(device=DEVICES.accelerator, host_device=DEVICES.host, verbose=0, min_bytes=0, **options)
        _, losses, (_, weights) = case.fit(callback)
        stats = callback.stats
        result[plan] = {**same(losses, weights), "swapped": stats.swapped_tensors,
                        "recomputed": stats.recomputed_tensors, "steps": stats.steps}
    return result


if __name__ == "__main__":  # set before TensorFlow is imported (importing this module sets nothing)
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    print(json.dumps(main(sys.argv[1])))
