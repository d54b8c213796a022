"""Recompute instead of swap: a forward tensor dropped after the forward pass and computed again on the
device just before the backward pass reads it, from tensors the backward pass holds there anyway.

The tensor's producer, and the cheap ops behind it (element-wise arithmetic, activations, concatenations,
reshapes; never a convolution, a matrix product, a reduction or a random op), are cloned into the train
step; each clone is gated, like a swap-in, on the backward op ``lb`` hops upstream of the tensor's first
backward reader, and the backward readers read the last clone. The chain stops at *sources*: variables,
constants, and forward tensors that a backward op at or after that reader also reads (so they are on the
device when the clones run anyway, and are never themselves dropped); in the hybrid plan also a swapped
tensor, read from its swap-in. A clone lengthens no tensor's life: a small one that the backward pass
does not hold (a normalization's shift) is computed again too. In a BatchNormalization followed by a
ReLU, the ReLU's output is recomputed from the normalization's input, which its gradient keeps. The clones run the same kernels on
the same values as the originals, so a recomputed tensor is bit-identical to the one it replaces (training
with recomputes is not always: docs/lms_modes.md says on which models, and what is known of why).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from . import internals as tf_internals
from .graph import SHAPE_OPS, clone_name
from .rewrite import insert_swaps, split_by_replica, with_mirrors

# Kernels cheap next to the step (memory-bound, one pass over their inputs) and deterministic.
CHEAP_OPS = frozenset({
    "Relu", "Relu6", "Elu", "Selu", "LeakyRelu", "Sigmoid", "Tanh", "Softplus", "Softsign",
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Neg", "Square", "SquaredDifference", "Rsqrt", "Sqrt", "Maximum",
    "Minimum", "BiasAdd", "Cast", "Select", "SelectV2", "ClipByValue",
    "Identity", "Reshape", "ExpandDims", "Squeeze", "ConcatV2", "Pad",
})

MAX_CLONED_OPS = 8  # a longer chain is not "cheap" any more


@dataclass
class Recompute:
    """How to compute one candidate again: the forward ops to clone, in order."""

    item: object  # the rewrite's TensorCandidate
    ops: list  # forward ops, producers first, the candidate's producer last


@dataclass
class RecomputeRecord:
    """One recompute as inserted, for the plan rows and the tests."""

    candidate: object
    clones: list[str]
    trigger: str
    hops: int
    consumers: list[str]


def _backward_reads(backward: list) -> dict:
    """For each tensor a backward op reads (not only its shape): the position of its last such reader."""
    last: dict = {}
    for position, op in enumerate(backward):
        if op.type in SHAPE_OPS:
            continue
        for tensor in op.inputs:
            last[tensor.ref()] = position
    return last


def plan_recomputes(items, ops_of_step, the_rest: str = "kept") -> dict[str, Recompute]:
    """The candidates (TensorCandidate) that can be recomputed, by tensor name, each with its chain.

    Args:
        items: the candidates moved off the device, in forward order.
        ops_of_step: the train step's ops in creation order (forward first, then backward).
        the_rest: what becomes of the items not recomputed: "kept" on the device (recompute="only"; a chain
            may read one the backward pass holds there) or "swapped" (the hybrid plan; a chain may read one
            from its swap-in, which ``gate_moves`` brings back early enough).
    """
    backward_ops = [op for _, backward in split_by_replica(ops_of_step).values() for op in backward]
    position = {op: index for index, op in enumerate(backward_ops)}
    last_read = _backward_reads(backward_ops)
    dropped: set = set()  # recomputed: never a source (a chain goes through it again)
    swapped: set = set()  # the items found not recomputable so far, where a chain may read their swap-in
    plans: dict[str, Recompute] = {}
    for item in items:
        first = min(position[c] for c in item.consumers)

        def is_source(tensor) -> bool:
            if tensor.ref() in dropped:
                return False
            if tensor.ref() in swapped or tensor.op.type in ("ReadVariableOp", "Const"):
                return True
            return last_read.get(tensor.ref(), -1) >= first

        ops = _chain(item.tensor, is_source)
        if ops is None:
            if the_rest == "swapped":
                swapped.add(item.tensor.ref())
            continue
        plans[item.tensor.name] = Recompute(item, ops)
        dropped.add(item.tensor.ref())
    return plans


def _chain(tensor, is_source):
    """The ops to clone for ``tensor``, producers first, back to sources; None if the chain is not cheap."""
    ops, seen = [], set()

    def visit(op) -> bool:
        if op in seen:
            return True
        if op.type not in CHEAP_OPS or len(ops) >= MAX_CLONED_OPS or op.control_inputs:
            return False
        seen.add(op)
        for source in op.inputs:
            if not is_source(source) and not visit(source.op):
                return False
        ops.append(op)
        return True

    return ops if visit(tensor.op) else None


def insert_recomputes(graph, chosen: list[Recompute], sources=None) -> list[RecomputeRecord]:
    """Adds the clones of each chain to ``graph`` (the train step's FuncGraph) and makes the candidate's
    backward readers read the last clone. ``sources``: tensor ref -> the tensor a clone reads instead (a
    swapped source's landing op)."""
    records = []
    for recompute in chosen:
        item = recompute.item
        cloned: dict = dict(sources or {})  # original tensor ref -> what a clone reads for it
        names = []
        for index, op in enumerate(recompute.ops):
            inputs = [cloned.get(t.ref(), t) for t in op.inputs]
            with graph.as_default(), graph.name_scope(None):
                clone = tf_internals.clone_op(graph, op, inputs, clone_name(op, item.candidate.forward_index, index))
            tf_internals.add_control_input(clone, item.trigger)
            for original, copy in zip(op.outputs, clone.outputs):
                cloned[original.ref()] = copy
            names.append(clone.name)
        value = cloned[item.tensor.ref()]
        for consumer in item.consumers:
            for index, source in enumerate(consumer.inputs):
                if source is item.tensor:
                    tf_internals.replace_input(consumer, index, value)
        records.append(RecomputeRecord(item.candidate, names, item.trigger.name, item.hops,
                                       [c.name for c in item.consumers]))
    return records


def gate_moves(items, chains: dict[str, Recompute], ops_of_step) -> dict[str, object]:
    """The swapped items (not in ``chains``) that a chain reads and that must come back at that chain's earlier
    gate, so the clones never wait for a gate that waits for them: tensor name -> the chain's item."""
    order = {op: index for index, op in enumerate(ops_of_step)}
    swapped = {item.tensor.ref(): item for item in items if item.tensor.name not in chains}
    moves: dict[str, object] = {}
    for recompute in chains.values():
        for op in recompute.ops:
            for tensor in op.inputs:
                item = swapped.get(tensor.ref())
                if item is None:
                    continue
                current = moves.get(item.tensor.name, item)
                if order[recompute.item.trigger] < order[current.trigger]:
                    moves[item.tensor.name] = recompute.item
    return moves


def chain_reads(items, chains: dict[str, Recompute], ops_of_step) -> dict[str, object]:
    """The tensors on the device (not moved, not variables) that the clones of ``chains`` read: tensor name ->
    the item of the chain that reads it last in the backward pass (until whose first reader it lives at
    least). The chains read only tensors the backward pass holds there anyway: this is the check."""
    order = {op: index for index, op in enumerate(ops_of_step)}
    moved = {item.tensor.ref() for item in items}
    reads: dict[str, object] = {}
    for recompute in chains.values():
        made = {tensor.ref() for op in recompute.ops for tensor in op.outputs}
        for op in recompute.ops:
            for tensor in op.inputs:
                if tensor.ref() in moved or tensor.ref() in made or tensor.op.type in ("ReadVariableOp", "Const"):
                    continue
                current = reads.get(tensor.name)
                if current is None or order[recompute.item.trigger] > order[current.trigger]:
                    reads[tensor.name] = recompute.item
    return reads


def hybrid_chains(chains: dict[str, Recompute], transient_peak) -> dict[str, Recompute]:
    """The chains the hybrid plan recomputes: all of them, or else each in forward order unless it raises the
    predicted peak above swapping every item. ``transient_peak(chains)`` predicts the step with ``chains``
    recomputed (as swaps brought back at their gates) and the rest of the plan swapped."""
    swap_only = transient_peak({})
    if transient_peak(chains) <= swap_only:
        return dict(chains)
    accepted: dict[str, Recompute] = {}
    for name, recompute in chains.items():
        trial = {**accepted, name: recompute}
        if transient_peak(trial) <= swap_only:
            accepted = trial
    return accepted


def insert_hybrid(graph, items, chains: dict[str, Recompute], ops_of_step, host_device: str) -> list:
    """The hybrid plan inserted: ``chains`` recomputed, the other ``items`` swapped, those a chain reads
    brought back at its gate (``gate_moves``); a clone reads a swapped tensor from its swap-in."""
    moves = gate_moves(items, chains, ops_of_step)
    swapped = [item if item.tensor.name not in moves else
               dataclasses.replace(item, trigger=moves[item.tensor.name].trigger)
               for item in items if item.tensor.name not in chains]
    records = insert_swaps(graph, swapped, host_device)
    swap_ins = {item.tensor.ref(): graph.get_operation_by_name(record.landed).outputs[0]
                for item, record in zip(swapped, records)}
    return records + insert_recomputes(graph, [chains[item.tensor.name] for item in items
                                               if item.tensor.name in chains], swap_ins)


def move_off(graph, ops, items, host_device: str, recompute, hybrid=None, candidates=(), probing: bool = False) -> list:
    """Moves ``items`` off the device in the traced step ``ops`` of ``graph``: swapped, recomputed (``recompute``
    "only": those that can be), or as the ``hybrid`` plan says (``candidates``: all of the step's; ``probing``: the
    step swaps every one to plan on its graphs); under a distribution strategy, on every replica (each item's
    mirrors too: the hybrid plan's recomputes are chosen on the first replica's graphs, and the other replicas swap
    those tensors). Returns the records of what was inserted."""
    items = with_mirrors(items)
    if recompute == "only":
        chains = plan_recomputes(items, ops)
        return insert_recomputes(graph, [chains[item.tensor.name] for item in items if item.tensor.name in chains])
    if hybrid is not None:
        return hybrid.insert(graph, ops, items, candidates, probing)
    return insert_swaps(graph, items, host_device)


def records_stats(records: list) -> dict:
    """``LmsStats`` fields for the swaps (rewrite.SwapRecord) and recomputes (RecomputeRecord) as inserted: the
    records, counts and bytes of each action, and the plan's rows."""
    swaps = [r for r in records if not isinstance(r, RecomputeRecord)]
    recomputes = [r for r in records if isinstance(r, RecomputeRecord)]
    return {
        "records": records, "swapped_tensors": len(swaps),
        "swapped_bytes_per_step": sum(r.candidate.nbytes for r in swaps),
        "recomputed_tensors": len(recomputes),
        "recomputed_bytes_per_step": sum(r.candidate.nbytes for r in recomputes),
        "plan": [{"action": "recompute" if isinstance(r, RecomputeRecord) else "swap",
                  "tensor": r.candidate.tensor, "layer": r.candidate.layer, "layer_type": r.candidate.layer_type,
                  "shape": r.candidate.shape, "bytes": r.candidate.nbytes, "lb": r.hops, "trigger": r.trigger}
                 for r in records]}
