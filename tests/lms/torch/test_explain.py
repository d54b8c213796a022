"""explain_fit on PyTorch: the step run at two small batch sizes, nothing updated, every other batch read off them
(lms/torch/predictor.py)."""

import numpy as np

import lms_magic
from lms_magic import LMS
from lms_magic.lms.core.plan import Selection
from lms_magic.lms.torch.traced import SavedTensorStep
from lms_magic.lms.torch.predictor import TorchStepPredictor

from tests.models import small_cnn as cnn, small_images as images, small_residual_bn_dropout as residual_bn_dropout


def test_explain_fit_says_what_fills_the_step_and_what_fits_and_changes_nothing():
    model = residual_bn_dropout()
    before = [variable.numpy().copy() for variable in model.variables]
    found = lms_magic.explain_fit(model, images(), batch_size=32, capacity="2MiB", min_bytes=0)
    assert all(np.array_equal(a, variable.numpy()) for a, variable in zip(before, model.variables))  # BN's too
    assert not model.optimizer.built  # nothing trained: the optimizer is as compile() left it
    peak = found.peak
    assert peak["bytes"] == sum(peak["by_kind"].values())  # the saved activations' replay, by kind
    # without LMS, every tensor the step makes (gradients and temporaries too): above the saved activations' replay
    assert found.modes[0].peak_bytes == found.plain_peak_bytes > peak["bytes"]
    assert found.plain_usable_bytes == int(2 * 2**20 * 0.95) > found.usable_bytes  # a counted peak may fill 95%
    assert peak["by_kind"]["activations_kept"] > peak["by_kind"]["weights"]
    assert {row["layer"].rstrip("_0123456789") for row in peak["layers"][:6]} <= {"batch_normalization", "conv2d"}
    plain, lms, recompute, lean = found.modes
    assert plain.fits is False and lms.fits is True and found.suggestion == "%%lms_fit --budget 1638KiB"
    assert plain.largest_batch < 32 < lms.largest_batch
    assert "not predicted on PyTorch" in recompute.unavailable and "not predicted on PyTorch" in lean.unavailable
    assert lms.step_ratio is not None  # the FLOP count of the run, at the device's rate
    assert "upper bounds" in str(found)  # what the PyTorch peak leaves out is said with the answers


def test_explain_fit_leaves_torchs_random_numbers_as_they_were():
    """A fit after explain_fit shuffles its data and drops out as one without it: PyTorch's global generator is
    as it was (its runs' unseeded Dropout draws are put back; the device's rate is timed on numbers of its own)."""
    import torch

    from lms_magic.lms.torch import predictor

    predictor.device_flops_per_s.cache_clear()  # timed again here, as in a fresh process
    model, data = residual_bn_dropout(), images()  # (made with a seed: the global generator set here)
    state = torch.get_rng_state()
    lms_magic.explain_fit(model, data, batch_size=16, capacity="2MiB")
    assert torch.equal(torch.get_rng_state(), state)


