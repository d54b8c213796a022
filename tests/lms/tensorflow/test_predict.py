"""The predicted device peak: the executed graphs' replay against TensorFlow's own allocator."""

import pytest

from lms_magic import LMS
from tests import models

from . import fresh_peak


@pytest.mark.parametrize("name, build, data, batch_size", [
    ("reference cnn", models.reference_cnn, lambda: models.images(64, 64), 32),
    ("residual", models.residual_bn_dropout, lambda: models.images(64, 32), 32),
    ("subclassed", models.custom_step, lambda: models.images(64, 32), 32),
])
def test_replay_without_lms_agrees_with_tensorflows_measured_peak(lms_options, name, build, data, batch_size):
    x, y = data()
    callback = LMS(**lms_options)
    build().fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    predicted = callback.stats.device_peak_bytes_without_lms - callback.stats.persistent_bytes
    measured = fresh_peak.measure(name)  # in a fresh process: see fresh_peak.py for why
    assert abs(predicted - measured) <= 0.25 * measured, (name, predicted / 2**20, measured / 2**20)
