"""The JAX step as the plan sees it: the jaxpr of the loss's value and gradient, replayed for its liveness.

The step LMS plans on is ``jax.value_and_grad`` of Keras's ``compute_loss_and_updates`` under
``jax.checkpoint`` with every value named (``residuals.named_residuals``) and saved, anything else the backward pass
reads computed again (``residuals.residual_policy``): LMS's step with nothing moved. Its jaxpr is flattened (the
bodies of ``pjit``, ``remat``, custom-derivative calls inlined; loops and conditionals kept whole) and
replayed in program order by ``core/simulate.py``, what is computed again just before its reader
(``core/sink.py``): each equation's outputs live from it to their last reader. Offloading a named value is a swap in that
replay: out after it is made, back one equation before the first backward reader (a reader inlined from
the differentiated ``remat``: the backward pass). XLA fuses element-wise
equations and schedules in its own order (without LMS, the replay against XLA's own figure for the compiled
step: ``benchmarks/lms_tune_jax.py``, docs/measurements.md), and where XLA
brings the offloaded outputs back is its scheduler's choice: the figures are predictions of this model,
named so in ``stats.prediction_source``. The optimizer's update after the gradient is not in it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..core.peak import LiveTensor, explain_peak
from ..core.plan import Candidate
from ..core.indexed import IndexedGraph
from ..core.simulate import Node, Swap, collector_paused, replay_with_swaps
from ..core.sink import sink_recomputed

# Equations that make no new buffer: their output is their input (a checkpoint name; float32 rounded to
# float32's own precision).
ALIASES = frozenset({"name", "reduce_precision"})
# Equations whose bodies run once, inline: inlined. Loops and conditionals stay one equation.
INLINED = frozenset({"pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint",
                     "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin"})
LOOPS = frozenset({"scan", "while", "cond"})
# Name-stack parts that are transformations or wrappers, not a layer.
_WRAPPERS = frozenset({"checkpoint", "remat", "rematted_computation", "jit", "pjit", "inner", "compute", "<lambda>"})


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
    names: list  # (tensor: (node name, output), checkpoint name, aval) of each named value, in order
    tangent: set = field(default_factory=set)  # the nodes of the backward pass that read the loss's cotangent
    loops: int = 0  # loops and conditionals kept whole (their bodies' outputs are not candidates)
    about: dict = field(default_factory=dict)  # node name -> (primitive, layer, shape of output 0), for explain
    # under ModelParallel: tensor -> how many parts each dimension is split into on the mesh (sharded.py); empty
    # where nothing is split
    splits: dict = field(default_factory=dict)

    def part_bytes(self, tensor, aval) -> int:
        """The bytes of ``tensor`` (of ``aval``) one device holds."""
        split = self.splits.get(tensor)
        return _nbytes(aval) // int(np.prod(split)) if split else _nbytes(aval)


def name_stack_parts(name_stack) -> list[str]:
    """The parts of a JAX name stack, its transformations' wrappers (``jvp(...)``, ``transpose(...)``) taken off.

    Example:
        >>> name_stack_parts("transpose(jvp(conv2d))/convolution")
        ['conv2d', 'convolution']
    """
    return [part for part in re.sub(r"[\w<>]+\(|\)", "", str(name_stack)).split("/") if part]


def layer_in(name_stack: str, outer: str = "") -> str:
    """The scopes an equation was made in, from its name stack (Keras names a scope after each layer, nested
    layers inside their parents'), without transformations and wrappers; ``outer`` (the enclosing equation's) if
    none. :func:`layer_path` keeps the parts that are layers.

    Example:
        >>> layer_in("transpose(jvp(conv2d))/convolution"), layer_in("jvp(checkpoint)", "dense")
        ('conv2d/convolution', 'dense')
        >>> layer_in("jvp(gpt2_backbone)/transformer_layer_0/self_attention/attention_softmax")
        'gpt2_backbone/transformer_layer_0/self_attention/attention_softmax'
    """
    parts = [part for part in name_stack_parts(name_stack) if part not in _WRAPPERS]
    return "/".join(parts) if parts else outer


def layer_path(scopes: str, layer_types: dict[str, str]) -> str:
    """The Keras layers an equation's scopes (:func:`layer_in`) name, outermost first: the parts that are layers
    of the model (the first part where none is).

    Example:
        >>> types = {"gpt2_backbone": "GPT2Backbone", "transformer_layer_0": "TransformerDecoder",
        ...          "self_attention": "CachedMultiHeadAttention"}
        >>> layer_path("gpt2_backbone/transformer_layer_0/self_attention/attention_softmax", types)
        'gpt2_backbone/transformer_layer_0/self_attention'
        >>> layer_path("conv2d/convolution", types), layer_path("", types)
        ('conv2d', '')
    """
    parts = [part for part in scopes.split("/") if part]
    known = [part for part in parts if part in layer_types]
    return "/".join(known) if known else (parts[0] if parts else "")


def flatten(closed_jaxpr, persistent_inputs: int, input_splits: list | None = None) -> _Flat:
    """Replay nodes of ``closed_jaxpr``: its first ``persistent_inputs`` inputs (the variables, counted apart as
    persistent bytes) hold no bytes here; the others (the batch) are nodes of their size. ``input_splits``: the
    variables' splits over a ``ModelParallel`` mesh (``sharded.variable_splits``), carried through the step: each
    value counts the part one device holds."""
    flat = _Flat([], {}, set(), [])
    jaxpr = closed_jaxpr.jaxpr
    splits = list(input_splits or ())
    for index, var in enumerate(list(jaxpr.constvars) + list(jaxpr.invars)):
        name = f"in{index}"
        held = index >= len(jaxpr.constvars) + persistent_inputs
        flat.nodes.append(Node(name, (_nbytes(var.aval) if held else 0,), priority=-1))
        flat.producer[var] = (name, 0)
        variable = index - len(jaxpr.constvars)
        if 0 <= variable < len(splits) and int(np.prod(splits[variable])) > 1 and \
                len(splits[variable]) == len(getattr(var.aval, "shape", ())):
            flat.splits[(name, 0)] = tuple(splits[variable])
    _inline(jaxpr, flat, backward=False, alias={}, outer="")
    # what the backward pass computes again from the forward's values alone: just before its reader, as XLA fuses it
    flat.nodes = sink_recomputed(flat.nodes, flat.backward - flat.tangent)
    return flat


def _inline(jaxpr, flat: _Flat, backward: bool, alias: dict, outer: str, seeded: frozenset = frozenset()) -> None:
    """``jaxpr``'s equations as nodes of ``flat``, bodies inlined. ``seeded``: its inputs that carry the loss's
    cotangent (a differentiated checkpoint's literal seed, or a value made from it)."""
    def source(var):
        if not hasattr(var, "aval") or type(var).__name__ == "Literal":
            return None
        var = alias.get(var, var)
        return flat.producer.get(var)

    def carries(var, literal_seeds: bool = False) -> bool:
        if type(var).__name__ == "Literal":
            return literal_seeds
        found = source(var)
        return var in seeded or (found is not None and found[0] in flat.tangent)

    for eqn in jaxpr.eqns:
        layer = layer_in(getattr(eqn.source_info, "name_stack", ""), outer)
        body = _body(eqn) if eqn.primitive.name in INLINED else None
        if body is not None:
            inner, consts = body
            inner_alias = dict(alias)
            for const in inner.constvars:
                flat.producer[const] = flat.producer.get(const) or _const_node(flat, const)
            for outer_var, inner_var in zip(eqn.invars, inner.invars):
                found = source(outer_var)
                if found is not None:
                    flat.producer[inner_var] = found
            differentiated = bool(eqn.params.get("differentiated"))
            inner_seeded = frozenset(inner_var for outer_var, inner_var in zip(eqn.invars, inner.invars)
                                     if carries(outer_var, literal_seeds=differentiated))
            _inline(inner, flat, backward or differentiated, inner_alias, layer, inner_seeded)
            for outer_var, inner_var in zip(eqn.outvars, inner.outvars):
                found = source(inner_var) if hasattr(inner_var, "aval") else None
                if found is not None:
                    flat.producer[outer_var] = found
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
        out_splits, gathered = _carried_splits(eqn, flat, source) if flat.splits else (None, 0)
        if out_splits:
            for index, split in enumerate(out_splits):
                if int(np.prod(split)) > 1:
                    flat.splits[(name, index)] = split
        outputs = tuple(flat.part_bytes((name, index), var.aval) for index, var in enumerate(eqn.outvars))
        if gathered:  # an operand gathered whole for the product: held while it runs, read by nothing after
            outputs += (gathered,)
        on_device = all(_on_device(var.aval) for var in eqn.outvars)
        flat.nodes.append(Node(name, outputs, inputs, on_device=on_device, priority=len(flat.nodes)))
        flat.about[name] = (eqn.primitive.name, layer, tuple(getattr(eqn.outvars[0].aval, "shape", ()) or ())
                            if eqn.outvars else ())
        if backward:
            flat.backward.add(name)
            if any(carries(var) for var in eqn.invars):
                flat.tangent.add(name)
        for index, var in enumerate(eqn.outvars):
            flat.producer[var] = (name, index)


def _carried_splits(eqn, flat: _Flat, source) -> tuple[list | None, int]:
    """The splits of ``eqn``'s outputs from its inputs' (``sharded.output_splits``; None where none is split), and
    the bytes of the operands XLA gathers whole for it (``sharded.gathered_parts``)."""
    from .sharded import gathered_parts, output_splits

    inputs, any_split = [], False
    for var in eqn.invars:
        shape = tuple(getattr(getattr(var, "aval", None), "shape", ()) or ())
        split = flat.splits.get(source(var)) if hasattr(var, "aval") else None
        any_split = any_split or split is not None
        inputs.append((shape, split or (1,) * len(shape)))
    if not any_split:
        return None, 0
    outputs = [tuple(getattr(var.aval, "shape", ()) or ()) for var in eqn.outvars]
    gathered = sum(_nbytes(eqn.invars[index].aval) for index in gathered_parts(eqn.primitive.name, eqn.params, inputs))
    return output_splits(eqn.primitive.name, eqn.params, inputs, outputs), gathered


def layer_of_name(name: str, layer_types: dict[str, str]) -> str:
    """The Keras layer a named value belongs to: the deepest part of its path (``residuals.residual_name``) that is a
    layer of the model, else the path's first part; a name without a path (``checkpoint_name(x, "dense")``) is
    its own layer.

    Example:
        >>> types = {"gpt2_backbone": "GPT2Backbone", "transformer_layer_0": "TransformerDecoder"}
        >>> layer_of_name("gpt2_backbone/transformer_layer_0/self_attention/query/dot_general:7", types)
        'transformer_layer_0'
        >>> layer_of_name("dense", types), layer_of_name("add:3", types)
        ('dense', '')
    """
    parts = name.split("/")[:-1]
    if not parts:
        return "" if ":" in name else name
    return next((part for part in reversed(parts) if part in layer_types), parts[0])


def _const_node(flat: _Flat, const):
    name = f"c{len(flat.nodes)}"
    flat.nodes.append(Node(name, (0,), priority=-1))
    return (name, 0)


class JaxStep:
    """A traced JAX step: its named values that the backward pass reads as candidates, and the predicted peak of any set offloaded.

    Args:
        closed_jaxpr: the jaxpr of the step (see the module's docstring).
        persistent_inputs: how many of its first inputs are variables (held anyway: not replayed).
        layer_types: layer name -> class name, for the candidates.
        flat: the replay nodes, where they are made otherwise (``rescale.py``): then ``closed_jaxpr`` is unused.

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

    def __init__(self, closed_jaxpr, persistent_inputs: int, layer_types: dict[str, str] | None = None,
                 flat: _Flat | None = None, input_splits: list | None = None):
        self.flat = flat = flat if flat is not None else flatten(closed_jaxpr, persistent_inputs, input_splits)
        readers: dict[tuple, list[str]] = {}
        for node in flat.nodes:
            for tensor in node.inputs:
                readers.setdefault(tensor, []).append(node.name)
        order = {node.name: index for index, node in enumerate(flat.nodes)}
        self._swaps: dict[str, list[Swap]] = {}
        sizes: dict[str, int] = {}
        shapes: dict[str, tuple] = {}
        for tensor, name, aval in flat.names:
            backward = [r for r in readers.get(tensor, []) if r in flat.backward]
            if not backward or any(swap.tensor == tensor for swap in self._swaps.get(name, ())):
                continue
            first = min(backward, key=order.get)
            trigger = flat.nodes[order[first] - 1].name
            self._swaps.setdefault(name, []).append(Swap(tensor, tuple(backward), trigger, flat.part_bytes(tensor, aval)))
            sizes[name] = sizes.get(name, 0) + flat.part_bytes(tensor, aval)
            shapes.setdefault(name, tuple(aval.shape))
        self._layer_types = types = layer_types or {}
        layers = {name: layer_of_name(name, types) for name in sizes}
        self.candidates = [Candidate(name, layers[name], types.get(layers[name], ""), shapes[name], sizes[name], index)
                           for index, name in enumerate(sizes)]
        self._memo: dict[tuple, int] = {}
        self._explained: dict[tuple, object] = {}
        self._indexed: IndexedGraph | None = None

    def _replay(self, offloaded: list[Candidate], explain: bool = False):
        if self._indexed is None:  # numbered once for the searches' replays (core/indexed.py)
            self._indexed = IndexedGraph(self.flat.nodes)
        with collector_paused():
            return replay_with_swaps(self._indexed, [swap for c in offloaded for swap in self._swaps.get(c.tensor, ())],
                                     explain=explain)

    def transient_peak(self, offloaded: list[Candidate]) -> int:
        """The predicted peak of the step's own bytes with the layers of ``offloaded`` in host memory."""
        key = tuple(sorted(c.tensor for c in offloaded))
        if key not in self._memo:
            self._memo[key] = self._replay(offloaded).peak_bytes
        return self._memo[key]

    def explain(self, offloaded: list[Candidate], persistent: list[LiveTensor]) -> dict:
        """``stats["peak"]`` (``core/peak.py``) with the layers of ``offloaded`` in host memory: the phase and
        equation of the peak, its bytes by kind (the backward pass's buffers are "gradients", a value
        copied back "activations_swapped_in", the batch "other"), the largest live tensors, the timeline."""
        key = tuple(sorted(c.tensor for c in offloaded))
        if key not in self._explained:  # a slider shows the same settings again, and "without LMS" at every move
            self._explained[key] = self._replay(offloaded, explain=True)
        result = self._explained[key]

        def describe(tensor) -> LiveTensor:
            name, index = tensor
            copied = name.endswith("/device_copy")
            source = name.split(":")[0] if copied else name
            primitive, scopes, shape = self.flat.about.get(source, ("input", "", None))
            layer = layer_path(scopes, self._layer_types)
            if copied:
                kind = "activations_swapped_in"
            elif source in self.flat.backward:
                kind = "gradients"
            elif source in self.flat.about:
                kind = "activations_kept"
            else:
                kind = "other"  # the batch
            return LiveTensor(f"{primitive} ({layer})" if layer else primitive, layer, shape, 0, kind)

        peak_after = result.peak_after or ""
        source = peak_after.split(":")[0] if "/" in peak_after else peak_after
        primitive, scopes, _ = self.flat.about.get(source, (peak_after, "", None))
        layer = layer_path(scopes, self._layer_types)
        backward = source in self.flat.backward or peak_after.endswith(("/swap_in", "/device_copy"))
        return explain_peak(result, describe, persistent, "backward" if backward else "forward",
                            f"{primitive} ({layer})" if layer else primitive)


def tree_arrays(tree) -> list:
    """The arrays (anything with a shape) among a pytree's leaves."""
    import jax

    return [leaf for leaf in jax.tree_util.tree_leaves(tree) if hasattr(leaf, "shape")]


def array_bytes(arrays) -> int:
    """The bytes of ``arrays`` (JAX arrays or shape-and-dtype structs)."""
    return sum(int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize for a in arrays)
