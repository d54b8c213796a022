"""LMS on architectures nobody in this project wrote, trained as a user would, on the two logical CPUs.

``make test`` trains each architecture once (DenseNet in ``make test-release``), at the smallest size that still has
its kind of layers, built by keras.applications' own builders (``keras.src.applications``: ResNet50's bottleneck blocks in
three stages of one block, DenseNet121's dense blocks two deep, EfficientNetB0's first four stages of
MBConv blocks, one block each) and a Transformer; 32x32 images (the smallest these models take), batch 4.
Which model shows what:

- every one: the default plan is never predicted above no LMS, and its peak is explained (phase, op,
  bytes by kind adding up, the largest tensors); every candidate can be swapped. That the losses and weights
  are those of a plain fit, to the bit, test_same_math.py checks on the same cases (the Transformer in ``make
  test``, the others in ``make test-release``), with TensorFlow made reproducible (two steps, so the optimizer's state
  is read back too);
- SGD with momentum on ResNet and DenseNet, Adam on EfficientNet and the Transformer.

``make test-release`` (marker ``release``) trains the full-size keras.applications models (MobileNetV2,
ResNet50, DenseNet121, EfficientNetB0, MobileNetV3Small) and the Transformer, at 64x64, batch 8,
three steps, with both optimizers.
"""

import numpy as np
import pytest

from lms_magic import LMS
from lms_magic.lms.core.plan import Selection
from lms_magic.lms.tensorflow.predictor import TensorFlowStepPredictor
from tests.conftest import DEVICES
from tests.lms.tensorflow.real_models import FULL, OPTIMIZERS, QUICK, Case, application

# the reduced DenseNet's default plan is checked in make test-release: make test trains DenseNet's blocks in test_hybrid.py
# and test_recompute.py already, and this case was make test's slowest (54 s)
CASES = [pytest.param(case, id=case.id, marks=[pytest.mark.release] if case.name == "densenet" else [])
         for case in QUICK] + \
        [pytest.param(case, id="full-" + case.id, marks=pytest.mark.release) for case in FULL]


def train_two_ways(case: Case) -> dict:
    """The case trained with every candidate swapped, and with the default plan. (Whether either changes the math
    is test_same_math.py's to check, with TensorFlow made reproducible: here a plain fit would be one sample of
    TensorFlow's own run-to-run spread.)"""
    swap_all = LMS(device=DEVICES.accelerator, host_device=DEVICES.host, verbose=0, n_tensors=-1, min_bytes=0)
    # the default plan, every tensor size eligible as in swap_all (at 32x32 and batch 4 most activations are below
    # the default 64 KiB floor)
    default = LMS(device=DEVICES.accelerator, host_device=DEVICES.host, verbose=0, min_bytes=0)
    model, _, _ = case.fit(default, steps=2)  # the second step runs the plan made on the executed graphs
    case.fit(swap_all)
    assert swap_all.stats.swapped_tensors == swap_all.stats.candidates > 0 and swap_all.stats.steps == case.steps
    return {"case": case, "swap_all": (swap_all.stats,), "default": (default.stats, model)}


@pytest.mark.parametrize("case", CASES)
def test_lms_on_a_real_architecture(case, devices):
    """One test a case, so that its fits are made once (make test runs the tests in parallel)."""
    check_the_default_plan_is_never_worse_than_no_lms(train_two_ways(case))


def check_the_default_plan_is_never_worse_than_no_lms(trained):
    stats, model = trained["default"]
    optimizer = trained["case"].optimizer
    assert stats.active and stats.plan_rule == "lowest predicted peak"
    with_lms, without_lms = stats.traced_device_peaks  # what the plan was chosen on
    assert with_lms <= without_lms
    if stats.swapped_tensors == 0:  # said why: no plan helps on the traced graph, or not on the executed one
        assert any("no swap lowers the predicted peak" in note or "nothing moves from the second step on" in note
                   for note in stats.notes), stats.notes
    # the replay of the graphs TensorFlow executed (after Grappler and placement): what stats report
    assert stats.prediction_source == "executed partition graphs"
    assert stats.device_peak_bytes <= stats.device_peak_bytes_without_lms, (stats.device_peak_bytes,
                                                                            stats.device_peak_bytes_without_lms)
    # planned on those graphs: as low as LMS goes, within 2% of swapping every candidate (of any size)
    swap_all = trained["swap_all"][0]
    assert stats.device_peak_bytes <= 1.02 * swap_all.device_peak_bytes, (stats.device_peak_bytes,
                                                                          swap_all.device_peak_bytes)
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


@pytest.mark.release
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_planning_beats_swapping_everything_where_that_raises_the_peak(optimizer):
    """EfficientNetB0 with Adam: swapping every candidate was predicted above no LMS (issue 12)."""
    case = Case(application("EfficientNetB0", 64), optimizer, batch=8)
    model = case.model()
    predictor = TensorFlowStepPredictor(model, case.data(model, 1), Selection(min_bytes=0), host_device=DEVICES.host)
    planned, everything = predictor.planned(1, 8), predictor.predict(-1, 1, 8)
    assert planned.peak_bytes < planned.peak_bytes_without_lms
    assert planned.peak_bytes <= 1.01 * everything.peak_bytes  # within the plan's 1%, moving fewer bytes
    assert planned.swapped_bytes_per_step <= everything.swapped_bytes_per_step
