"""recompute="only": gradient checkpointing through fit(), on the two logical CPUs (no GPU needed).

A recomputed tensor never leaves the device, so on a CPU the allocator's own peak shows the saving (a
swapped one still lives in the same host memory). Every case trains as a plain fit does, to the bit.
"""

import keras
import numpy as np
import pytest

from lms_magic import LMS
from tests import models
from tests.conftest import DEVICES
from tests.lms.tensorflow.real_models import Case, application, reduced


def recompute_only(**options):
    return LMS(device=DEVICES.accelerator, host_device=DEVICES.host, verbose=0, recompute="only",
               **{"n_tensors": -1, "min_bytes": 0, **options})


def executed_op_names(stats):
    return [node.name for graph in stats.partition_graphs for node in graph.node]


def check_densenet(case: Case, drop: float, of_what: str) -> None:
    _, plain_losses, (_, plain_weights) = case.fit()
    callback = recompute_only()
    _, losses, (_, weights) = case.fit(callback)
    stats = callback.stats
    assert losses == plain_losses and np.array_equal(weights, plain_weights)  # two steps: momentum read back too
    assert stats.recomputed_tensors > 0 and stats.swapped_tensors == 0 == stats.swapped_bytes_per_step
    assert {row["action"] for row in stats.plan} == {"recompute"}
    names = executed_op_names(stats)  # nothing crosses the host link: no swap op ran
    assert any("lms_recompute" in name for name in names) and not any("lms_swap" in name for name in names)
    held = stats.persistent_bytes if of_what == "activations" else 0  # weights and optimizer state
    with_lms, without = stats.device_peak_bytes - held, stats.device_peak_bytes_without_lms - held
    assert with_lms <= (1 - drop) * without, (with_lms, without)


def test_densenet_recomputes_bit_identically_and_its_step_memory_drops_a_fifth(devices):
    """keras.applications' DenseNet (where keras.RematScope fails on TensorFlow, keras-team/keras#21207), its
    dense blocks two deep, 32x32, batch 4: there the weights and momentum are half the peak, so the drop is
    asserted on the rest."""
    check_densenet(Case(reduced("densenet"), "sgd"), 0.20, "activations")


@pytest.mark.release
def test_densenet121_recompute_only_lowers_its_predicted_peak_a_quarter(devices):
    """The whole DenseNet121 at 64x64, batch 8, weights and momentum included."""
    check_densenet(Case(application("DenseNet121", 64), "sgd", batch=8, steps=2), 0.25, "peak")


# Where recompute="only" is not bit-identical (docs/lms_modes.md, "Same math"): Grappler rewrites the step otherwise
# once clones read its tensors (ResNet50: its memory optimizer accumulates one gradient sum in arrival order, in the
# recomputing step only; MobileNetV2: its arithmetic optimizer regroups the recomputed residual sums apart from the
# forward pass's). The first step's loss is the same to the bit; the weights after it within this relative tolerance.
RECOMPUTE_NOT_BIT_IDENTICAL = {"ResNet50": 1e-6, "MobileNetV2": 1e-6}


@pytest.mark.release
@pytest.mark.parametrize("name", ["DenseNet121", "EfficientNetB0", "ResNet50", "MobileNetV2"])
def test_recompute_on_whole_applications_models(name, devices):
    case = Case(application(name, 64), "sgd", batch=8, steps=2)
    _, plain_losses, (plain_first, plain_last) = case.fit()
    callback = recompute_only(min_bytes=65536)
    _, losses, (first, last) = case.fit(callback)
    assert callback.stats.recomputed_tensors > 0
    tolerance = RECOMPUTE_NOT_BIT_IDENTICAL.get(name)
    if tolerance is None:
        assert losses == plain_losses and np.array_equal(last, plain_last)
    else:
        difference = np.linalg.norm(first - plain_first) / np.linalg.norm(plain_first)
        print(f"{name}: first loss {losses[0]} / {plain_losses[0]}, weights after one step {difference:.2e} apart")
        assert losses[0] == plain_losses[0] and difference <= tolerance


class BnStep(models.CustomStep):
    """Subclassed, with its own train_step, and a BatchNormalization and ReLU after each convolution."""

    def __init__(self):
        super().__init__()
        self.convs = [keras.Sequential([keras.layers.Conv2D(16, 3, padding="same"), keras.layers.BatchNormalization(),
                                        keras.layers.ReLU()]) for _ in range(3)]


def subclassed_bn():
    keras.utils.set_random_seed(4)
    model = BnStep()
    model(np.zeros((1, 32, 32, 3), "float32"))
    return models.compiled(model, metrics=None)


@pytest.mark.parametrize("build", [models.residual_bn_dropout, subclassed_bn], ids=["functional", "subclassed"])
def test_recompute_trains_as_a_plain_fit_on_functional_and_subclassed_models(build, devices):
    x, y = models.images(48, 32)
    plain = build()
    plain_history = plain.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    callback = recompute_only()
    model = build()
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    assert history.history["loss"] == plain_history.history["loss"]
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), plain.get_weights()))
    assert callback.stats.recomputed_tensors > 0 and callback.stats.swapped_tensors == 0


def test_behind_batch_normalization_the_activations_and_residual_sums_are_recomputed(devices):
    """The ReLU after each BatchNormalization and each residual sum are read by the backward pass; both come
    from tensors it keeps (the normalization's input, the branches), through cheap ops. The dropout between
    them is not redrawn: its output is read by no gradient, and its mask (read by one) is kept."""
    x, y = models.images(32, 32)
    callback = recompute_only()
    models.residual_bn_dropout().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    layers = {row["layer_type"] for row in callback.stats.plan}
    assert {"Activation", "Add"} <= layers and "Dropout" not in layers, layers


def test_where_nothing_can_be_recomputed_nothing_moves_and_the_notes_say_why(devices):
    """Conv2D with a fused ReLU: its output comes from the convolution, which is never recomputed."""
    x, y = models.images(32, 32)
    callback = recompute_only()
    models.reference_cnn_small().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    stats = callback.stats
    assert stats.recomputed_tensors == 0 == stats.swapped_tensors
    assert any(note.startswith("recompute='only': 0 of ") for note in stats.notes), stats.notes