def test_a_batch_read_off_the_two_runs_is_the_run_at_that_batch():
    x, y = images()
    predictor = TorchStepPredictor(residual_bn_dropout(), (x[:2], y[:2]))
    eligible = predictor.eligible(1, 16)
    run, reads, _ = predictor.measured_run(16)
    assert [(c.layer, c.shape, c.nbytes) for c in eligible] == [(c.layer, c.shape, c.nbytes) for c in run]
    ran = SavedTensorStep(run, [run[i] for i in reads])
    for count in (0, len(run) // 2, len(run)):
        assert predictor.transient_peak(1, 16, count) == ran.transient_peak(run[:count])


def test_the_replay_without_lms_is_what_lms_predicts_in_its_first_step():
    """The CNN has no compiled metrics, whose variables Keras makes in the first fit."""
    x, y = images()
    found = lms_magic.explain_fit(cnn(), (x, y), batch_size=16, modes=("without LMS",), min_bytes=0)
    callback = LMS(min_bytes=0, verbose=0)
    cnn().fit(x[:16], y[:16], batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    assert found.peak["bytes"] == callback.stats.device_peak_bytes_without_lms


def test_the_peak_without_lms_read_off_two_runs_is_a_run_at_that_batch():
    """Every tensor the step makes, counted after each operator in the runs at batch 2 and 3 and read off as lines,
    against the same count in a run at a larger batch: the residual model (BatchNormalization, Dropout, a skip
    connection), and an MLP whose peak moves from the weights' gradients (small batches) to the activations."""
    import keras

    x, y = images()
    mlp = keras.Sequential([keras.Input((64,))] + [keras.layers.Dense(256, activation="relu") for _ in range(6)] +
                           [keras.layers.Dense(1)])
    mlp.compile("sgd", "mse")
    cases = ((residual_bn_dropout(), (x[:2], y[:2]), (16, 40)),
             (mlp, (np.ones((2, 64), "float32"), np.ones((2, 1), "float32")), (1024,)))
    for model, sample, batches in cases:
        predictor = TorchStepPredictor(model, sample)
        for batch in batches:
            ran = predictor.persistent_bytes + predictor.measured_run(batch)[2]
            assert abs(predictor.plain_peak_bytes(batch) - ran) <= 0.01 * ran, (batch, predictor.plain_peak_bytes(batch), ran)


def test_an_lms_step_that_runs_out_of_memory_says_why_above_the_error(capsys):
    """PyTorch's OutOfMemoryError in an LMS() step (raised by a layer at the fit's batch, as a full GPU would): the
    account of the step at that batch is printed, then the error comes through unchanged, the weights as they were."""
    import keras
    import pytest
    import torch

    class FullDevice(keras.layers.Layer):
        def call(self, x, training=False):
            if training and x.shape[0] >= 16:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 GiB")
            return x

        def compute_output_shape(self, shape):
            return shape

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3, activation="relu"), FullDevice(),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(torch.OutOfMemoryError, match="1024.00 GiB"):
        model.fit(*images(32), batch_size=16, epochs=1, verbose=0, callbacks=[LMS(min_bytes=0)])
    out = capsys.readouterr().out
    assert "ran out of device memory" in out and "batch 16: the step needs" in out, out
    assert "the layers holding the most at the peak: conv2d" in out
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_gpumem_explain_gives_the_account_on_pytorch_and_trains_nothing(shell, data):
    model = residual_bn_dropout()
    before = [w.copy() for w in model.get_weights()]
    shell.user_ns.update(model=model, x=data[0], y=data[1])
    assert shell.run_cell("%%gpumem --explain\nfound = model.fit(x, y, batch_size=32, epochs=1, verbose=0)").success
    found = shell.user_ns["found"]
    assert found.batch_size == 32 and found.modes[0].peak_bytes == found.plain_peak_bytes > found.peak["bytes"] > 0
    assert "upper bounds" in str(found)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_the_failed_steps_tensors_are_let_go_before_the_account_and_the_users_frames_kept():
    """An out-of-memory error keeps the frames it passed through, and with them the step's activations (Keras's
    functional call holds every layer's output): the device stays full, and the account, which runs a step too,
    would run out of memory as well (seen on an H200). They are freed first; the user's own frame keeps its
    variables (for %debug), and the error comes through unchanged."""
    import weakref

    import keras
    import pytest
    import torch

    from lms_magic.lms.explain.account import OutOfMemoryExplained

    activations = []

    class FullDevice(keras.layers.Layer):
        def call(self, x, training=False):
            if training:
                activations.append(weakref.ref(x))  # the convolution's output: Keras's frames hold it
                users_variable = "kept"  # noqa: F841
                del x
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 GiB")
            return x

        def compute_output_shape(self, shape):
            return shape

    inputs = keras.Input((16, 16, 3))
    outputs = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(
        FullDevice()(keras.layers.Conv2D(8, 3)(inputs))))
    model = keras.Model(inputs, outputs)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    alive_when_explained = []
    guard = OutOfMemoryExplained(say=lambda text: None,
                                 explain=lambda *call: alive_when_explained.append(activations[0]() is not None))
    with pytest.raises(torch.OutOfMemoryError, match="1024.00 GiB") as raised:
        with guard:
            try:
                model.fit(*images(32), batch_size=16, epochs=1, verbose=0)
            finally:
                guard.say_why()
    assert alive_when_explained == [False]
    frames = [tb.tb_frame for tb in _tracebacks(raised.value.__traceback__)]
    (call,) = [frame for frame in frames if frame.f_code.co_name == "call" and frame.f_globals["__name__"] == __name__]
    assert call.f_locals["users_variable"] == "kept"


