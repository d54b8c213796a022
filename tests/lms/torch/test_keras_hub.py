"""KerasHub's GPT-2 backbone (built from a config) trained with LMS on the PyTorch backend: the same losses and
weights as a plain fit, every saved activation offloaded."""

import numpy as np

from lms_magic import LMS
from tests.hub import fit_both


def test_a_kerashub_backbone_trains_as_without_lms():
    callback = LMS(n_tensors=-1, min_bytes=0, verbose=0)
    (plain_loss, plain_weights), (loss, weights) = fit_both("gpt2", callback, sequence=64)
    assert loss == plain_loss
    assert all(np.array_equal(a, b) for a, b in zip(plain_weights, weights))
    stats = callback.stats
    assert stats.swapped_tensors > 0 and stats.device_peak_bytes < stats.device_peak_bytes_without_lms
