"""Swap-out / swap-in ops inserted into a traced TensorFlow train step.

Inside the ``tf.function`` trace of a Keras train step, the forward ops come
first and the backward ops (name scope ``gradient_tape/``) after them, in a
topological creation order. A forward tensor that backward ops read is
rewired as TFLMS did for TensorFlow 1:

    tensor --> swap_out (on the host) --> swap_in (on the host, control input: a backward op ``lb``
    hops upstream of the first consumer) --> landed (on the consumers' device) --> consumers

Both copies sit on the host, so the device-side receive of the swap-in cannot
start before the gate op has run; the device buffer of the tensor is freed once
its forward consumers and the swap-out have read it. The gate is an *ancestor*
of the consumer: a sibling could be fused with the consumer by Grappler's
remapper or oneDNN and close a cycle. The values are copied, never changed,
so the math is the same with and without LMS.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

import tensorflow as tf

from ... import internals

from ..core.plan import Candidate
from . import internals as tf_internals
from .graph import SHAPE_OPS, SWAP_IN_SCOPE, SWAP_OUT_SCOPE, is_backward, landing_name, op_name_in_step, replica_prefix, swap_name
from .rescale import bytes_of, dims_sized, sized_dims, static_bytes

_SKIP_PRODUCERS = frozenset({"ReadVariableOp", "Const", "VarHandleOp", "Placeholder", "ResourceGather"})
_LOOP_OPS = frozenset({"While", "StatelessWhile"})


@dataclass
class TensorCandidate:
    """A candidate with the graph objects needed to swap it."""

    candidate: Candidate
    tensor: tf.Tensor
    consumers: list  # backward ops that read the tensor's values
    shape_consumers: list  # backward ops that only read its shape
    trigger: tf.Operation
    hops: int  # how far upstream of the first consumer the trigger is
    # under a distribution strategy, the same tensor of the other replicas (``find_candidates``): moved with it
    mirrors: list = field(default_factory=list)


@dataclass
class SwapRecord:
    """One swap as inserted: what the report's plan rows and the tests need."""

    candidate: Candidate
    swap_out: str
    swap_in: str
    trigger: str
    hops: int
    consumers: list[str] = field(default_factory=list)
    landed: str = ""  # the op on the consumers' device that they read the swapped-in tensor from


def split_by_replica(ops) -> dict[str, tuple[list, list]]:
    """Groups ops by replica prefix, each as (forward ops, backward ops) in creation order.

    Backward is everything from the first gradient op on: the tape also makes
    unscoped ops (``AddN`` sums the gradients of a tensor read twice, as in
    residual blocks), and the optimizer's ops come after it.
    """
    groups: dict[str, list] = {}
    for op in ops:
        groups.setdefault(replica_prefix(op.name), []).append(op)
    split = {}
    for prefix, group in groups.items():
        first_backward = next((i for i, op in enumerate(group) if is_backward(op.name)), None)
        if first_backward is None:
            continue
        split[prefix] = (group[:first_backward], group[first_backward:])
    return split


def gradient_flow(backward: list) -> set:
    """Backward ops that the gradient reaches: the first backward op and all that read from it.

    Ops such as ``ShapeN`` of a forward tensor sit in the backward scope but
    can run at once; they must not gate a swap-in.
    """
    flow = set(backward[:1])
    for op in backward[1:]:
        if op.type not in SHAPE_OPS and any(source.op in flow for source in op.inputs):
            flow.add(op)
    return flow


def _trigger(first_consumer, flow: set, position: dict, lb: int):
    """The latest-created gradient op ``lb`` data hops upstream of the consumer (fewer if the path is shorter)."""
    frontier, found, hops = {first_consumer}, None, 0
    for step in range(1, lb + 1):
        frontier = {source.op for op in frontier for source in op.inputs if source.op in flow}
        if not frontier:
            break
        found, hops = max(frontier, key=position.__getitem__), step
    return found, hops


