"""LMS tests run on two logical CPU devices: /CPU:0 in the accelerator role, /CPU:1 as host.

TensorFlow fixes its devices when its runtime starts, so they are configured
here, at collection, before any test runs TensorFlow in this process.
"""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _two_logical_cpus() -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        # One op at a time, as on a GPU's compute stream: what the liveness replay models.
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # already initialised (by an earlier test run in this process)
        pass


_two_logical_cpus()

ACCELERATOR, HOST = "/CPU:0", "/CPU:1"


@pytest.fixture
def lms_options():
    """Options that put LMS on the two logical CPUs, printing nothing, swapping every candidate (the tests of
    the swaps themselves; test_real_models.py and test_plan.py test the default plan)."""
    return {"device": ACCELERATOR, "host_device": HOST, "min_bytes": 0, "verbose": 0, "n_tensors": -1}
