"""A traced step at another batch size, with no trace: from two traces at two batch sizes, where every size is a
line in the batch.

Tracing ResNet-50's step takes seconds, and ``explain_fit``'s searches ask for a dozen batch sizes or more. The
jaxpr at another batch size has the same equations in the same order; only the shapes differ, and each
dimension that holds the batch is a whole-number line in it. So two traces give every node's bytes, every named
value's shape and every equation's output shape at any batch size. Where the two traces differ in anything else
(an equation, an input, an order), or a size is not a whole-number line through them, there is no rescaled
step and the predictor traces.
"""

from __future__ import annotations

import dataclasses

from ..core.batch_lines import NotALine, TwoBatches
from .traced import JaxStep, _Flat


@dataclasses.dataclass(frozen=True)
class _Shaped:
    """An abstract value's shape and dtype (what the replay reads of a JAX aval)."""

    shape: tuple
    dtype: object


def rescaled(first: JaxStep, first_batch: int, second: JaxStep, second_batch: int, batch_size: int,
             layer_types: dict[str, str]) -> JaxStep | None:
    """The step at ``batch_size`` from its traces at ``first_batch`` and ``second_batch``, or None where they
    differ in more than sizes along the batch.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from lms_magic.lms.jax.residuals import named_residuals, residual_policy
        >>> loss = named_residuals(lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w)))
        >>> def at(batch):
        ...     grad = jax.grad(jax.checkpoint(loss, policy=residual_policy()))
        ...     return JaxStep(jax.make_jaxpr(grad)(jnp.ones((16, 16)), jnp.ones((batch, 16))), 1)
        >>> step = rescaled(at(2), 2, at(3), 3, 64, {})
        >>> [c.shape for c in step.candidates] == [c.shape for c in at(64).candidates]
        True
        >>> step.transient_peak(step.candidates) == at(64).transient_peak(at(64).candidates)
        True
    """
    two = TwoBatches(first_batch, second_batch)

    def line(at_first: int, at_second: int) -> int:
        value = two.exactly_at(at_first, at_second, batch_size)
        if value < 0:
            raise NotALine(f"{value} bytes at batch {batch_size}")
        return value

    def shape(first_shape, second_shape) -> tuple:
        if first_shape is None or second_shape is None or len(first_shape) != len(second_shape):
            if first_shape == second_shape:
                return first_shape
            raise NotALine(f"shapes {first_shape} and {second_shape}")
        return tuple(line(a, b) for a, b in zip(first_shape, second_shape))

    a, b = first.flat, second.flat
    if two.apart == 0 or len(a.nodes) != len(b.nodes) or len(a.names) != len(b.names) or a.backward != b.backward \
            or a.tangent != b.tangent or a.about.keys() != b.about.keys():
        return None
    try:
        nodes = []
        for one, other in zip(a.nodes, b.nodes):
            if (one.name, one.inputs, one.priority, one.on_device) != (other.name, other.inputs, other.priority,
                                                                        other.on_device) \
                    or len(one.outputs) != len(other.outputs):
                return None
            nodes.append(dataclasses.replace(one, outputs=tuple(map(line, one.outputs, other.outputs))))
        names = []
        for (tensor, name, aval), (other_tensor, other_name, other_aval) in zip(a.names, b.names):
            if (tensor, name) != (other_tensor, other_name):
                return None
            names.append((tensor, name, _Shaped(shape(tuple(aval.shape), tuple(other_aval.shape)), aval.dtype)))
        about = {}
        for node, (primitive, scopes, node_shape) in a.about.items():
            other_primitive, other_scopes, other_shape = b.about[node]
            if (primitive, scopes) != (other_primitive, other_scopes):
                return None
            about[node] = (primitive, scopes, shape(node_shape, other_shape))
    except NotALine:
        return None
    flat = _Flat(nodes, {}, set(a.backward), names, set(a.tangent), a.loops, about)
    return JaxStep(None, 0, layer_types, flat=flat)