def find_candidates(ops, layer_of, lb: int, batch_size: int | None, order=None,
                    known_dims: dict | None = None) -> tuple[list[TensorCandidate], list[str]]:
    """The swappable forward tensors of a traced train step, in forward order.

    Args:
        ops: the ops created by the train step, in creation order.
        layer_of: maps an op name to (layer name, layer type).
        lb: how many backward hops ahead of its consumer a swap-in starts.
        batch_size: fills unknown leading dimensions for the sizes.
        order: where the backward pass is ordered (ordering.py, its joins in ``ops``): (each op's rank
            in the ordered step's execution order, core.order.Ordered). The first consumer and the
            trigger are then the ordered step's, and a swap-in waits for the join before its first
            consumer's group where that comes later. Defaults to None (creation order).
        known_dims: the dimensions shape inference found for tensors traced with unknown ones (a trace at an
            unknown batch: ``TracedStep.known_dims``), used before ``batch_size`` fills them.

    Returns:
        The candidates and notes for the user (recurrent layers left alone,
        tensors without a gate op).
    """
    by_replica: dict[str, list[TensorCandidate]] = {}
    notes: list[str] = []
    loops: set[str] = set()
    for prefix, (forward, backward) in split_by_replica(ops).items():
        candidates = by_replica.setdefault(prefix, [])
        backward_set = set(backward)
        flow = gradient_flow(backward)
        position = {op: index for index, op in enumerate(backward)} if order is None else \
            {op: order[0][op.name] for op in backward}
        joins = {} if order is None else {op.name: op for op in backward if op.name in order[1].joins}
        for index, op in enumerate(forward):
            if op.type in _LOOP_OPS:
                loops.add(layer_of(op.name)[0])
                continue
            if op.type in _SKIP_PRODUCERS:
                continue
            for tensor in op.outputs:
                if tensor.dtype in (tf.resource, tf.variant):
                    continue
                readers = [c for c in tensor.consumers() if c in backward_set]
                consumers = [c for c in readers if c.type not in SHAPE_OPS]
                if not consumers:
                    continue
                first = min(consumers, key=position.__getitem__)
                trigger, hops = _trigger(first, flow, position, lb)
                join = joins.get(order[1].before.get(first.name, "")) if order is not None else None
                if join is not None and (trigger is None or position[join] > position[trigger]):
                    trigger = join
                known = (known_dims or {}).get(tensor.name)
                nbytes = static_bytes(tensor, batch_size) if known is None else bytes_of(known, tensor.dtype.size)
                if trigger is None or nbytes is None:
                    continue  # no backward op to wait for: swapping would bring it straight back
                layer, layer_type = layer_of(op.name)
                shape = tuple(sized_dims(tensor, batch_size) if known is None else known)
                candidate = Candidate(tensor.name, layer, layer_type, shape, nbytes, index)
                candidates.append(TensorCandidate(candidate, tensor, consumers,
                                                  [c for c in readers if c.type in SHAPE_OPS], trigger, hops))
    candidates = _mirrored(by_replica)
    candidates = [item for item in candidates if item.candidate.layer not in loops]
    if loops:
        notes.append("LMS leaves recurrent layer(s) " + ", ".join(sorted(f"'{n}'" for n in loops)) +
                     " on the device (no tensor of theirs is swapped): their activations live inside a while loop")
    return candidates, notes


def resized(items: list[TensorCandidate], batch_size, memo: dict | None = None) -> list[TensorCandidate]:
    """``items`` (``find_candidates``' of a step) with each candidate's shape and bytes at ``batch_size`` (an int
    or a :class:`Rescaled`): the same tensors, consumers and triggers, which do not depend on the batch.
    ``memo``: a dict kept with ``items`` across calls (each tensor's name, dimensions and item size, read from
    TensorFlow once)."""
    memo = {} if memo is None else memo

    def one(item: TensorCandidate) -> TensorCandidate:
        if id(item) not in memo:  # the items outlive the memo: their numbers are theirs
            memo[id(item)] = (item.tensor.name, item.tensor.shape.as_list(), item.tensor.dtype.size)
        name, dims, itemsize = memo[id(item)]
        dims = dims_sized(name, dims, batch_size)
        candidate = dataclasses.replace(item.candidate, shape=tuple(dims), nbytes=bytes_of(dims, itemsize))
        return dataclasses.replace(item, candidate=candidate, mirrors=[one(mirror) for mirror in item.mirrors])

    return [one(item) for item in items]


