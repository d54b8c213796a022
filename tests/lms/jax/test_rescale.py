"""The JAX predictor traces two batch sizes and reads the others off them (``lms/jax/rescale.py``): what it
predicts at a third must be what a trace there gives."""

import jax
import pytest

from lms_magic.lms.jax.predictor import JaxStepPredictor

from tests.models import small_residual_bn_dropout as residual_bn_dropout


def _language_model():
    from tests.hub import language_model, tokens

    x, y = tokens("gpt2", n=4, sequence=32)
    return language_model("gpt2", layers=1, hidden=32, sequence=32), (jax.tree_util.tree_map(lambda a: a[:2], x), y[:2])


def _convolutional():
    import numpy as np

    return residual_bn_dropout(), (np.zeros((2, 16, 16, 3), "float32"), np.zeros((2,), "int64"))


@pytest.mark.parametrize("build", [_convolutional, _language_model], ids=["residual CNN", "GPT-2"])
def test_a_batch_size_read_off_two_traces_predicts_what_its_own_trace_does(build):
    model, sample = build()
    predictor = JaxStepPredictor(model, sample)
    predictor.trace(4), predictor.trace(6)
    read_off = predictor.trace(40)
    assert predictor.traced_batches == (4, 6)  # 40 was not traced
    traced = predictor.traced_anew(40)
    assert [(c.tensor, c.shape, c.nbytes) for c in read_off.candidates] == \
        [(c.tensor, c.shape, c.nbytes) for c in traced.candidates]
    by_name = {c.tensor: c for c in traced.candidates}
    for moved in ([], read_off.candidates[::3], read_off.candidates):
        assert read_off.transient_peak(moved) == traced.transient_peak([by_name[c.tensor] for c in moved])
    explained, own = read_off.explain(read_off.candidates[:5], []), traced.explain(
        [by_name[c.tensor] for c in read_off.candidates[:5]], [])
    assert (explained["bytes"], explained["by_kind"], explained["top"]) == (own["bytes"], own["by_kind"], own["top"])


def test_every_way_of_training_answers_the_step_predictor_protocol():
    """explain_fit and the tuner ask each way's predictor through one typed protocol (core/prediction.py)."""
    from lms_magic.lms.core.prediction import StepPredictor
    from lms_magic.lms.explain.predictors import StepPredictors
    from lms_magic.lms.options import LmsOptions

    model, sample = _convolutional()
    predictors = StepPredictors(model, sample, LmsOptions(min_bytes=0))
    for way in ((False, False, False), (False, False, "only")):
        assert isinstance(predictors.get(*way), StepPredictor), way
