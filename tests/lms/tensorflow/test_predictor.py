"""Batch sizes read off two traces (``TensorFlowStepPredictor(rescale_batches=True)``, what ``explain_fit`` searches
with): the same predictions as a trace at each batch size, to the byte."""

import keras
import numpy as np
import pytest

from lms_magic.lms.core.plan import Selection
from lms_magic.lms.tensorflow.rescale import is_prime
from lms_magic.lms.tensorflow.predictor import TensorFlowStepPredictor
from tests import models
from tests.conftest import DEVICES

from .real_models import reduced


def attention():
    """A transformer block: attention scores (batch, heads, 24, 24), a 4x-wide feed-forward, LayerNormalization."""
    keras.utils.set_random_seed(2)
    inputs = keras.Input((24, 32))
    x = keras.layers.LayerNormalization()(inputs + keras.layers.MultiHeadAttention(4, 8)(inputs, inputs))
    x = keras.layers.Dense(32)(keras.layers.Dense(128, activation="gelu")(x))
    return keras.Model(inputs, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(x)))


def predictors(build, min_bytes=0):
    """A predictor tracing each batch size, and one reading batch sizes off traces as ``explain_fit`` does."""
    model = build()
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sample = (np.zeros((2,) + tuple(model.input_shape[1:]), "float32"), np.zeros(2, "int32"))
    return (TensorFlowStepPredictor(model, sample, Selection(min_bytes=min_bytes), DEVICES.host, rescale_batches=read)
            for read in (False, True))


def assert_same_predictions(exact, rescaled, batch, timeline=True):
    for n_tensors in (0, -1):
        assert rescaled.predict(n_tensors, 1, batch) == exact.predict(n_tensors, 1, batch), (n_tensors, batch)
    capacity = int(0.9 * exact.predict(0, 1, batch).peak_bytes)
    assert rescaled.planned(1, batch, capacity) == exact.planned(1, batch, capacity)
    assert rescaled.eligible(1, batch) == exact.eligible(1, batch)
    explained, expected = rescaled.explain(-1, 1, batch), exact.explain(-1, 1, batch)
    if not timeline:  # the peak explained, not the live bytes after each op
        explained, expected = ({key: value for key, value in peak.items() if key != "timeline"}
                               for peak in (explained, expected))
    assert explained == expected
    assert rescaled.estimated_compute_s(batch, "/CPU:0") == pytest.approx(exact.estimated_compute_s(batch, "/CPU:0"))


@pytest.mark.parametrize("build", [models.residual_bn_dropout, reduced("resnet"), attention],
                         ids=["residual", "resnet", "attention"])
def test_a_batch_read_off_two_traces_predicts_as_its_own_trace(devices, build):
    """The attention block's Dense layers reshape (batch, 24, 32) to (batch * 24, 32): a dimension that grows with
    the batch without being it. ResNet's 7x7 stem and the 10 classes: widths equal to a batch traced."""
    exact, rescaled = predictors(build)
    rescaled.rescale_batches = False
    rescaled.trace(7)  # traced at 7, as it was before the import; then 10 traced, every other read off the two
    rescaled.rescale_batches = True
    for batch in (10, 24, 3):
        assert_same_predictions(exact, rescaled, batch)
    # two steps for every batch size: 7 traced, 10 traced or sized from it (where 7 divides none of the model's
    # dimensions), the others read off the two
    assert rescaled.traced_batches[0] == 7 and rescaled.step_source(10) in ("traced", "shape inference")
    assert [rescaled.step_source(batch) for batch in (24, 3)] == ["two traces", "two traces"]
    # and batch sizes 24 and 3 were predicted with no replay of their own: the replays at 7 and 10, as lines
    for batch in (24, 3):
        assert rescaled.reads_lines(1, batch, 0) and rescaled.reads_lines(1, batch, len(rescaled.eligible(1, batch)))


@pytest.mark.parametrize("build", [reduced("resnet"), attention], ids=["resnet", "attention"])
def test_the_batch_asked_for_is_sized_off_one_trace_at_a_prime(devices, build):
    """Read off from the first batch asked for (as explain_fit asks): one trace, at a prime from 8 up that divides
    none of the model's dimensions, and the batch asked for sized by TensorFlow's shape inference from it."""
    exact, rescaled = predictors(build)
    for batch in (8, 24, 3):
        assert_same_predictions(exact, rescaled, batch)
    (traced,) = rescaled.traced_batches
    assert traced > 8 and is_prime(traced)
    assert [rescaled.step_source(batch) for batch in (traced, 8, 24, 3)] == \
        ["traced", "shape inference", "two traces", "two traces"]


