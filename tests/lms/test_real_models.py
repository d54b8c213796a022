"""LMS on architectures nobody in this project wrote: five ``keras.applications`` models (64x64 images) and a
Transformer made of Keras layers, batch 8, with SGD and with Adam, trained for a step as a user would
(``LMS()`` with its default plan) on the two logical CPUs."""

import keras
import numpy as np
import pytest

from lms_magic import LMS
from lms_magic.lms.plan import Selection
from lms_magic.lms.predictor import StepPredictor

from .conftest import ACCELERATOR, HOST


def application(name, size=64):
    def build():
        keras.utils.set_random_seed(5)
        return getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10,
                                                 classifier_activation=None)

    build.__name__ = name
    return build


def transformer(length=32, vocabulary=1000, width=64, blocks=2):
    keras.utils.set_random_seed(6)
    tokens = keras.Input((length,), dtype="int32")
    x = keras.layers.Embedding(vocabulary, width)(tokens)
    for _ in range(blocks):
        attended = keras.layers.MultiHeadAttention(num_heads=4, key_dim=width // 4)(x, x)
        x = keras.layers.LayerNormalization()(x + attended)
        fed = keras.layers.Dense(width)(keras.layers.Dense(4 * width, activation="gelu")(x))
        x = keras.layers.LayerNormalization()(x + fed)
    outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(x))
    return keras.Model(tokens, outputs, name="transformer")


MODELS = [application("MobileNetV2"), application("ResNet50"), application("DenseNet121"),
          application("EfficientNetB0"), application("MobileNetV3Small"), transformer]
OPTIMIZERS = {"sgd": lambda: keras.optimizers.SGD(0.01, momentum=0.9), "adam": lambda: keras.optimizers.Adam(1e-3)}


def batch_for(model, n=8):
    rng = np.random.default_rng(0)
    shape = tuple(model.inputs[0].shape[1:])
    if model.inputs[0].dtype.startswith("int"):
        x = rng.integers(0, 1000, (n,) + shape).astype("int32")
    else:
        x = rng.random((n,) + shape, dtype="float32")
    return x, rng.integers(0, 10, n)


def compiled(build, optimizer):
    model = build()
    model.compile(OPTIMIZERS[optimizer](), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("build", MODELS, ids=lambda build: build.__name__)
def test_the_default_plan_is_never_worse_than_no_lms(build, optimizer):
    model = compiled(build, optimizer)
    x, y = batch_for(model)
    callback = LMS(device=ACCELERATOR, host_device=HOST, verbose=0)  # as a user would: the default plan
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
    stats = callback.stats
    assert stats.active and stats.plan_rule == "lowest predicted peak"
    assert np.isfinite(history.history["loss"]).all()
    with_lms, without_lms = stats.traced_device_peaks  # what the plan was chosen on
    assert with_lms <= without_lms
    if stats.swapped_tensors == 0:  # said why: no plan helps on the traced graph, or not on the executed one
        assert any("no swap lowers the predicted peak" in note or "no tensor is swapped after the first step" in note
                   for note in stats.notes), stats.notes
    # the replay of the graphs TensorFlow executed (after Grappler and placement): what stats report
    assert stats.prediction_source == "executed partition graphs"
    assert stats.device_peak_bytes <= stats.device_peak_bytes_without_lms, (stats.device_peak_bytes,
                                                                            stats.device_peak_bytes_without_lms)
    # the peak explained, with LMS and without: where it is, what fills it (adding up), the largest tensors
    # the model's variables: its weights, and the seed states of its Dropout layers
    weights = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in {id(v): v for v in model.variables}.values())
    for peak, total in ((stats.peak, stats.device_peak_bytes),
                        (stats.peak_without_lms, stats.device_peak_bytes_without_lms)):
        assert peak["bytes"] == total == sum(peak["by_kind"].values())
        assert peak["phase"] in ("forward", "backward", "optimizer") and peak["op"]
        assert peak["by_kind"]["weights"] == weights
        trainable = sum(int(np.prod(w.shape)) * 4 for w in model.trainable_weights)
        assert peak["by_kind"]["optimizer_state"] >= (2 if optimizer == "adam" else 1) * trainable  # slots
        sizes = [row["bytes"] for row in peak["top"]]
        assert len(sizes) == 10 and sizes == sorted(sizes, reverse=True) and sizes[0] > 0
        assert all(row["layer"] and row["kind"] in peak["by_kind"] for row in peak["top"])
    assert stats.peak_without_lms["by_kind"]["activations_swapped_in"] == 0


# Where LMS is not bit-identical (README, "Values are only copied"): bisected to swapping MobileNetV3Small's
# first BatchNormalization output (before its hard-swish) and the Transformer's GELU intermediate; why is not
# found. Relative differences after three Adam steps, measured 5.6e-6 (weights) / 5.6e-7 (loss) and
# 1.2e-7 (weights) / 0 (loss); the README states 1e-5.
NOT_BIT_IDENTICAL = {"MobileNetV3Small": 1e-5, "transformer": 1e-5}


@pytest.mark.parametrize("build", MODELS, ids=lambda build: build.__name__)
def test_lms_trains_as_without_it(build):
    """Every candidate swapped, Adam, three steps: the same losses and weights as a plain fit, to the bit
    (or within the README's stated tolerance, on the two models where it says so)."""
    x, y = batch_for(build())
    results = []
    for callbacks in ([], [LMS(device=ACCELERATOR, host_device=HOST, verbose=0, n_tensors=-1, min_bytes=0)]):
        model = compiled(build, "adam")
        history = model.fit(np.concatenate([x] * 3), np.concatenate([y] * 3), batch_size=8, epochs=1, verbose=0,
                            shuffle=False, callbacks=callbacks)
        results.append((history.history["loss"], np.concatenate([w.ravel() for w in model.get_weights()])))
    assert callbacks[0].stats.swapped_tensors == callbacks[0].stats.candidates > 0
    (plain_loss, plain_weights), (lms_loss, lms_weights) = results
    tolerance = NOT_BIT_IDENTICAL.get(build.__name__)
    if tolerance is None:
        assert lms_loss == plain_loss
        assert np.array_equal(plain_weights, lms_weights)
    else:
        assert lms_loss == pytest.approx(plain_loss, rel=tolerance, abs=0)
        assert np.linalg.norm(lms_weights - plain_weights) <= tolerance * np.linalg.norm(plain_weights)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_planning_beats_swapping_everything_where_that_raises_the_peak(optimizer):
    """EfficientNetB0 with Adam: swapping every candidate was predicted above no LMS (issue 12)."""
    model = compiled(application("EfficientNetB0", size=64), optimizer)
    predictor = StepPredictor(model, batch_for(model, 2), Selection(min_bytes=0), host_device=HOST)
    planned, everything = predictor.planned(1, 8), predictor.predict(-1, 1, 8)
    assert planned.peak_bytes < planned.peak_bytes_without_lms
    assert planned.peak_bytes <= 1.01 * everything.peak_bytes  # within the plan's 1%, moving fewer bytes
    assert planned.swapped_bytes_per_step <= everything.swapped_bytes_per_step
