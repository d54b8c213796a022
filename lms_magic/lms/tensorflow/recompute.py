"""Recompute instead of swap: a forward tensor dropped after the forward pass and computed again on the
device just before the backward pass reads it, from tensors the backward pass holds there anyway.

The tensor's producer, and the cheap ops behind it (element-wise arithmetic, activations, concatenations,
reshapes; never a convolution, a matrix product, a reduction or a random op), are cloned into the train
step; each clone is gated, like a swap-in, on the backward op ``lb`` hops upstream of the tensor's first
backward reader, and the backward readers read the last clone. The chain stops at *sources*: forward
tensors that a backward op at or after that reader also reads (so they are on the device when the clones
run, and are never themselves dropped) and small tensors (per-channel statistics, scalars), whose lives a
clone may lengthen at no cost worth counting. In a BatchNormalization followed by a ReLU, the ReLU's output
is recomputed from the normalization's input, which its gradient keeps. The clones run the same kernels on
the same values as the originals, so a recomputed tensor is bit-identical to the one it replaces (training
with recomputes is not always: docs/lms.md says on which models, and what is known of why).
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import compat
from .graph import RECOMPUTE_SCOPE, SHAPE_OPS, swap_name
from .rewrite import split_by_replica, static_bytes

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


def plan_recomputes(items, ops_of_step, min_bytes: int, batch_size: int | None) -> dict[str, Recompute]:
    """The candidates (TensorCandidate) that can be recomputed, by tensor name, each with its chain.

    Args:
        items: the candidates, in forward order.
        ops_of_step: the train step's ops in creation order (forward first, then backward).
        min_bytes: tensors smaller than this may be read by a clone whatever their life.
        batch_size: fills unknown leading dimensions for the sizes.
    """
    backward_ops = [op for _, backward in split_by_replica(ops_of_step).values() for op in backward]
    position = {op: index for index, op in enumerate(backward_ops)}
    last_read = _backward_reads(backward_ops)
    dropped: set = set()
    plans: dict[str, Recompute] = {}
    for item in items:
        first = min(position[c] for c in item.consumers)

        def is_source(tensor) -> bool:
            if tensor.ref() in dropped:
                return False
            if tensor.op.type in ("ReadVariableOp", "Const"):
                return True
            size = static_bytes(tensor, batch_size)
            if size is not None and size < min_bytes:
                return True
            return last_read.get(tensor.ref(), -1) >= first

        ops = _chain(item.tensor, is_source)
        if ops is None:
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


def insert_recomputes(graph, chosen: list[Recompute]) -> list[RecomputeRecord]:
    """Adds the clones of each chain to ``graph`` (the train step's FuncGraph) and makes the candidate's
    backward readers read the last clone."""
    records = []
    for recompute in chosen:
        item = recompute.item
        base = swap_name(item.tensor.name)
        cloned: dict = {}  # original tensor ref -> its clone
        names = []
        for index, op in enumerate(recompute.ops):
            inputs = [cloned.get(t.ref(), t) for t in op.inputs]
            with graph.as_default(), graph.name_scope(None):
                clone = compat.clone_op(graph, op, inputs, f"{RECOMPUTE_SCOPE}/{base}/{index}")
            compat.add_control_input(clone, item.trigger)
            for original, copy in zip(op.outputs, clone.outputs):
                cloned[original.ref()] = copy
            names.append(clone.name)
        value = cloned[item.tensor.ref()]
        for consumer in item.consumers:
            for index, source in enumerate(consumer.inputs):
                if source is item.tensor:
                    compat.replace_input(consumer, index, value)
        records.append(RecomputeRecord(item.candidate, names, item.trigger.name, item.hops,
                                       [c.name for c in item.consumers]))
    return records
