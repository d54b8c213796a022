"""XLA's own figure for a step without LMS (``lms/jax/compiled.py``): the one ``explain_fit`` and LMS's check read."""

import pytest

jax = pytest.importorskip("jax")


def _analysed(function, specs) -> int:
    analysis = jax.jit(function).lower(*specs).compile().memory_analysis()
    return (analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes
            - analysis.alias_size_in_bytes)


def test_the_figure_is_the_step_xla_compiles_not_the_replays_checkpointed_one():
    """On the H200 the replay's function as it was (every residual saveable under jax.checkpoint) compiled to 2.3x
    what the step itself needed; the figure must be the step's own value and gradient. A tanh chain: with every
    residual saveable XLA keeps each layer's tanh and 1 - tanh apart, in the step it fuses them."""
    import jax.numpy as jnp

    from lms_magic.lms.jax.compiled import compiled_bytes

    def inner(w, x):
        for _ in range(8):
            x = jnp.tanh(x @ w)
        return jnp.sum(x), ()

    args = (jnp.ones((256, 256)), jnp.ones((2048, 256)))
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    step_bytes = _analysed(jax.value_and_grad(inner, has_aux=True), specs)
    every_residual = jax.value_and_grad(jax.checkpoint(inner, policy=lambda *_, **__: True), has_aux=True)
    assert compiled_bytes(inner, args) == step_bytes
    assert step_bytes < 0.8 * _analysed(every_residual, specs)
