"""LMS on Keras's JAX backend (KERAS_BACKEND=jax; ``make test`` runs it): layer outputs offloaded to pinned host
memory (or recomputed) by XLA inside the jitted step, the same math, a predicted peak, the model left plain."""

import keras
import numpy as np
import pytest

from lms_magic import LMS
from lms_magic.lms.core.plan import Rule

from tests.models import small_cnn as cnn, small_images as images, small_residual_bn_dropout as residual_bn_dropout
from tests.models import small_transformer as transformer, train


def assert_model_plain(model):
    assert "compute_loss_and_updates" not in vars(model) and "train_step" not in vars(model)
    assert not any("call" in vars(layer) for layer in model._flatten_layers(include_self=False))


@pytest.mark.parametrize("build, recompute", [(cnn, False), (residual_bn_dropout, False), (transformer, False),
                                               (residual_bn_dropout, "only")])
def test_every_layer_output_moved_trains_as_without_lms_at_a_lower_predicted_peak(build, recompute, data):
    plain, plain_history = train(build, data, epochs=1)
    callback = LMS(n_tensors=-1, min_bytes=0, verbose=0, recompute=recompute)
    model, history = train(build, data, callback, epochs=1)
    stats = callback.stats
    np.testing.assert_allclose(history["loss"], plain_history["loss"], rtol=1e-6)
    # absolute too: an attention key's bias has a zero gradient but for rounding (softmax ignores a shift), and
    # Adam makes steps of that noise (4e-6 apart here)
    for a, b in zip(plain.variables, model.variables, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5, err_msg=a.path)
    moved = stats.recomputed_tensors if recompute else stats.swapped_tensors
    assert stats.active and stats.backend == "jax" and moved == stats.candidates > 0
    assert {row["action"] for row in stats.plan} == {"recompute" if recompute else "swap"}
    assert stats.peak_source == "predicted" and "jaxpr" in stats.prediction_source
    assert stats.device_peak_bytes < stats.device_peak_bytes_without_lms
    assert_model_plain(model)


def test_the_default_plan_is_the_lowest_predicted_peak_and_never_above_no_lms(data):
    callback = LMS(min_bytes=0, verbose=0)
    train(residual_bn_dropout, data, callback, epochs=1)
    stats = callback.stats
    assert stats.plan_rule is Rule.LOWEST_PEAK
    assert stats.device_peak_bytes < stats.device_peak_bytes_without_lms
    assert "LMS (JAX): offloading" in callback.summary()


def test_one_plan_and_one_compile_per_batch_shape(data, caplog):
    """70 rows in batches of 16: a last batch of 6, a second shape, a second trace, plan and compile; no more
    over two epochs (a step with offloads returns its state committed to the device, and the epoch's first
    step reads uncommitted variables: without the state committed first, each would compile again)."""
    import jax

    from lms_magic.lms.jax import backend

    made = []
    callback = LMS(n_tensors=-1, min_bytes=0, verbose=0,
                   backend=lambda *given: made.append(backend.JaxBackend(*given)) or made[-1])
    x, y = images(n=70)
    model = residual_bn_dropout()
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level("WARNING"):
            model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[callback])
    finally:
        jax.config.update("jax_log_compiles", False)
    assert made[-1].traces == 2 and len(made[-1].offloaded) == 2
    compiles = [record for record in caplog.records if record.getMessage().startswith("Compiling jit(step)")]
    assert len(compiles) == 2
    assert_model_plain(model)


def test_an_error_mid_fit_leaves_the_model_plain_and_it_trains_after(data):
    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                raise RuntimeError("boom")

    model = cnn()
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[LMS(min_bytes=0, verbose=0), Boom()])
    assert_model_plain(model)
    model.fit(*data, batch_size=16, epochs=1, verbose=0)


def test_options_jax_cannot_honour_are_said(data):
    callback = LMS(min_bytes=0, verbose=0, lean_ops=True, order_backward=True, recompute=True, lb=2)
    train(cnn, data, callback, epochs=1)
    notes = " ".join(callback.stats.notes)
    for said in ("lean_ops is not available on JAX", "order_backward is not available on JAX",
                 "recompute=True is not built on JAX", "lb=2 is not honoured on JAX"):
        assert said in notes


def test_lms_fit_compare_on_jax(shell, data):
    shell.user_ns.update(model=cnn(), x=data[0], y=data[1])
    result = shell.run_cell_magic("lms_fit", "-q -o --compare --min-bytes 0 --n-tensors -1",
                                  "model.fit(x, y, batch_size=16, epochs=2, verbose=0)")
    no_lms, lms = result.variants
    assert no_lms.status == lms.status == "ok"
    assert lms.lms_stats["backend"] == "jax" and lms.lms_stats["swapped_tensors"] > 0
    np.testing.assert_allclose(lms.step_losses, no_lms.step_losses, rtol=1e-6)
    assert lms.to_dict()["device_peak_source"] == "predicted"


