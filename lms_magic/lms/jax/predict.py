"""The JAX step as the plan sees it: the jaxpr of the loss's value and gradient, replayed for its liveness.

The step LMS plans on is ``jax.value_and_grad`` of Keras's ``compute_loss_and_updates`` under
``jax.checkpoint`` with every layer output named (``checkpoint_name``) and saveable: the same residuals
as without LMS. Its jaxpr is flattened (the bodies of ``pjit``, ``remat``, custom-derivative calls
inlined; loops and conditionals kept whole) and replayed in program order by ``core/simulate.py``: each
equation's outputs live from it to their last reader. Offloading a layer's output is a swap in that
replay: out after it is made, back one equation before the first backward reader (a reader inlined from
the differentiated ``remat``: the backward pass). XLA fuses element-wise
equations and keeps fewer temporaries than the jaxpr has, and schedules in its own order, so the replay
over-counts the temporaries both with and without LMS: its figures are predictions of this model, named
so in ``stats.prediction_source``. The optimizer's update after the gradient is not in it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.plan import Candidate
from ..core.simulate import Node, Swap, replay, with_swaps

# Equations that make no new buffer: their output is their input (a checkpoint name; float32 rounded to
# float32's own precision).
ALIASES = frozenset({"name", "reduce_precision"})
# Equations whose bodies run once, inline: inlined. Loops and conditionals stay one equation.
INLINED = frozenset({"pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint",
                     "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin"})
LOOPS = frozenset({"scan", "while", "cond"})


def _nbytes(aval) -> int:
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:  # a PRNG key (key<fry>): its data, two 32-bit words an element
        itemsize = 8
    return int(np.prod(shape, dtype=np.int64)) * itemsize


def _on_device(aval) -> bool:
    return "host" not in str(getattr(aval, "memory_space", "")).lower()


def _body(eqn):
    """The jaxpr an inlined equation runs (open), with its constants, or None."""
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        body = eqn.params.get(key)
        if body is None:
            continue
        if hasattr(body, "jaxpr") and hasattr(body, "consts"):  # a ClosedJaxpr
            return body.jaxpr, list(body.consts)
        if hasattr(body, "eqns"):
            return body, []
    return None


@dataclass
class _Flat:
    nodes: list
    producer: dict  # var -> (node name, output index)
    backward: set  # the nodes of the backward pass (inlined from the differentiated checkpoint)
    names: list  # (tensor: (node name, output), checkpoint name, aval) of each named layer output, in order
    loops: int = 0  # loops and conditionals kept whole (their bodies' outputs are not candidates)


def flatten(closed_jaxpr, persistent_inputs: int) -> _Flat:
    """Replay nodes of ``closed_jaxpr``: its first ``persistent_inputs`` inputs (the variables, counted apart as
    persistent bytes) hold no bytes here; the others (the batch) are nodes of their size."""
    flat = _Flat([], {}, set(), [])
    jaxpr = closed_jaxpr.jaxpr
    for index, var in enumerate(list(jaxpr.constvars) + list(jaxpr.invars)):
        name = f"in{index}"
        held = index >= len(jaxpr.constvars) + persistent_inputs
        flat.nodes.append(Node(name, (_nbytes(var.aval) if held else 0,), priority=-1))
        flat.producer[var] = (name, 0)
    _inline(jaxpr, flat, backward=False, alias={})
    return flat


def _inline(jaxpr, flat: _Flat, backward: bool, alias: dict) -> None:
    def source(var):
        if not hasattr(var, "aval") or type(var).__name__ == "Literal":
            return None
        var = alias.get(var, var)
        return flat.producer.get(var)

    for eqn in jaxpr.eqns:
        body = _body(eqn) if eqn.primitive.name in INLINED else None
        if body is not None:
            inner, consts = body
            inner_alias = dict(alias)
            for const in inner.constvars:
                flat.producer[const] = flat.producer.get(const) or _const_node(flat, const)
            for outer, inner_var in zip(eqn.invars, inner.invars):
                found = source(outer)
                if found is not None:
                    flat.producer[inner_var] = found
            _inline(inner, flat, backward or bool(eqn.params.get("differentiated")), inner_alias)
            for outer, inner_var in zip(eqn.outvars, inner.outvars):
                found = source(inner_var) if hasattr(inner_var, "aval") else None
                if found is not None:
                    flat.producer[outer] = found
            continue
        if eqn.primitive.name in ALIASES and len(eqn.invars) == 1 and source(eqn.invars[0]) is not None:
            tensor = source(eqn.invars[0])
            flat.producer[eqn.outvars[0]] = tensor
            if eqn.primitive.name == "name":
                flat.names.append((tensor, eqn.params["name"], eqn.outvars[0].aval))
            continue
        flat.loops += eqn.primitive.name in LOOPS
        name = f"e{len(flat.nodes)}"
        inputs = tuple(found for found in map(source, eqn.invars) if found is not None)
        outputs = tuple(_nbytes(var.aval) for var in eqn.outvars)
        on_device = all(_on_device(var.aval) for var in eqn.outvars)
        flat.nodes.append(Node(name, outputs, inputs, on_device=on_device, priority=len(flat.nodes)))
        if backward:
            flat.backward.add(name)
        for index, var in enumerate(eqn.outvars):
            flat.producer[var] = (name, index)


def _const_node(flat: _Flat, const):
    name = f"c{len(flat.nodes)}"
    flat.nodes.append(Node(name, (0,), priority=-1))
    return (name, 0)


class JaxStep:
    """A traced JAX step: its named layer outputs as candidates, and the predicted peak of any set offloaded.

    Args:
        closed_jaxpr: the jaxpr of the step (see the module's docstring).
        persistent_inputs: how many of its first inputs are variables (held anyway: not replayed).
        layer_types: layer name -> class name, for the candidates.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jax.ad_checkpoint import checkpoint_name
        >>> def loss(w, x):
        ...     h = checkpoint_name(jnp.tanh(x @ w), "dense")
        ...     return jnp.sum(jnp.tanh(h @ w))
        >>> step = JaxStep(jax.make_jaxpr(jax.grad(jax.checkpoint(loss, policy=lambda *_, **__: True)))(
        ...     jnp.ones((64, 64)), jnp.ones((256, 64))), 1, {"dense": "Dense"})
        >>> [(c.layer, c.nbytes) for c in step.candidates]
        [('dense', 65536)]
        >>> step.transient_peak(step.candidates) < step.transient_peak([])
        True
    """

    def __init__(self, closed_jaxpr, persistent_inputs: int, layer_types: dict[str, str] | None = None):
        self.flat = flat = flatten(closed_jaxpr, persistent_inputs)
        readers: dict[tuple, list[str]] = {}
        for node in flat.nodes:
            for tensor in node.inputs:
                readers.setdefault(tensor, []).append(node.name)
        order = {node.name: index for index, node in enumerate(flat.nodes)}
        self._swaps: dict[str, list[Swap]] = {}
        sizes: dict[str, int] = {}
        shapes: dict[str, tuple] = {}
        for tensor, layer, aval in flat.names:
            backward = [r for r in readers.get(tensor, []) if r in flat.backward]
            if not backward:
                continue
            first = min(backward, key=order.get)
            trigger = flat.nodes[order[first] - 1].name
            self._swaps.setdefault(layer, []).append(Swap(tensor, tuple(backward), trigger, _nbytes(aval)))
            sizes[layer] = sizes.get(layer, 0) + _nbytes(aval)
            shapes.setdefault(layer, tuple(aval.shape))
        types = layer_types or {}
        self.candidates = [Candidate(layer, layer, types.get(layer, ""), shapes[layer], sizes[layer], index)
                           for index, layer in enumerate(sizes)]
        self._memo: dict[tuple, int] = {}

    def transient_peak(self, offloaded: list[Candidate]) -> int:
        """The predicted peak of the step's own bytes with the layers of ``offloaded`` in host memory."""
        key = tuple(sorted(c.layer for c in offloaded))
        if key not in self._memo:
            swaps = [swap for c in offloaded for swap in self._swaps.get(c.layer, ())]
            self._memo[key] = replay(with_swaps(self.flat.nodes, swaps)).peak_bytes
        return self._memo[key]
