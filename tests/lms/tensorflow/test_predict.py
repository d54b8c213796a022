"""The predicted device peak: the executed graphs' replay against TensorFlow's own allocator."""

import pytest

from lms_magic import LMS
from tests import models

from . import fresh_peak


@pytest.mark.parametrize("name, build, data, batch_size", [
    ("reference cnn", models.reference_cnn_small, lambda: models.images(64, 32), 32),
    ("residual", models.residual_bn_dropout, lambda: models.images(64, 32), 32),
    ("subclassed", models.custom_step, lambda: models.images(64, 32), 32),
])
def test_replay_without_lms_agrees_with_tensorflows_measured_peak(lms_options, name, build, data, batch_size):
    x, y = data()
    callback = LMS(**lms_options)
    build().fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    predicted = callback.stats.device_peak_bytes_without_lms - callback.stats.persistent_bytes
    measured = fresh_peak.measure(name)  # the median of fresh processes: see fresh_peak.py for why
    assert abs(predicted - measured) <= 0.25 * measured, (name, predicted / 2**20, measured / 2**20)


@pytest.mark.release
@pytest.mark.parametrize("spec", ["ResNet50:128:16", "DenseNet121:128:16", "MobileNetV2:128:16",
                                  "EfficientNetB0:128:16"])
def test_on_the_models_the_docs_use_the_replay_is_within_15_percent_of_the_allocators_peak(lms_options, spec):
    """The release check of the replay's accuracy (docs/measurements.md): the executed graphs' replay without LMS
    (the step's own bytes) against TensorFlow's allocator peak of a plain step of the same model: the median of three
    fresh processes.
    The measured peak itself moves about 10% between runs of the same fit on this CPU."""
    name, size, batch = fresh_peak.spec_of(spec)
    model, (x, y) = fresh_peak.application(name, size, batch)
    callback = LMS(**lms_options)
    model.fit(x[:batch], y[:batch], batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    predicted = callback.stats.device_peak_bytes_without_lms - callback.stats.persistent_bytes
    measured = fresh_peak.measure(spec)
    assert 0.85 <= predicted / measured <= 1.15, (spec, predicted / 2**20, measured / 2**20)
