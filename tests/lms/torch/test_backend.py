"""LMS on Keras's PyTorch backend (KERAS_BACKEND=torch; ``make test`` runs it): the same math, the same plan
options as on TensorFlow, what it reports, and the model left plain.

LMS offloads from the device the model trains on (``device`` left unset): on a CPU machine the hooks
copy with plain synchronous copies, on a GPU machine with the CUDA path; the same code selects,
offloads, brings back and reports. The gpu-marked tests check the memory saving on CUDA.
"""

import keras
import numpy as np
import pytest
import torch

from lms_magic import LMS
from lms_magic.lms.core.plan import Rule

from tests.models import small_cnn as cnn, small_residual_bn_dropout as residual_bn_dropout, train


@pytest.mark.parametrize("build", [cnn, residual_bn_dropout])
def test_same_losses_and_weights_with_and_without_lms(build, data):
    plain, plain_history = train(build, data)
    callback = LMS(min_bytes=0, verbose=0)
    swapped, lms_history = train(build, data, callback)
    assert callback.stats["active"] and callback.stats["swapped_tensors"] > 0
    assert lms_history == plain_history
    for a, b in zip(plain.variables, swapped.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_the_same_plan_options_as_on_tensorflow(data):
    every = LMS(min_bytes=0, verbose=0)
    train(cnn, data, every, epochs=1)
    first_two = LMS(n_tensors=2, min_bytes=0, verbose=0)
    train(cnn, data, first_two, epochs=1)
    assert first_two.stats["swapped_tensors"] == 2
    assert every.stats.backend == "torch" and every.stats.lb_counts == "layers"
    assert every.stats.peak_source == "predicted"  # the first step's saved activations, replayed
    without_names = lambda plan: [{k: v for k, v in row.items() if k != "layer"} for row in plan]  # noqa: E731
    assert without_names(first_two.stats["plan"]) == without_names(every.stats["plan"][:2])  # forward order
    big_only = LMS(min_bytes=every.stats["plan"][0]["bytes"] + 1, verbose=0)
    train(cnn, data, big_only, epochs=1)
    assert all(row["bytes"] > every.stats["plan"][0]["bytes"] for row in big_only.stats["plan"])
    no_conv = LMS(exclude_types=("Conv2D",), min_bytes=0, verbose=0)
    train(cnn, data, no_conv, epochs=1)
    assert all(row["layer_type"] != "Conv2D" for row in no_conv.stats["plan"])
    off = LMS(n_tensors=0, verbose=0)
    train(cnn, data, off, epochs=1)
    assert off.stats["active"] is False


def test_pinned_pool_is_reused_step_after_step(data):
    callback = LMS(min_bytes=0, verbose=0)
    model = cnn()
    model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[callback])  # 4 steps
    # one buffer per activation the first step (the probe) offloaded; the later steps reuse them
    assert callback.stats.pinned_allocations == callback.stats.candidates >= callback.stats.swapped_tensors > 0


def test_summary_line_and_the_model_left_plain(data, capsys):
    model = cnn()
    model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[LMS(min_bytes=0)])
    assert "LMS (PyTorch): offloading" in capsys.readouterr().out
    assert "train_step" not in model.__dict__


def test_an_error_mid_step_leaves_the_model_plain(data):
    model = cnn()

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[LMS(min_bytes=0, verbose=0),
                                                                          Boom()])
    model.fit(*data, batch_size=16, epochs=1, verbose=0)  # a plain fit after it heals the model first
    assert "train_step" not in model.__dict__


def test_an_interrupt_mid_forward_leaves_the_graph_as_keras_made_it(data):
    model = cnn()

    class Interrupt(keras.layers.Layer):
        def compute_output_shape(self, input_shape):  # built without calling `call`
            return input_shape

        def call(self, x):
            raise KeyboardInterrupt

    broken = keras.Sequential([keras.Input((16, 16, 3)), model.layers[0], Interrupt()])
    broken.compile("adam", "mse")
    with pytest.raises(KeyboardInterrupt):
        broken.fit(data[0][:16], data[0][:16], epochs=1, verbose=0, callbacks=[LMS(min_bytes=0, verbose=0)])
    nodes = [node for layer in broken._functional.layers for node in layer._inbound_nodes]
    assert nodes and not any("fill_in" in vars(node.arguments) for node in nodes)


def test_lms_fit_compare_on_torch(shell, data):
    shell.user_ns.update(model=cnn(), x=data[0], y=data[1])
    result = shell.run_cell_magic("lms_fit", "-q -o --compare --min-bytes 0",
                                  "model.fit(x, y, batch_size=16, epochs=2, verbose=0)")
    no_lms, lms = result.variants
    assert no_lms.status == lms.status == "ok"
    assert no_lms.step_losses == lms.step_losses
    assert lms.lms_stats["swapped_tensors"] > 0
    assert lms.lms_stats["lb_counts"] == "layers"  # backward ops on TensorFlow
    exported = lms.to_dict()  # the first step's saved activations, replayed (calibrated on CUDA)
    assert exported["device_peak_source"] == "predicted"
    assert exported["predicted_device_peak_bytes"] == exported["device_peak_bytes"] > 0