def test_without_host_memory_to_offload_to_the_plan_recomputes_and_says_so(data, monkeypatch):
    from lms_magic.lms.jax import backend

    monkeypatch.setattr(backend, "memory_kinds", lambda: {"device"})
    plain, plain_history = train(residual_bn_dropout, data, epochs=1)
    callback = LMS(n_tensors=-1, min_bytes=0, verbose=0)
    model, history = train(residual_bn_dropout, data, callback, epochs=1)
    stats = callback.stats
    assert stats.swapped_tensors == 0 and stats.recomputed_tensors == stats.candidates > 0
    assert any(note.startswith("the device has no host memory to offload to") for note in stats.notes)
    np.testing.assert_allclose(history["loss"], plain_history["loss"], rtol=1e-6)


def test_a_step_with_a_loop_is_said_once(data):
    """A recurrent layer runs in a scan, whose body's outputs are not offloaded: said, once for the fit."""
    keras.utils.set_random_seed(2)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.SimpleRNN(8)(keras.layers.Reshape((16, 48))(inputs))
    model = keras.Model(inputs, keras.layers.Dense(10)(x))
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = images(n=70)  # two batch shapes: two traces
    callback = LMS(min_bytes=0, verbose=0)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    said = [note for note in callback.stats.notes if note.startswith("the step has loops or conditionals")]
    assert len(said) == 1


def test_the_plan_predicts_its_step_time(data):
    callback = LMS(n_tensors=-1, min_bytes=0, verbose=0)
    train(cnn, data, callback, epochs=1)
    stats = callback.stats
    assert stats.predicted_step_ratio >= 1.0 and stats.compute_s > 0
    assert stats.compute_source.startswith("estimated: XLA's") and "predicted step time" in callback.summary()


def _capacity_between_lms_and_plain(monkeypatch, data):
    """A device whose usable part (80%) lies between LMS's lowest predicted peak and the plain step's replay."""
    from lms_magic.lms.jax import framework
    from lms_magic.lms.jax.predictor import JaxStepPredictor

    predictor = JaxStepPredictor(residual_bn_dropout(), (data[0][:2], data[1][:2]))
    plain, lowest = (predictor.predict(n, 1, 16).peak_bytes for n in (0, -1))
    capacity = int((plain + lowest) / 2 / 0.8)
    monkeypatch.setattr(framework, "_capacity_bytes", lambda: capacity)
    return capacity


def test_where_xlas_compiled_step_fits_the_device_nothing_moves(data, monkeypatch):
    """On a GPU XLA fuses much of what the replay keeps (ResNet-50 needed half of it on an H200): where the replay
    does not fit the device but XLA's compiled step does, LMS moves nothing and says why. Here XLA's figure is made
    small, as a GPU's would be; the fit is then the model's own."""
    from lms_magic.lms.jax import compiled as xla

    _capacity_between_lms_and_plain(monkeypatch, data)
    compiled = []
    monkeypatch.setattr(xla, "step_bytes", lambda model, inner, args, policy=None: compiled.append(args) or 1000)
    callback = LMS(min_bytes=0, verbose=0)
    _, plain = train(residual_bn_dropout, data, None, epochs=1)
    _, history = train(residual_bn_dropout, data, callback, epochs=1)
    stats = callback.stats
    assert len(compiled) == 1 and stats.plan_rule is Rule.FITS_DEVICE
    assert stats.swapped_tensors == 0 and stats.device_peak_bytes == stats.device_peak_bytes_without_lms
    assert any("XLA's compiled step does" in note for note in stats.notes)
    assert "XLA's compiled" in stats.prediction_source
    assert history["loss"] == plain["loss"]


def test_where_xlas_compiled_step_does_not_fit_the_plan_stands(data, monkeypatch):
    """On this CPU XLA's compiled step is larger than the replay: it does not fit either, and the plan moves. The
    compile runs inside the trace of Keras's train step."""
    from lms_magic.lms.core.plan import usable_bytes
    from lms_magic.lms.jax import compiled as xla

    capacity = _capacity_between_lms_and_plain(monkeypatch, data)
    compiled, real = [], xla.step_bytes
    monkeypatch.setattr(xla, "step_bytes", lambda model, inner, args, policy=None:
                        compiled.append(real(model, inner, args, policy)) or compiled[-1])
    callback = LMS(min_bytes=0, verbose=0)
    train(residual_bn_dropout, data, callback, epochs=1)
    stats = callback.stats
    assert len(compiled) == 1 and compiled[0] > usable_bytes(capacity)
    assert stats.plan_rule is Rule.FITS_DEVICE and stats.swapped_tensors > 0
    assert not any("XLA's compiled step does" in note for note in stats.notes)


