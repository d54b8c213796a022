"""order_backward=True: the backward pass one layer's gradient at a time, on the two logical CPUs.

keras.applications' own ResNet builder at a reduced depth (bottleneck blocks whose output gradient forks
into the branch and a convolution shortcut, each with its BatchNormalization) is where the order lowers
the peak; 20 rows at batch 8 make the last batch of 4 traced again (the order is made on that trace too).
"""

import keras
import numpy as np
import pytest

from lms_magic import LMS
from tests import models
from tests.conftest import DEVICES
from tests.lms.tensorflow.real_models import StepRecord, reduced


def fit(build, x, y, batch_size=8, **options):
    """``build()`` trained one epoch (two steps' worth of weights compared); returns (losses, weights, callback)."""
    callback = LMS(device=DEVICES.accelerator, host_device=DEVICES.host, verbose=0, **options) \
        if options else None
    model = build()
    record = StepRecord()
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False,
              callbacks=[record] + ([callback] if callback else []))
    return record.losses, model.get_weights(), callback


@pytest.mark.release  # make test-release: 26 s; make test orders the backward pass in the test below and in the magics'
def test_resnet_blocks_train_bit_identically_one_layer_at_a_time_at_a_lower_predicted_peak(devices):
    rng = np.random.default_rng(0)
    x, y = rng.random((20, 32, 32, 3), dtype="float32"), rng.integers(0, 10, 20)
    build = reduced("resnet")

    def compiled():
        model = build()
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    plain_losses, plain_weights, _ = fit(compiled, x, y)
    losses, weights, ordered = fit(compiled, x, y, n_tensors=-1, order_backward=True)
    _, _, unordered = fit(compiled, x, y, n_tensors=-1)  # off by default
    assert ordered.stats.ordered_layers > 0 and unordered.stats.ordered_layers == 0
    assert ordered.stats.swapped_tensors > 0
    assert losses == plain_losses
    assert all(np.array_equal(a, b) for a, b in zip(weights, plain_weights))
    # the same tensors swapped (and some more: a swap-in can now wait for the layer before its reader)
    assert ordered.stats.swapped_tensors >= unordered.stats.swapped_tensors
    assert ordered.stats.prediction_source == unordered.stats.prediction_source == "executed partition graphs"
    assert ordered.stats.device_peak_bytes < unordered.stats.device_peak_bytes
    # "without LMS" is Keras's own step: the order undone with the swaps (kept, it is 3.5% lower here), within
    # the few small ops Grappler no longer merges across layers that wait on different joins (0.02% here)
    without, keras_own = ordered.stats.device_peak_bytes_without_lms, unordered.stats.device_peak_bytes_without_lms
    assert abs(without - keras_own) <= 0.001 * keras_own, (without, keras_own)
    assert "backward pass one layer at a time" in ordered.summary()
    assert "one layer at a time" not in unordered.summary()


@pytest.mark.release  # make test-release: make test stays under 10 minutes
def test_where_the_order_lowers_nothing_tensorflow_keeps_its_own(devices):
    x, y = models.images(32, 32)
    losses, weights, callback = fit(models.reference_cnn_small, x, y, batch_size=16, n_tensors=-1, min_bytes=0,
                                    order_backward=True)
    plain_losses, plain_weights, _ = fit(models.reference_cnn_small, x, y, batch_size=16)
    assert callback.stats.swapped_tensors > 0
    assert callback.stats.ordered_layers == 0  # one chain of layers: no sibling to wait for
    assert losses == plain_losses


@pytest.mark.release  # make test-release: make test stays under 10 minutes
def test_a_layer_called_twice_trains_as_without_the_order(devices):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((16, 16, 3))
    shared = keras.layers.Conv2D(8, 3, padding="same", activation="relu")
    x = keras.layers.Conv2D(8, 3, padding="same")(inputs)
    x = shared(keras.layers.BatchNormalization()(shared(x)))  # its gradient ops around another layer's
    model_outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x))

    def build():
        model = keras.Model(inputs, model_outputs)
        model.set_weights(weights_at_start)
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    weights_at_start = keras.Model(inputs, model_outputs).get_weights()
    x_data, y_data = models.images(24, 16)
    losses, weights, callback = fit(build, x_data, y_data, n_tensors=-1, min_bytes=0, order_backward=True)
    plain_losses, plain_weights, _ = fit(build, x_data, y_data)
    assert callback.stats.active and callback.stats.swapped_tensors > 0
    assert losses == plain_losses
    assert all(np.array_equal(a, b) for a, b in zip(weights, plain_weights))


def test_the_trace_keras_makes_again_is_ordered_and_swaps_as_the_first(devices, costly_copies):
    """Adam creates its variables in the first trace, so Keras traces the step twice: the second (the one that
    runs) must hold the first's order and every swap of the probe, or the plan is made on a step that swapped
    fewer tensors than it says."""
    rng = np.random.default_rng(0)
    x, y = rng.random((16, 32, 32, 3), dtype="float32"), rng.integers(0, 10, 16)
    build = reduced("resnet")

    def compiled():
        model = build()
        model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    plain_losses, _, _ = fit(compiled, x, y)
    losses, _, callback = fit(compiled, x, y, min_bytes=0, order_backward=True)  # the default plan: probe, plan
    stats = callback.stats
    assert stats.ordered_layers > 0 and losses == plain_losses
    probe_note = next(note for note in stats.notes if note.startswith("planned on the graphs TensorFlow executed"))
    assert f" of {stats.candidates} swapped from the second step" in probe_note, (probe_note, stats.candidates)


def test_with_recompute_the_backward_pass_keeps_tensorflows_order_and_says_so(devices):
    """Ordered, recompute="only" measured a higher peak on ResNet50 (docs/lms.md): the order is for swaps."""
    x, y = models.images(32, 32)
    _, _, callback = fit(models.residual_bn_dropout, x, y, batch_size=16, n_tensors=-1, min_bytes=0,
                         recompute="only", order_backward=True)
    assert callback.stats.recomputed_tensors > 0 and callback.stats.ordered_layers == 0
    assert any(note.startswith("order_backward is for swaps alone") for note in callback.stats.notes)
