"""Whatever ends a fit, LMS leaves nothing behind: faults injected at seeded random points.

Each case trains the same small CNN with LMS (a bare ``fit`` or ``%%lms_fit
--compare``) and makes one point of the fit raise: the data, a callback's
batch begin (after LMS's) or end, an epoch end, the trace of the train step,
the step itself (a failed check inside the graph), LMS's first-batch summary,
or out of memory. Afterwards the model, Keras's attributes on it, Grappler's
options and TensorFlow's graph collection must be as before, and a plain
``fit`` must train plainly. The cases come from one seed, so a failure
names the case that reproduces it.
"""

import os
import random

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

from lms_magic import LMS
from lms_magic.lms import callback as callback_module

from .conftest import ACCELERATOR, HOST

SEED = 20261122
CASES = int(os.environ.get("LMS_FAULT_CASES", "60"))  # benchmarks/lms_interrupts.py runs 200
STEPS = 4  # batches of 16 from 64 images
POINTS = ("data", "batch_begin", "batch_end", "epoch_end", "trace", "step", "summary", "oom")


class Fault(Exception):
    """The injected error (KeyboardInterrupt is injected as well)."""


class CheckedModel(keras.Model):
    """A small CNN whose train step can fail at a chosen trace or inside the graph."""

    fail_trace = None  # raise while tracing the train step this many traces from now

    def __init__(self):
        super().__init__()
        self.convs = [keras.layers.Conv2D(8, 3, padding="same", activation="relu") for _ in range(3)]
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = keras.layers.Dense(10)

    def call(self, x, training=False):
        for conv in self.convs:
            x = conv(x)
        return self.head(self.pool(x))

    def train_step(self, data):
        if CheckedModel.fail_trace is not None:
            CheckedModel.fail_trace -= 1
            if CheckedModel.fail_trace < 0:
                CheckedModel.fail_trace = None
                raise KeyboardInterrupt("injected in the trace")
        x, _ = data
        check = tf.debugging.assert_less(tf.reduce_max(x), 10.0, message="injected in the step")
        with tf.control_dependencies([check]):
            return super().train_step(data)


def build():
    keras.utils.set_random_seed(5)
    model = CheckedModel()
    model(np.zeros((1, 16, 16, 3), "float32"))
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def images(bad_batch=None):
    rng = np.random.default_rng(0)
    x = rng.random((STEPS * 16, 16, 16, 3), dtype="float32")
    if bad_batch is not None:
        x[bad_batch * 16] = 100.0  # fails the check inside the step
    return x, rng.integers(0, 10, len(x))


class Raiser(keras.callbacks.Callback):
    def __init__(self, hook, batch, error):
        super().__init__()
        self.hook, self.batch, self.error = hook, batch, error

    def on_train_batch_begin(self, batch, logs=None):
        if self.hook == "batch_begin" and batch == self.batch:
            raise self.error

    def on_train_batch_end(self, batch, logs=None):
        if self.hook == "batch_end" and batch == self.batch:
            raise self.error

    def on_epoch_end(self, epoch, logs=None):
        if self.hook == "epoch_end":
            raise self.error


class FailingBatches(keras.utils.PyDataset):
    def __init__(self, x, y, fail_at, error):
        super().__init__()
        self.x, self.y, self.fail_at, self.error = x, y, fail_at, error

    def __len__(self):
        return STEPS

    def __getitem__(self, index):
        if index == self.fail_at:
            raise self.error
        return self.x[index * 16:(index + 1) * 16], self.y[index * 16:(index + 1) * 16]


def tensorflow_state():
    ctx = context.context()
    return dict(ctx._optimizer_experimental_options), tf.config.optimizer.get_experimental_options()


def graphs_collected_by_a_new_function() -> int:
    """0 unless TensorFlow still collects graphs of every function it runs."""
    tf.function(lambda t: t * 3.0)(tf.constant(1.0))
    metadata = context.context().export_run_metadata()
    return 0 if metadata is None else len(metadata.function_graphs)


def model_state(model):
    return {name: value for name, value in model.__dict__.items()
            if name not in ("train_function", "stop_training", "history", "_eval_epoch_iterator")}


def assert_left_as_before(model, before_model, before_tf, before_function):
    after = model_state(model)
    assert "train_step" not in model.__dict__
    assert after.keys() == before_model.keys()
    changed = [name for name in after if after[name] is not before_model[name]]
    assert not changed, f"attributes replaced: {changed}"
    function = model.train_function
    if isinstance(function, callback_module._LmsTrainFunction):  # stays only inert, over the model's own
        assert function.plain is before_function or before_function is None
    assert tensorflow_state() == before_tf
    assert graphs_collected_by_a_new_function() == 0


def case_list():
    rng = random.Random(SEED)
    for number in range(CASES):
        yield number, rng.choice(("fit", "fit", "%%lms_fit --compare")), rng.choice(POINTS), \
            rng.randrange(STEPS), rng.choice((KeyboardInterrupt, Fault))


@pytest.fixture(scope="module")
def lms_steps(request):
    """Counts the LMS steps run (class-level spy on the step scope)."""
    counter = {"steps": 0}
    original = LMS._step_scope

    def counting(self):
        counter["steps"] += 1
        return original(self)

    LMS._step_scope = counting
    request.addfinalizer(lambda: setattr(LMS, "_step_scope", original))
    return counter