def _mirrored(by_replica: dict[str, list[TensorCandidate]]) -> list[TensorCandidate]:
    """The first replica's candidates (one device's: what a plan chooses from), each with the same tensor of
    every other replica as its ``mirrors`` (a distribution strategy traces the step once a replica, the same
    names under ``replica_N/``); one replica: its candidates as they are."""
    first = sorted(by_replica)[0] if by_replica else ""  # "" (the first replica) sorts first
    candidates = by_replica.get(first, [])
    by_name = {item.tensor.name: item for item in candidates}
    for prefix, others in by_replica.items():
        if prefix == first:
            continue
        for item in others:
            twin = by_name.get(item.tensor.name[len(prefix):])
            if twin is not None:
                twin.mirrors.append(item)
    return candidates


def with_mirrors(items: list[TensorCandidate]) -> list[TensorCandidate]:
    """``items`` and their mirrors (the other replicas' same tensors), each item followed by its own."""
    return [each for item in items for each in (item, *item.mirrors)]


def insert_swaps(graph, chosen: list[TensorCandidate], host_device: str) -> list[SwapRecord]:
    """Adds the swap ops for ``chosen`` to ``graph`` (the train step's FuncGraph).

    Each swap is two ops on the host: ``EnsureShape`` (the swap-out, which
    receives the tensor) and ``Snapshot`` (the swap-in, gated on the trigger),
    both of which pass their input's buffer on. Not ``Identity``: Grappler's
    dependency optimizer bypasses identities, swap-ins included, and turning
    it off instead changes which kernels the rest of the graph runs (with it
    off, EfficientNetB0's first loss differs in the 7th digit; with these
    ops and Grappler as it is, it trains bit-identically).

    The consumers read the tensor from a third op, a ``Snapshot`` on their own
    device (``LANDING_SCOPE``; it passes the received buffer on). Grappler's
    constant folding reassociates a product or sum with a constant only where
    every operand is on one device: a consumer reading the host swap-in
    directly would have its arithmetic grouped otherwise than without LMS,
    and the rounding would differ (a GELU's gradient did so).
    """
    records = []
    for item in chosen:
        tensor = item.tensor
        base = swap_name(tensor.name)
        with graph.as_default(), graph.name_scope(None), tf.device(host_device):
            swap_out = tf_internals.pass_through_op(graph, "EnsureShape", tensor, f"{SWAP_OUT_SCOPE}/{base}", tensor.shape)
            swap_in = tf_internals.pass_through_op(graph, "Snapshot", swap_out, f"{SWAP_IN_SCOPE}/{base}")
        tf_internals.add_control_input(swap_in.op, item.trigger)
        with graph.as_default(), graph.name_scope(None), tf.device(item.consumers[0].device or None):
            landed = tf_internals.pass_through_op(graph, "Snapshot", swap_in, landing_name(tensor))
        for consumer in item.consumers:
            _reroute(consumer, tensor, landed)
        for consumer in item.shape_consumers:  # shapes are read on the host, from the host copy
            _reroute(consumer, tensor, swap_out)
            tf_internals.set_op_device(consumer, host_device)
        records.append(SwapRecord(item.candidate, swap_out.op.name, swap_in.op.name, item.trigger.name,
                                  item.hops, [c.name for c in item.consumers], landed.op.name))
    return records


def _reroute(op, old, new) -> None:
    for index, source in enumerate(op.inputs):
        if source is old:
            tf_internals.replace_input(op, index, new)


def layer_resolver(model) -> "LayerResolver":
    """Maps op names to (layer name, layer type), and to the layer's path, using the model's layers
    (:class:`LayerResolver`)."""
    optimizer = getattr(model, "optimizer", None)
    return LayerResolver(*tf_internals.layer_tree(model), internals.layer_types(model), getattr(optimizer, "name", None))