def _xla_on_an_accelerator(monkeypatch, own_bytes, moved_bytes):
    """XLA as on a GPU, whose compiled step holds ``own_bytes`` as the model's own and ``moved_bytes`` with LMS's
    policy; the policies it was asked about, in a list."""
    from lms_magic.lms.jax import compiled as xla

    asked = []
    monkeypatch.setattr(xla, "places_apart", lambda: True)
    monkeypatch.setattr(xla, "step_bytes",
                        lambda model, inner, args, policy=None: asked.append(policy) or (own_bytes if policy is None
                                                                                         else moved_bytes))
    return asked


def test_where_xla_compiles_the_plan_to_hold_more_than_the_model_nothing_moves(data, monkeypatch):
    """On an H100, XLA's step with every candidate of a Gemma-style model offloaded held more on the device than
    the model's own (docs/jax.md): LMS compiles both, moves nothing where the plan's holds as much or more, and
    says so; the fit is the model's own."""
    asked = _xla_on_an_accelerator(monkeypatch, own_bytes=10 * 2**20, moved_bytes=14 * 2**20)
    _, plain = train(residual_bn_dropout, data, None, epochs=1)
    callback = LMS(n_tensors=-1, min_bytes=0, verbose=0)
    model, history = train(residual_bn_dropout, data, callback, epochs=1)
    stats = callback.stats
    assert len(asked) == 2 and asked[0] is not None and asked[1] is None  # the plan's step and the model's, once
    assert stats.swapped_tensors == 0 and stats.device_peak_bytes == stats.device_peak_bytes_without_lms
    assert any("holds 14.0 MiB on the device, the model's own step 10.0 MiB: nothing moves" in n for n in stats.notes)
    assert "XLA's compiled" in stats.prediction_source
    assert history["loss"] == plain["loss"]
    assert_model_plain(model)


def test_where_xla_compiles_the_plan_to_hold_less_its_figures_are_the_prediction(data, monkeypatch):
    """Where the plan's compiled step holds less than the model's own, it moves, and the figures LMS reports are
    XLA's (its whole train step's, the optimizer's state in it), not the replay's."""
    _xla_on_an_accelerator(monkeypatch, own_bytes=10 * 2**20, moved_bytes=6 * 2**20)
    callback = LMS(n_tensors=-1, min_bytes=0, verbose=0)
    train(residual_bn_dropout, data, callback, epochs=1)
    stats = callback.stats
    assert stats.swapped_tensors > 0
    assert (stats.device_peak_bytes, stats.device_peak_bytes_without_lms) == (6 * 2**20, 10 * 2**20)
    assert "XLA's compiled" in stats.prediction_source


@pytest.mark.parametrize("moved_mib", [14, 6])
def test_explain_fits_figures_with_lms_are_held_to_xla_as_lms_holds_its_plan(data, monkeypatch, moved_mib):
    """One model of the device: on a GPU, the predictor explain_fit and %lms_tune read gives, for a plan, what LMS
    would then do: XLA's figures where the plan's compiled step holds less, nothing moved where it holds more."""
    from lms_magic.lms.jax.predictor import JaxStepPredictor

    _xla_on_an_accelerator(monkeypatch, own_bytes=10 * 2**20, moved_bytes=moved_mib * 2**20)
    model = residual_bn_dropout()
    predictor = JaxStepPredictor(model, (data[0][:2], data[1][:2]))
    prediction = predictor.predict(-1, 1, 16)
    assert prediction.peak_bytes_without_lms == 10 * 2**20
    if moved_mib >= 10:
        assert (prediction.n_tensors, prediction.swapped_bytes_per_step) == (0, 0)
        assert prediction.peak_bytes == prediction.peak_bytes_without_lms
    else:
        assert prediction.n_tensors == prediction.candidates > 0 and prediction.peak_bytes == 6 * 2**20
    assert predictor.predict(0, 1, 16).peak_bytes == 10 * 2**20


def test_the_framework_hands_lms_a_backend_class():
    """What tests/lms/test_framework.py checks of TensorFlow's, for this backend (imported here, not in that run)."""
    from lms_magic.lms.framework import framework
    from tests.lms.test_framework import assert_a_backend_class

    assert_a_backend_class(framework("jax"))
