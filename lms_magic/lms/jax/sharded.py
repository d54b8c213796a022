"""One device's part of each value of the step under ``ModelParallel``: the splits of the variables, carried
through the step's equations.

A variable that a ``LayoutMap`` splits over the mesh's model axis is held in parts; so are the values computed
from it along the split dimension: a ``Dense`` whose kernel is split over its outputs makes its outputs split the
same way, and so does the gradient of that kernel. Each value's split (how many parts each of its dimensions is
cut into) is carried from the variables through the equations JAX records: matrix products, element-wise
equations, broadcasts, transposes and reductions. Any other equation, and a product summed over a split dimension
(its result is whole after XLA adds the parts), makes a whole value: the replay then counts more than a device
holds, never less.
"""

from __future__ import annotations

import math

ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "max", "min", "neg", "exp", "log", "tanh", "logistic", "abs", "sign", "sqrt",
    "rsqrt", "integer_pow", "pow", "square", "select_n", "convert_element_type", "erf", "erf_inv", "log1p",
    "expm1", "sin", "cos", "clamp", "copy", "stop_gradient", "add_any", "ne", "eq", "gt", "ge", "lt", "le",
    "and", "or", "not", "nextafter", "is_finite",
})
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin"})


def whole(rank: int) -> tuple[int, ...]:
    return (1,) * rank


def output_splits(primitive: str, params: dict, inputs: list[tuple[tuple[int, ...], tuple[int, ...]]],
                  outputs: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The splits of an equation's outputs (shapes ``outputs``) from its inputs' ``(shape, splits)``.

    Example:
        >>> dims = (((1,), (0,)), ((), ()))  # x (8, 64) @ w (64, 256), w split in 2 over its outputs
        >>> output_splits("dot_general", {"dimension_numbers": dims}, [((8, 64), (1, 1)), ((64, 256), (1, 2))],
        ...               [(8, 256)])
        [(1, 2)]
        >>> output_splits("max", {}, [((8, 256), (1, 2)), ((), ())], [(8, 256)])  # ReLU keeps the split
        [(1, 2)]
        >>> output_splits("reduce_sum", {"axes": (1,)}, [((8, 256), (1, 2))], [(8,)])
        [(1,)]
    """
    if not inputs or all(math.prod(splits) == 1 for _, splits in inputs):
        return [whole(len(shape)) for shape in outputs]
    if primitive == "dot_general" and len(outputs) == 1:
        (lhs_shape, lhs), (rhs_shape, rhs) = inputs[:2]
        free_lhs, free_rhs, lhs_batch = _dims(params, len(lhs_shape), len(rhs_shape))
        if any(rhs[d] > 1 for d in free_rhs):  # one operand keeps its split: the other is gathered whole
            lhs = whole(len(lhs_shape))
        splits = [lhs[d] for d in lhs_batch] + [lhs[d] for d in free_lhs] + [rhs[d] for d in free_rhs]
        return [tuple(splits)] if len(splits) == len(outputs[0]) else [whole(len(outputs[0]))]
    if primitive in ELEMENTWISE:
        found = []
        for shape in outputs:
            splits = [1] * len(shape)
            for in_shape, in_splits in inputs:
                if len(in_shape) == len(shape):
                    for d, (size, split) in enumerate(zip(in_shape, in_splits)):
                        if size == shape[d]:
                            splits[d] = max(splits[d], split)
            found.append(tuple(splits))
        return found
    if primitive == "broadcast_in_dim" and len(outputs) == 1:
        (_, splits), = inputs[:1]
        out = [1] * len(outputs[0])
        for source, target in enumerate(params.get("broadcast_dimensions", ())):
            out[target] = splits[source]
        return [tuple(out)]
    if primitive == "transpose" and len(outputs) == 1:
        (_, splits), = inputs[:1]
        return [tuple(splits[d] for d in params["permutation"])]
    if primitive in REDUCTIONS and len(outputs) == 1:
        (_, splits), = inputs[:1]
        axes = set(params.get("axes", ()))
        kept = tuple(split for d, split in enumerate(splits) if d not in axes)
        return [kept] if len(kept) == len(outputs[0]) else [whole(len(outputs[0]))]
    if primitive == "reshape" and len(outputs) == 1:
        (in_shape, splits), = inputs[:1]
        if tuple(in_shape) == tuple(outputs[0]):
            return [splits]
    return [whole(len(shape)) for shape in outputs]


def _dims(params: dict, lhs_rank: int, rhs_rank: int):
    """A ``dot_general``'s free dimensions of each operand, and the left operand's batch dimensions."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = params["dimension_numbers"]
    free_lhs = [d for d in range(lhs_rank) if d not in lhs_contract and d not in lhs_batch]
    free_rhs = [d for d in range(rhs_rank) if d not in rhs_contract and d not in rhs_batch]
    return free_lhs, free_rhs, list(lhs_batch)


def gathered_parts(primitive: str, params: dict, inputs: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> list[int]:
    """The inputs (by position) of a matrix product that XLA gathers whole on each device before it: a split
    operand whose split the product cannot keep (the other operand keeps its own, or the split is on a summed
    dimension the other operand does not split alike). Their whole size is a temporary of the product.

    Example:
        >>> dims = (((1,), (0,)), ((), ()))  # h (8, 256) split over its features @ w (256, 256) split over outputs
        >>> gathered_parts("dot_general", {"dimension_numbers": dims}, [((8, 256), (1, 2)), ((256, 256), (1, 2))])
        [0]
        >>> gathered_parts("add", {}, [((8, 256), (1, 2)), ((8, 256), (1, 2))])
        []
    """
    if primitive != "dot_general" or len(inputs) < 2:
        return []
    (lhs_shape, lhs), (rhs_shape, rhs) = inputs[:2]
    (lhs_contract, rhs_contract), _ = params["dimension_numbers"]
    free_lhs, free_rhs, _ = _dims(params, len(lhs_shape), len(rhs_shape))
    gathered = []
    if math.prod(lhs) > 1 and (any(rhs[d] > 1 for d in free_rhs)
                               or any(lhs[a] != rhs[b] for a, b in zip(lhs_contract, rhs_contract))):
        gathered.append(0)
    if math.prod(rhs) > 1 and 0 not in gathered and any(lhs[a] != rhs[b] for a, b in zip(lhs_contract, rhs_contract)):
        gathered.append(1)
    return gathered


def variable_splits(variables) -> list[tuple[int, ...]]:
    """Each variable's splits: its shape over the shape of the part one device holds (``distribution.shard_shape``)."""
    from .distribution import shard_shape

    found = []
    for variable in variables:
        shape = tuple(int(d) for d in variable.shape)
        part = shard_shape(variable)
        found.append(tuple(max(1, size // max(1, piece)) for size, piece in zip(shape, part)) if len(part) == len(shape)
                     else whole(len(shape)))
    return found


__all__ = ["gathered_parts", "output_splits", "variable_splits"]