def test_tensors_eligible_at_larger_batches_only_are_read_off_lines_too(devices):
    """With ``min_bytes`` (LMS's default is 64 KiB), the attention block's (batch, 24, 32) tensors are below it at the
    batch sizes traced and above it at 64: moved there, and in the traces' steps for the lines, to the byte."""
    exact, rescaled = predictors(attention, min_bytes=40 * 1024)
    for batch in (8, 64, 200):
        assert_same_predictions(exact, rescaled, batch)
    (traced,) = rescaled.traced_batches
    small = {candidate.tensor for candidate in rescaled.eligible(1, traced)}
    large = [candidate.tensor for candidate in rescaled.eligible(1, 64)]
    assert not set(large) <= small  # more are eligible at 64 than at the batch sizes traced
    assert rescaled.reads_lines(1, 64, len(large))


@pytest.mark.parametrize("build", [models.residual_bn_dropout, reduced("resnet")], ids=["residual", "resnet"])
def test_the_lean_step_is_sized_as_the_step_without_it_was(devices, build, monkeypatch):
    """The lean step is the step without ``lean_ops`` and the lean normalization's gradient: where that step was
    sized at the batch asked for by the import, the lean one is sized by the same rule with no import of its own,
    to its own import's dimensions, and predicts as its own traces."""
    from lms_magic.lms.tensorflow import predictor as predictor_module
    from lms_magic.lms.tensorflow.rescale import dims_at

    model = build()
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sample = (np.zeros((2,) + tuple(model.input_shape[1:]), "float32"), np.zeros(2, "int32"))
    plain, lean, exact = (TensorFlowStepPredictor(model, sample, Selection(min_bytes=0), DEVICES.host, lean_ops=lean_ops,
                                                  rescale_batches=read)
                          for lean_ops, read in ((False, True), (True, True), (True, False)))
    lean.share({(False, False, False): plain})
    imports = []
    monkeypatch.setattr(predictor_module, "dims_at", lambda *args: imports.append(args) or dims_at(*args))
    plain.eligible(1, 8)
    lean.eligible(1, 8)
    assert len(imports) == 1  # the step without lean_ops's
    (traced,) = lean.traced_batches
    assert plain.traced_batches == (traced,) and lean.step_source(8) == "shape inference"
    assert lean.trace(8).batch_size.other_dims == dims_at(lean.trace(traced).ops[0].graph, traced, 8)
    for batch in (8, 24, 3):
        assert_same_predictions(exact, lean, batch)


def test_every_way_of_training_answers_the_step_predictor_protocol(devices):
    """explain_fit and the tuner ask each way's predictor through one typed protocol (core/prediction.py)."""
    from lms_magic.lms.core.prediction import StepPredictor
    from lms_magic.lms.explain.predictors import StepPredictors
    from lms_magic.lms.options import LmsOptions

    model = models.residual_bn_dropout()
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = (np.zeros((4,) + tuple(model.input_shape[1:]), "float32"), np.zeros(4, "int32"))
    predictors = StepPredictors(model, data, LmsOptions(min_bytes=0, device=DEVICES.accelerator,
                                                        host_device=DEVICES.host))
    for way in ((False, False, False), (True, False, False), (False, True, False), (False, False, "only")):
        assert isinstance(predictors.get(*way), StepPredictor), way


class _Tiled(keras.Model):
    """A subclassed model with a constant inside its call (67 copies of a layer's output) that no variable or layer
    output shows: the prime a model of these variables would be traced at from 64."""

    def __init__(self):
        super().__init__()
        self.inner, self.head = keras.layers.Dense(8), keras.layers.Dense(10)

    def call(self, x):
        wide = keras.ops.tile(self.inner(x), (1, 67))  # (batch, 67 * 8)
        return self.head(keras.ops.mean(keras.ops.reshape(wide, (-1, 67, 8)), axis=1))


class _HalfBatch(keras.Model):
    """A subclassed model whose call needs the batch as a number (it cannot run at an unknown batch)."""

    def __init__(self):
        super().__init__()
        self.head = keras.layers.Dense(10)

    def call(self, x):
        return self.head(keras.ops.reshape(x, (x.shape[0], 2, -1))[:, 0])


def _subclassed(model_class, features):
    model = model_class()
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sample = (np.zeros((2, features), "float32"), np.zeros(2, "int32"))
    model(sample[0])
    return [TensorFlowStepPredictor(model, sample, Selection(min_bytes=0), DEVICES.host, rescale_batches=read)
            for read in (False, True)], model, sample