def _tracebacks(traceback):
    while traceback is not None:
        yield traceback
        traceback = traceback.tb_next


def test_explain_fit_against_a_budget_holds_every_way_to_it():
    """%lms_tune's frontier: a budget is what every way of training may fill, without LMS too."""
    model, data = residual_bn_dropout(), images()
    found = lms_magic.explain_fit(model, data, batch_size=32, budget="1MiB", modes=("without LMS", "LMS"))
    assert found.usable_bytes == found.plain_usable_bytes == 2**20
    predictor = TorchStepPredictor(model, (data[0][:2], data[1][:2]))
    largest = found.modes[0].largest_batch
    assert predictor.plain_peak_bytes(largest) <= 2**20 < predictor.plain_peak_bytes(largest + 1)


def test_the_predictor_answers_the_step_predictor_protocol():
    """explain_fit asks it through the one typed protocol of every backend's predictor (core/prediction.py)."""
    from lms_magic.lms.core.prediction import StepPredictor
    from lms_magic.lms.explain.predictors import StepPredictors
    from lms_magic.lms.options import LmsOptions

    assert isinstance(StepPredictors(cnn(), images(), LmsOptions(min_bytes=0), tuner=False).get(), StepPredictor)


class _Workspaces:
    """A GPU's allocator as the meter reads it: while each operator runs it holds a workspace of 1 MiB and 64 KiB
    a sample beyond what it holds after (cuDNN's scratch grows with the batch so), at the batch being run; from
    the first run on it keeps 32 MiB more (cuBLAS's handle workspace)."""

    resettable = True

    def __init__(self):
        self.batch = None

    def reset(self):
        pass

    def read(self):
        if self.batch is None:
            return 64 * 2**20, 64 * 2**20
        held = 96 * 2**20
        return held, held + 2**20 + 64 * 2**10 * self.batch


def test_each_operators_workspace_enters_the_peak_without_lms_as_a_fixed_and_a_per_sample_part(monkeypatch):
    """The step is run at two batch sizes only: the workspaces the allocator held there are read off as a line in
    the batch, a fixed part and a per-sample part, and added at the operator that held them; what the libraries
    keep from their first run on is held through the step."""
    from lms_magic.lms.torch import predictor as module

    workspaces, tile = _Workspaces(), module.tile_batch

    def tiled(sample, batch_size):
        workspaces.batch = batch_size
        return tile(sample, batch_size)

    monkeypatch.setattr(module, "tile_batch", tiled)
    sample = images()[0][:2], images()[1][:2]
    measured = TorchStepPredictor(residual_bn_dropout(), sample, counter=workspaces)
    plain = TorchStepPredictor(residual_bn_dropout(), sample)
    assert "workspace" in measured.plain_peak_source and "workspace" not in plain.plain_peak_source
    for batch in (1, 16, 64):
        added = measured.plain_peak_bytes(batch) - plain.plain_peak_bytes(batch)
        assert abs(added - (32 * 2**20 + 2**20 + 64 * 2**10 * batch)) <= 64, (batch, added)
    assert measured.lasting_workspace_bytes == 32 * 2**20 and plain.lasting_workspace_bytes == 0
