"""A second fit of the same model does not plan again: the plan the first fit checked is reused (lms/memo.py).

The default plan is the expensive one: its first step probes (every eligible tensor swapped), the graphs
TensorFlow executed are replayed to plan, and the train function is traced again with the plan. A second fit
of the same model, options and batch moves the same tensors from its first step, with none of that.
"""

import keras
import numpy as np
import pytest

from lms_magic import LMS
from lms_magic.lms.tensorflow.planner import TracePlanner
from tests import models

REUSED = "the plan an earlier fit of this model checked at this batch"


@pytest.fixture
def searches(monkeypatch):
    """Counts the plan searches LMS makes (on the traced graph and on the executed one)."""
    calls = []
    search = TracePlanner.search

    def counted(self, *args, **kwargs):
        calls.append(1)
        return search(self, *args, **kwargs)

    monkeypatch.setattr(TracePlanner, "search", counted)
    return calls


def default_plan(devices, **options):
    return LMS(device=devices.accelerator, host_device=devices.host, min_bytes=0, verbose=0, **options)


def fit(model, callback, batch_size=16):
    return model.fit(*models.images(64, 32), batch_size=batch_size, epochs=1, verbose=0, shuffle=False,
                     callbacks=[callback])


def test_a_second_fit_reuses_the_checked_plan_and_trains_as_the_first(devices, searches):
    model = models.residual_bn_dropout()
    first = default_plan(devices)
    fit(model, first)
    assert searches and first.stats.swapped_tensors > 0 and first.stats.partition_graphs  # probed and replayed
    searches.clear()
    second = default_plan(devices)
    history = fit(model, second)
    assert not searches and second.stats.partition_graphs is None  # nothing planned, nothing replayed
    assert second.stats.plans_tried == 0 and first.stats.plans_tried > 0
    assert any(REUSED in note for note in second.stats.notes)
    assert [row["tensor"] for row in second.stats.plan] == [row["tensor"] for row in first.stats.plan]
    assert second.stats.device_peak_bytes == first.stats.device_peak_bytes
    assert second.stats.swapped_tensors == first.stats.swapped_tensors and second.stats.steps == 4
    # the same math: a twin trained the same way first, then plainly
    twin = models.residual_bn_dropout()
    fit(twin, default_plan(devices))
    plain_history = twin.fit(*models.images(64, 32), batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert history.history["loss"] == plain_history.history["loss"]
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), twin.get_weights()))


@pytest.mark.parametrize("change", ["compile again", "another batch size", "other options"])
def test_a_plan_is_made_again_when_what_it_depends_on_changes(devices, searches, change):
    model = models.residual_bn_dropout()
    fit(model, default_plan(devices))
    searches.clear()
    options, batch_size = {}, 16
    if change == "compile again":
        model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    elif change == "another batch size":
        batch_size = 8
    else:
        options = {"exclude_types": ["Dropout"]}
    second = default_plan(devices, **options)
    fit(model, second, batch_size=batch_size)
    assert searches and not any(REUSED in note for note in second.stats.notes)

