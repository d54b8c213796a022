"""The old Keras 2 call ``fit_generator``, for notebooks written before Keras 3 (fit/legacy.py)."""

import keras
import pytest

from lms_magic import LMS, fit_generator
from tests import models


def test_fit_generator_runs_old_code_with_lms(lms_options):
    x, y = models.images(64, 32)

    def batches():
        while True:
            for start in range(0, 64, 16):
                yield x[start:start + 16], y[start:start + 16]

    callback = LMS(**lms_options)
    history = fit_generator(models.residual_bn_dropout(), batches(), steps_per_epoch=4, epochs=2, verbose=0,
                            callbacks=[callback])
    assert len(history.history["loss"]) == 2 and callback.stats.swapped_tensors > 0
    with pytest.warns(UserWarning, match="workers are ignored"):
        fit_generator(models.residual_bn_dropout(), batches(), steps_per_epoch=1, verbose=0, workers=4)


def test_fit_generator_shuffles_a_pydataset_and_does_not_warn_about_a_generator():
    """Keras 2's fit_generator shuffled only Sequences (now PyDataset); Keras 3 warns when fit gets shuffle=True
    with a generator, which the old default would have passed on every legacy call."""
    import warnings

    x, y = models.images(64, 32)

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return x[16 * index:16 * index + 16], y[16 * index:16 * index + 16]

    def batches():
        while True:
            yield x[:16], y[:16]

    model = models.reference_cnn_small()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_generator(model, batches(), steps_per_epoch=2, verbose=0)
    assert not [w for w in caught if "shuffle" in str(w.message)], [str(w.message) for w in caught]
    seen = []

    class Recording(Batches):
        def __getitem__(self, index):
            seen.append(index)
            return super().__getitem__(index)

    keras.utils.set_random_seed(3)
    fit_generator(model, Recording(), epochs=3, verbose=0)
    assert sorted(seen[-12:]) == sorted([0, 1, 2, 3] * 3)
    assert seen[-12:] != [0, 1, 2, 3] * 3  # the batches came in a shuffled order, as Keras 2 shuffled a Sequence