# the train step's own scopes, outside the model's layers: named as what they are
STEP_SCOPES = (("compile_loss", "loss"), ("compile_metrics", "metrics"))
_BATCH_OPS = ("IteratorGetNext", "OptionalGetValue")


class LayerResolver:
    """An op's Keras layer, read off its scopes (``model/block/attention/softmax/Softmax``).

    Keras names a scope after each layer it calls, nested inside its parent's; TensorFlow makes a scope unique
    by appending ``_1``, ``_2``... when it is entered again (a second trace, a block's layer named like another
    block's). The scopes are walked down the model's layer tree: each one is matched among the current layer's
    children (its own name first, then with suffixes peeled), so two blocks' ``softmax`` layers are told apart.
    A scope that names no child is looked up among all layers (a layer called outside its parent, such as a
    tied embedding). Outside the model's layers: the ``loss``, the ``optimizer``, ``the batch``, the tape's
    ``gradients``, and the train step's other unscoped ops, Keras's ``metrics``.

    Example:
        >>> resolver = LayerResolver("lm", {"block_0": ("Block", {"softmax": ("Softmax", {})}),
        ...                                 "block_1": ("Block", {"softmax_1": ("Softmax", {})})},
        ...                          {"block_0": "Block", "block_1": "Block", "softmax": "Softmax",
        ...                           "softmax_1": "Softmax"})
        >>> resolver("lm_1/block_0_1/softmax_1/Softmax"), resolver.path("lm_1/block_1_1/softmax_1_1/Softmax")
        (('softmax', 'Softmax'), 'block_1/softmax_1')
        >>> resolver("compile_loss/crossentropy/Log"), resolver("Bitcast")
        (('loss', ''), ('metrics', ''))
    """

    def __init__(self, model_name: str, tree: dict, layer_types: dict[str, str], optimizer_name: str | None = None):
        self.model_name, self.tree, self.layer_types = model_name, tree, layer_types
        self.optimizer_name = optimizer_name
        self._known: dict[str, tuple[list[str], str]] = {}

    def __call__(self, op_name: str) -> tuple[str, str]:
        path, layer_type = self._resolve(op_name)
        return path[-1], layer_type

    def path(self, op_name: str) -> str:
        """The layers an op was made in, outermost first ("gemma_backbone/decoder_block_0/attention/softmax")."""
        return "/".join(self._resolve(op_name)[0])

    def _resolve(self, op_name: str) -> tuple[list[str], str]:
        found = self._known.get(op_name)
        if found is None:
            found = self._known[op_name] = self._walk(op_name_in_step(op_name).split("/")[:-1], op_name)
        return found

    def _walk(self, scopes: list[str], op_name: str) -> tuple[list[str], str]:
        path, layer_type, children = [], "", self.tree
        for scope in scopes:
            if not path and _match(scope, {self.model_name: None}):
                continue  # the model's own scope
            name = _match(scope, children)
            if name is not None:
                layer_type, children = children[name]
                path.append(name)
                continue
            name = _match(scope, self.layer_types)
            if name is not None:  # a layer called outside its parent's scope
                path, layer_type, children = [name], self.layer_types[name], {}
        if path:
            return path, layer_type
        backward = bool(scopes) and scopes[0] == "gradient_tape"
        scopes = scopes[1:] if backward else scopes
        if not scopes:  # the batch, the tape's sums, or Keras's metric updates (the step's unscoped ops)
            last = op_name_in_step(op_name).rsplit("/", 1)[-1]
            return ["the batch" if last.startswith(_BATCH_OPS) else "gradients" if backward else "metrics"], ""
        for scope, what in STEP_SCOPES + ((self.optimizer_name, "optimizer"),):
            if scope and _match(scopes[0], {scope: None}):
                return [what], ""
        return [scopes[0]], ""


def _match(scope: str, names) -> str | None:
    """The name in ``names`` that ``scope`` is: itself, or itself less TensorFlow's ``_N`` suffixes."""
    name = scope
    while True:
        if name in names:
            return name
        stripped = re.sub(r"_\d+$", "", name)
        if stripped == name:
            return None
        name = stripped