@pytest.mark.gpu
def test_on_cuda_the_peak_drops_and_the_math_stays(data):
    """Each fit's peak above what was allocated before it (a model of an earlier fit may wait for the garbage
    collector). On a GPU this large the step fits: LMS's default moves nothing and must not raise the peak;
    every candidate moved (n_tensors=-1) lowers it."""
    import gc

    def peak_and_losses(callback):
        gc.collect()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        model = cnn(layers=8, size=64)
        keras.utils.set_random_seed(7)
        x = np.random.default_rng(0).normal(size=(256, 64, 64, 3)).astype("float32")
        history = model.fit(x, np.arange(256) % 10, batch_size=64, epochs=1, verbose=0,
                            callbacks=[callback] if callback else [])
        return torch.cuda.max_memory_allocated() - start, history.history["loss"]

    plain_peak, plain_losses = peak_and_losses(None)
    fits = LMS(min_bytes=0, verbose=0)
    fits_peak, fits_losses = peak_and_losses(fits)
    moved = LMS(min_bytes=0, n_tensors=-1, verbose=0)
    moved_peak, moved_losses = peak_and_losses(moved)
    assert fits_losses == moved_losses == plain_losses
    assert fits.stats.swapped_tensors == 0 and moved.stats.swapped_tensors > 0
    assert fits_peak <= plain_peak, (fits_peak, plain_peak)
    assert moved_peak < plain_peak, (moved_peak, plain_peak)


@pytest.mark.gpu
def test_a_device_the_model_is_not_on_is_said(data):
    callback = LMS(min_bytes=0, device="cpu", verbose=0)  # the model trains on cuda:0
    train(cnn, data, callback, epochs=1)
    assert callback.stats["swapped_tensors"] == 0
    assert any("leave `device` unset" in note for note in callback.stats["notes"])


def test_a_budget_is_planned_by_prediction_without_cuda(data):
    every = LMS(n_tensors=-1, min_bytes=0, verbose=0)
    train(cnn, data, every, epochs=1)
    plain_peak, all_offloaded_peak = every.stats.device_peak_bytes_without_lms, every.stats.device_peak_bytes
    assert every.stats.peak_source == "predicted" and all_offloaded_peak < plain_peak
    budget = (plain_peak + all_offloaded_peak) // 2
    fitted = LMS(budget=budget, min_bytes=0, verbose=0)
    model, history = train(cnn, data, fitted)
    stats = fitted.stats
    assert stats.plan_rule is Rule.BUDGET and stats.device_peak_bytes <= budget
    assert 0 < stats.swapped_bytes_per_step < every.stats.swapped_bytes_per_step
    plain_model, plain_history = train(cnn, data)
    assert history == plain_history
    roomy = LMS(budget=2 * plain_peak, min_bytes=0, verbose=0)  # the step fits: nothing moves after the first
    train(cnn, data, roomy, epochs=1)
    assert roomy.stats.swapped_bytes_per_step == 0 and roomy.stats.steps == 1


def test_the_default_plan_never_predicts_above_no_lms(data):
    callback = LMS(min_bytes=0, verbose=0)
    train(residual_bn_dropout, data, callback, epochs=1)
    stats = callback.stats
    assert stats.plan_rule is Rule.LOWEST_PEAK and stats.peak_source == "predicted"
    assert stats.device_peak_bytes <= stats.device_peak_bytes_without_lms


def test_lms_tune_says_what_to_use_on_pytorch(shell, data):
    from IPython.core.error import UsageError

    shell.user_ns.update(model=cnn(), x=data[0], y=data[1])
    with pytest.raises(UsageError, match="TensorFlow's traced step or JAX's jaxpr.*'torch'.*%%lms_fit"):
        shell.run_line_magic("lms_tune", "model --data (x, y) --batch-size 16")


def test_a_keras_distribution_is_refused_before_training_with_what_to_use(data):
    model = cnn()
    before = [w.copy() for w in model.get_weights()]
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=["cpu:0", "cpu:1"]))
    try:
        with pytest.raises(ValueError, match=r"keras.distribution is set \(DataParallel\).*KERAS_BACKEND=jax"):
            model.fit(*data, batch_size=16, epochs=1, verbose=0, callbacks=[LMS(verbose=0)])
    finally:
        keras.distribution.set_distribution(None)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert "train_step" not in vars(model)


def test_the_plan_predicts_its_step_time_and_trains_as_without_lms(data):
    """The FLOPs come from two small runs outside the fit's steps: the fit's losses and weights stay a plain fit's."""
    plain, plain_history = train(residual_bn_dropout, data)
    callback = LMS(n_tensors=-1, min_bytes=0, verbose=0)
    model, history = train(residual_bn_dropout, data, callback)
    stats = callback.stats
    assert stats.predicted_step_ratio >= 1.0 and stats.compute_s > 0
    assert stats.compute_source.startswith("estimated: the step's matrix FLOPs")
    assert history == plain_history
    for a, b in zip(plain.variables, model.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_the_framework_hands_lms_a_backend_class():
    """What tests/lms/test_framework.py checks of TensorFlow's, for this backend (imported here, not in that run)."""
    from lms_magic.lms.framework import framework
    from tests.lms.test_framework import assert_a_backend_class

    assert_a_backend_class(framework("torch"))