def test_a_constant_inside_a_call_that_is_the_prime_does_not_size_the_step_wrong(devices):
    """The rule the import rests on: a trace at a prime batch holds the batch in every integer that is a multiple of
    it. A constant inside a subclassed model's call can be one (67, the prime from 64 for these variables): the
    forward pass traced at an unknown batch shows it, and the trace avoids that prime."""
    from lms_magic.lms.tensorflow.rescale import fixed_dims, prime_batch

    (exact, read_off), model, sample = _subclassed(_Tiled, 4)
    assert prime_batch(64, fixed_dims(model, [(4,)])) == 67  # what the variables alone would pick
    for batch in (64, 100, 7):
        assert_same_predictions(exact, read_off, batch)
    assert read_off.traced_batches[0] != 67 and read_off.step_source(64) == "shape inference"


def test_a_model_that_cannot_run_at_an_unknown_batch_is_traced_not_sized_by_the_import(devices):
    """Where the forward pass cannot be traced at an unknown batch, the model's dimensions are not known: the batch
    asked for is traced, not imported."""
    (exact, read_off), _, _ = _subclassed(_HalfBatch, 6)
    for batch in (64, 100):
        assert_same_predictions(exact, read_off, batch)
    assert read_off.step_source(64) == "traced" and len(read_off.traced_batches) == 2


def _application(name, size):
    def build():
        keras.utils.set_random_seed(1)
        model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3))
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
        return model, (np.zeros((2, size, size, 3), "float32"), np.zeros(2, "int32"))
    return build


def _language(kind):
    def build():
        from tests.hub import language_model, tokens

        return language_model(kind, sequence=64), tokens(kind, n=2, sequence=64)
    return build


FULL_MODELS = {"ResNet50-224": _application("ResNet50", 224), "DenseNet121-64": _application("DenseNet121", 64),
               "MobileNetV2-96": _application("MobileNetV2", 96), "EfficientNetB0-64": _application("EfficientNetB0", 64),
               "GPT-2": _language("gpt2"), "BERT": _language("bert")}


@pytest.mark.release
@pytest.mark.parametrize("min_bytes", [0, 64 * 1024], ids=["every-size", "lms-default-min-bytes"])
@pytest.mark.parametrize("name", list(FULL_MODELS))
def test_full_models_read_off_traces_predict_as_their_own_traces(devices, name, min_bytes):
    """The release check of explain_fit's shortcuts on the models users train: the batch asked for sized by shape
    inference from a trace at a prime, every other batch read off those two (and their peaks off lines where every
    tensor is a line in the batch) predict what a trace at each batch does, to the byte: the peak with nothing and
    with every candidate moved, LMS's plan for 90% of the plain peak, the candidates and the FLOP estimate. With
    LMS's default ``min_bytes`` more tensors are eligible at larger batches than at the two traced (GPT-2, BERT)."""
    model, sample = FULL_MODELS[name]()
    exact, read_off = (TensorFlowStepPredictor(model, sample, Selection(min_bytes=min_bytes), DEVICES.host,
                                               rescale_batches=read) for read in (False, True))
    for batch in (64, 1, 7, 100, 333):
        # the live bytes after each op (the explanation's timeline) at the batch asked for, the one explain_fit
        # explains; elsewhere the peaks and what fills them (EfficientNetB0 traces at batch 1 with ops the others
        # lack: docs/design.md, "The graph is the same at every batch size")
        assert_same_predictions(exact, read_off, batch, timeline=batch == 64)
    assert read_off.step_source(64) == "shape inference" and read_off.step_source(333) == "two traces"
    assert read_off.reads_lines(1, 333, 0)  # the lines served: the comparison above held them to traces


@pytest.mark.release
@pytest.mark.parametrize("name", ["ResNet50-224", "DenseNet121-64", "MobileNetV2-96", "EfficientNetB0-64"])
def test_the_lean_step_of_full_models_is_sized_as_the_step_without_it(devices, name):
    """lean_ops's step, sized by the rule the step without it was imported by (no import of its own), predicts
    what its own traces do at each batch."""
    model, sample = FULL_MODELS[name]()
    plain, lean, exact = (TensorFlowStepPredictor(model, sample, Selection(min_bytes=0), DEVICES.host, lean_ops=lean_ops,
                                                  rescale_batches=read)
                          for lean_ops, read in ((False, True), (True, True), (True, False)))
    plain.eligible(1, 64)
    lean.share({(False, False, False): plain})
    for batch in (64, 1, 7, 100, 333):
        # the timeline at the batch asked for, as above (DenseNet121's lean step traces with one op fewer at batch 1)
        assert_same_predictions(exact, lean, batch, timeline=batch == 64)
