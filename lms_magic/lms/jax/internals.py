"""JAX's private API, in one place for the JAX backend: a jaxpr equation bound again as ``jax.core.eval_jaxpr``
binds it. A JAX release that moves it breaks here (``lms_magic/versions.py`` holds the tested range)."""

from __future__ import annotations


def jaxpr_equation_bound(eqn, values) -> list:
    """Binds a jaxpr equation's primitive to ``values`` as ``jax.core.eval_jaxpr`` does (its parameters made
    bindable, its name stack and context set, so the trace made of it reads as the original); the outputs, as a
    list."""
    from jax._src import source_info_util

    params = eqn.primitive.get_bind_params(eqn.params)
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack), eqn.ctx.manager:
        outputs = eqn.primitive.bind(*values, **params)
    return list(outputs) if eqn.primitive.multiple_results else [outputs]
