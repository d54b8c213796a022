"""XLA's own figure for a train step (``lms/jax/compiled.py``): the one ``explain_fit`` and LMS's check read."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")


def _language_model(keras):
    """A causal-LM's shape at the smallest size: an embedding and a vocabulary-wide head, whose logits are most
    of the step (a KerasHub CausalLM's are)."""
    model = keras.Sequential([keras.Input((64,), dtype="int32"), keras.layers.Embedding(2048, 32),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(2048)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def _analysed(function, *specs) -> int:
    analysis = function.lower(*specs).compile().memory_analysis()
    return (analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
            - analysis.alias_size_in_bytes)


def test_the_figure_is_the_train_step_fit_runs_not_the_loss_and_gradient_alone():
    """On an H200 the loss and gradient compiled alone returned a causal LM's logits and left out the optimizer's
    and the metrics' work: 1.14x the allocator's peak at fp32, where Keras's whole train step matched it to 0.1%.
    The figure is the step ``fit`` jits (its state donated), whatever LMS wraps around it."""
    import keras

    from lms_magic.lms.jax.compiled import step_bytes
    from lms_magic.lms.jax.predictor import JaxStepPredictor

    model = _language_model(keras)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 2048, (64, 64)).astype("int32"), rng.integers(0, 2048, (64, 64)).astype("int32")
    predictor = JaxStepPredictor(model, (x[:2], y[:2]))
    inner, args = predictor.step_function(64)
    figure = step_bytes(model, inner, args)
    trainable, non_trainable, metrics, xs, ys, _, optimizer = args
    train_step = jax.jit(type(model).train_step.__get__(model), donate_argnums=0)
    assert figure == _analysed(train_step, (trainable, non_trainable, optimizer, metrics), (xs, ys, None))
    alone = _analysed(jax.jit(jax.value_and_grad(inner, has_aux=True)), *args)
    logits = 64 * 64 * 2048 * 4
    assert figure < alone  # the logits the loss and gradient return are not the step's to keep
    assert predictor.plain_peak_bytes(64) == figure > logits


def test_on_a_pool_that_grows_the_temporaries_hold_their_region(monkeypatch):
    """JAX's GPU pool with XLA_PYTHON_CLIENT_PREALLOCATE=false takes its step's temporaries as one region of a
    power-of-two size and does not split it (``core/bfc.py``): the figure counts the region, not the bytes."""
    import keras

    from lms_magic.lms.core.bfc import chunk_bytes
    from lms_magic.lms.jax import compiled as xla
    from lms_magic.lms.jax.predictor import JaxStepPredictor

    model = _language_model(keras)
    x = np.zeros((2, 64), "int32")
    inner, args = JaxStepPredictor(model, (x, x)).step_function(48)
    taken_whole = xla.step_bytes(model, inner, args)
    monkeypatch.setattr(xla, "pool_grows", lambda: True)
    grown = xla.step_bytes(model, inner, args)
    trainable, non_trainable, metrics, xs, ys, _, optimizer = args
    analysis = jax.jit(type(model).train_step.__get__(model), donate_argnums=0).lower(
        (trainable, non_trainable, optimizer, metrics), (xs, ys, None)).compile().memory_analysis()
    temporaries = analysis.temp_size_in_bytes
    assert grown - taken_whole == chunk_bytes(temporaries) - temporaries
    assert chunk_bytes(temporaries) >= temporaries


def test_the_pool_grows_only_where_jax_is_told_not_to_take_it_whole(monkeypatch):
    from lms_magic.lms.jax import compiled as xla

    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    assert not xla.pool_grows()  # JAX's default, and on this CPU in any case
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    assert xla.pool_grows() == (jax.devices()[0].platform == "gpu")