def run_case(model, how, point, batch, error_type, shell, monkeypatch):
    x, y = images(batch if point == "step" else None)
    error = error_type(f"injected at {point}") if point != "oom" else \
        tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor (injected)")
    data = FailingBatches(x, y, batch, error) if point in ("data", "oom") else None
    callbacks = [Raiser(point, batch, error)] if point in ("batch_begin", "batch_end", "epoch_end") else []
    if point == "trace":
        CheckedModel.fail_trace = batch % 2  # the first trace, or the LMS rewrite's retrace
    if point == "summary":
        def failing_print(*args, **kwargs):
            raise error
        monkeypatch.setattr(callback_module, "print", failing_print, raising=False)
    options = dict(device=ACCELERATOR, host_device=HOST, min_bytes=0, verbose=1 if point == "summary" else 0)
    try:
        if how == "fit":
            fit_args = (data,) if data is not None else (x, y)
            model.fit(*fit_args, batch_size=None if data is not None else 16, epochs=1, verbose=0, shuffle=False,
                      callbacks=[LMS(**options)] + callbacks)
        else:
            shell.user_ns.update(model=model, x=x, y=y, data=data, extra=callbacks)
            source = ("model.fit(data, epochs=1, verbose=0, callbacks=extra)" if data is not None else
                      "model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False, callbacks=extra)")
            quiet = "" if point == "summary" else "-q "
            shell.run_cell(f"%%lms_fit --compare {quiet}--device {ACCELERATOR} --host-device {HOST} --min-bytes 0\n"
                           + source)
    except (KeyboardInterrupt, Fault, tf.errors.OpError):
        pass
    finally:
        CheckedModel.fail_trace = None
        monkeypatch.undo()


@pytest.mark.slow
def test_faults_at_random_points_leave_nothing_behind(shell, lms_steps, monkeypatch):
    model = build()
    model.fit(*images(), batch_size=16, epochs=1, verbose=0)  # the model's own train function exists
    for number, how, point, batch, error_type in case_list():
        before_model, before_tf = model_state(model), tensorflow_state()
        before_function = model.train_function
        run_case(model, how, point, batch, error_type, shell, monkeypatch)
        where = f"case {number}: {how}, {error_type.__name__} at {point}, batch {batch}"
        try:
            assert_left_as_before(model, before_model, before_tf, before_function)
            steps = lms_steps["steps"]
            model.fit(*images(), batch_size=16, epochs=1, verbose=0, shuffle=False)
            assert lms_steps["steps"] == steps, "a plain fit ran LMS steps"
            assert not isinstance(model.train_function, callback_module._LmsTrainFunction)
        except AssertionError as failure:
            raise AssertionError(f"{where}: {failure}") from None


def test_a_callback_interrupt_then_lms_then_plain_fit_trains_plainly(lms_steps):
    """The issue's reproduction: the plain fit at the end must not insert swaps."""
    model = build()
    x, y = images()
    options = dict(device=ACCELERATOR, host_device=HOST, min_bytes=0, verbose=0)
    before = tensorflow_state()
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=16, verbose=0, callbacks=[LMS(**options), Raiser("batch_end", 2,
                                                                                   KeyboardInterrupt())])
    model.fit(x, y, batch_size=16, verbose=0, callbacks=[LMS(**options)])
    steps = lms_steps["steps"]
    model.fit(x, y, batch_size=16, verbose=0)
    assert lms_steps["steps"] == steps
    assert "train_step" not in model.__dict__
    assert tensorflow_state() == before
    assert "dependency_optimization" not in tensorflow_state()[1]  # unset before, unset after


def test_no_graphs_are_kept_after_an_lms_fit(lms_options):
    """TensorFlow's run metadata, once enabled, kept every later function's graphs."""
    model = build()
    x, y = images()
    model.fit(x, y, batch_size=16, verbose=0, callbacks=[LMS(**lms_options)])
    for _ in range(3):
        other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        other.compile("sgd", "mse")
        other.fit(np.ones((8, 4)), np.ones((8, 2)), verbose=0)
        other.predict(np.ones((8, 4)), verbose=0)
    assert graphs_collected_by_a_new_function() == 0
    metadata = context.context().export_run_metadata()
    assert metadata is None or len(metadata.function_graphs) == 0


def test_a_later_fit_is_never_taken_for_the_fit_that_armed_the_function():
    """A fit that ends between LMS's batch begin and its step leaves the function armed; a later
    plain fit's frames can take the dead fit's addresses (case 47 of the seeded run once did)."""
    import contextlib
    import types

    calls = []
    model = types.SimpleNamespace(train_function=None)
    callback = types.SimpleNamespace(model=model, _step_scope=contextlib.nullcontext)
    function = callback_module._LmsTrainFunction(lambda: calls.append("lms"), lambda: calls.append("plain"),
                                                 callback)

    def fit(with_lms, interrupted=False):  # as Keras's fit: the callbacks' batch begin, then the train function
        def on_train_batch_begin():
            if with_lms:
                function.arm()

        on_train_batch_begin()
        if interrupted:
            raise KeyboardInterrupt
        model.train_function()

    fit(with_lms=True)
    assert calls == ["lms"] and model.train_function is function.plain
    for _ in range(200):
        try:
            fit(with_lms=True, interrupted=True)
        except KeyboardInterrupt:
            pass  # the dead fit's frames are freed here
        assert model.train_function is function
        fit(with_lms=False)  # a plain fit: the same code, so its frames may take the dead ones' addresses
    assert calls == ["lms"] + ["plain"] * 200
