"""TFLMS's LMSKerasCallback names, for scripts written for IBM's TensorFlow 1 LMS."""

import pytest

from lms_magic import LMSKerasCallback
from lms_magic.testing.backends import FakeBackends

from .test_callback import fit, tiny_model


def test_tflms_and_lms_names_both_work_and_must_agree():
    assert LMSKerasCallback(host_device="/CPU:1").host_device == "/CPU:1"
    assert LMSKerasCallback(cpu_device="/cpu:1").host_device == "/CPU:1"
    assert LMSKerasCallback(cpu_device="/cpu:1", host_device="/device:CPU:1").host_device == "/CPU:1"
    assert LMSKerasCallback(incl_scopes="dense_a").selection.include_layers == ("dense_a",)
    with pytest.raises(ValueError, match="cpu_device='/CPU:0' and host_device='/CPU:1' say different things"):
        LMSKerasCallback(cpu_device="/CPU:0", host_device="/CPU:1")
    with pytest.raises(ValueError, match="excl_types=.* and exclude_types=.* say different things"):
        LMSKerasCallback(excl_types=["Dense"], exclude_types=["Conv2D"])


def test_tflms_names_reach_the_backend_and_ignored_ones_are_said():
    backends = FakeBackends()
    callback = LMSKerasCallback(n_tensors=3, lb=2, excl_types=("Dense",), cpu_device="/CPU:1", min_bytes=0,
                                verbose=0, starting_scope="conv", backend=backends)
    fit(tiny_model(), [callback])
    options = backends.made[0].options
    assert (options.n_tensors, options.lb, options.exclude_types, options.host_device) == (3, 2, ("Dense",), "/CPU:1")
    assert any("ignored TFLMS option(s) starting_scope" in note for note in callback.stats.notes)
