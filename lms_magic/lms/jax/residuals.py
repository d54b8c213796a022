"""The values the backward pass keeps, by name, and where each goes: ``named_residuals`` names every
floating-point value Keras's ``compute_loss_and_updates`` makes, ``residual_policy`` is the ``jax.checkpoint``
policy that saves, offloads or recomputes them, and ``trace_step`` traces the step under it for the replay
(``traced.JaxStep``)."""

from __future__ import annotations

from .traced import JaxStep, name_stack_parts, tree_arrays


def trace_step(inner, args, layer_types: dict[str, str], batch_shards: int = 1,
               variable_splits: list | None = None) -> JaxStep:
    """The :class:`JaxStep` of ``jax.value_and_grad(inner)`` at ``args``' shapes: ``inner`` is Keras's
    ``compute_loss_and_updates`` taking ``(trainable, non_trainable, metrics, x, y, sample_weight,
    optimizer_variables)``, traced under ``jax.checkpoint`` with every named value saved (:func:`residual_policy`:
    the residuals of LMS's step with nothing moved). ``inner`` names the values that are candidates (:func:`named_residuals`).
    ``batch_shards``: the batch is split so many ways over the devices (``keras.distribution``): the step is
    traced at one device's share of it. ``variable_splits``: the variables' splits over the mesh's model axis
    (``sharded.variable_splits``, in ``args[:3]``'s order): the values computed from them count one device's part."""
    import jax

    grad, specs = differentiated(inner, args)
    specs = per_device_specs(specs, batch_shards)
    held = len(tree_arrays(args[:3]))  # the variables: held through the step anyway
    splits = variable_splits if variable_splits is not None and len(variable_splits) == held else None
    return JaxStep(jax.make_jaxpr(grad)(*specs), held, layer_types, input_splits=splits)


def per_device_specs(specs, batch_shards: int):
    """``specs`` (``differentiated``'s) with x, y and sample_weight at one device's rows, the batch split
    ``batch_shards`` ways."""
    import jax

    if batch_shards <= 1:
        return specs

    def share(spec):
        if not isinstance(spec, jax.ShapeDtypeStruct) or not spec.shape:
            return spec
        return jax.ShapeDtypeStruct((-(-spec.shape[0] // batch_shards), *spec.shape[1:]), spec.dtype)

    return (*specs[:3], *jax.tree_util.tree_map(share, tuple(specs[3:6])), *specs[6:])


def residual_policy(moved: frozenset = frozenset(), to=None):
    """The ``jax.checkpoint`` policy of the step LMS runs and the replay traces: the backward pass keeps the
    named values (:func:`named_residuals`), each saved on the device, or ``to`` (``Offloadable``, ``Recompute``)
    for the names in ``moved``; any other value it reads (the inside of one operation's derivative, e.g. tanh's
    output before its name) is computed again from them. Had those been saveable, XLA would keep them on the
    device beside a named value offloaded.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jax.ad_checkpoint import Offloadable
        >>> loss = named_residuals(lambda w, x: jnp.sum(jnp.tanh(x @ w)))
        >>> moved = frozenset({"dot_general:0", "tanh:1"})
        >>> policy = residual_policy(moved, Offloadable(src="device", dst="pinned_host"))
        >>> jaxpr = jax.make_jaxpr(jax.grad(jax.checkpoint(loss, policy=policy)))(jnp.ones((4, 4)), jnp.ones((2, 4)))
        >>> "f32<host>[2,4]" in str(jaxpr)  # tanh's output, kept on the host for its derivative
        True
    """
    from jax.ad_checkpoint import Recompute, Saveable

    def policy(primitive, *_, **params):
        if primitive.name != "name":
            return Recompute
        return to if params.get("name") in moved else Saveable

    return policy


def moved_policy(moved: frozenset, recompute, host_kind: str | None):
    """:func:`residual_policy` for LMS's plan: the ``moved`` names offloaded to ``host_kind`` memory, or recomputed
    where ``recompute`` is "only" or there is no host memory kind (None). One policy for the step LMS runs and for
    the steps the predictor compiles.

    Example:
        >>> callable(moved_policy(frozenset({"tanh:1"}), False, "pinned_host"))
        True
    """
    from jax.ad_checkpoint import Offloadable, Recompute

    offload = recompute != "only" and host_kind is not None
    return residual_policy(moved, Offloadable(src="device", dst=host_kind) if offload else Recompute)


def shape_specs(args):
    """``args`` with each array (anything with a shape) as a ``jax.ShapeDtypeStruct``: tracing and compiling
    need no values."""
    import jax

    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape") else a,
                                  args)


def differentiated(inner, args):
    """``(jax.value_and_grad of inner under jax.checkpoint with nothing moved (:func:`residual_policy`), the
    shapes of args)``: the function :func:`trace_step` traces, and its arguments (:func:`shape_specs`)."""
    import jax

    return jax.value_and_grad(jax.checkpoint(inner, policy=residual_policy()), has_aux=True), shape_specs(args)


def named_residuals(inner):
    """``inner`` (Keras's ``compute_loss_and_updates``, a function of arrays) traced anew with every floating-point
    value it makes named (``checkpoint_name``): each equation of its jaxpr, in order, and so every value the
    backward pass may keep is a candidate the checkpoint policy can offload or recompute by its name. The name
    is the equation's Keras layer path (its name stack), its primitive and its position, e.g.
    ``multi_head_attention/query/dot_general:3``; the same step traced again gets the same names. A call of a
    jitted function (``jax.nn.gelu``) is one equation: its outputs are named, what it keeps inside is not. The
    math is the same: a name is the identity, and the equations are bound as they were traced.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> def loss(w, x):
        ...     return jnp.sum(jnp.tanh(x @ w) ** 2)
        >>> eqns = jax.make_jaxpr(named_residuals(loss))(jnp.ones((4, 4)), jnp.ones((2, 4))).eqns
        >>> [e.params["name"] for e in eqns if e.primitive.name == "name"]
        ['dot_general:0', 'tanh:1', 'integer_pow:2', 'reduce_sum:3']
    """
    import jax

    def named(*args):
        leaves, tree = jax.tree_util.tree_flatten(args)
        closed, shapes = jax.make_jaxpr(lambda *flat: inner(*jax.tree_util.tree_unflatten(tree, flat)),
                                        return_shape=True)(*leaves)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), _evaluated_named(closed, leaves))

    return named


def residual_name(eqn, index: int) -> str:
    """The name :func:`named_residuals` gives the outputs of the ``index``-th equation ``eqn``."""
    path = "/".join(name_stack_parts(eqn.source_info.name_stack))
    return f"{path}/{eqn.primitive.name}:{index}" if path else f"{eqn.primitive.name}:{index}"


def _evaluated_named(closed, args) -> list:
    """The outputs of ``closed`` (a ClosedJaxpr) at ``args``, each equation's floating-point outputs named."""
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    from . import internals as jax_internals

    jaxpr, values = closed.jaxpr, {}

    def read(var):
        return var.val if type(var).__name__ == "Literal" else values[var]

    values.update(zip(jaxpr.constvars, closed.consts))
    values.update(zip(jaxpr.invars, args))
    for index, eqn in enumerate(jaxpr.eqns):
        outputs = jax_internals.jaxpr_equation_bound(eqn, [read(var) for var in eqn.invars])
        name = residual_name(eqn, index)
        values.update(zip(eqn.outvars, [
            checkpoint_name(value, name) if jnp.issubdtype(getattr(value, "dtype", jnp.int32), jnp.floating)
            else value for value in outputs]))
    return [read(var) for var in jaxpr.outvars]
