"""What TensorFlow's op types and names mean to LMS: the one place that knows them (no TensorFlow import).

The pure core (``lms/core``) sees graphs as :class:`~lms_magic.lms.core.simulate.Node` lists; here are
the rules that turn TensorFlow's ops into such nodes (which ops hold no buffer, which pass their
input's buffer on, which write in place) and that read a Keras train step's op names (which phase
an op belongs to).
"""

from __future__ import annotations

import functools
import re

from ..core.order import JOIN_SCOPE

# Ops that read a tensor's shape, not its buffer: they neither keep it alive nor need it swapped in.
SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})

# Element-wise kernels that write into an input's buffer when nothing else reads it
# (TensorFlow's forward_input_or_allocate_output).
FORWARDING_OPS = frozenset({
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Neg", "Maximum", "Minimum", "SquaredDifference",
    "Relu", "Relu6", "ReluGrad", "Relu6Grad", "Elu", "EluGrad", "Selu", "SeluGrad", "LeakyRelu", "LeakyReluGrad",
    "Sigmoid", "SigmoidGrad", "Tanh", "TanhGrad", "Softplus", "SoftplusGrad", "Square", "Sqrt", "Rsqrt", "Exp",
    "Log", "Abs", "Sign", "Reciprocal", "BiasAdd", "AddN", "OnesLike", "ZerosLike", "Select", "SelectV2",
    "ClipByValue", "Pow",
})

# Ops whose output 0 is their input 0's buffer (TensorFlow forwards it); IdentityN: output i is input i's.
ALIASING_OPS = frozenset({"Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "Bitcast",
                          "PreventGradient", "EnsureShape", "Snapshot", "_Retval"})

# Backward ops that oneDNN's graph rewrite may fuse with a neighbour, which it does only where neither has a
# control input; fused, the bias gradient is summed in another order (Conv2DBackpropFilter + BiasAddGrad ->
# _MklNativeConv2DBackpropFilterWithBias; MatMul + BiasAddGrad likewise). The backward order puts no control edge
# on them (ordering.py), so the fusions, and the values, stay those of the plain step.
FUSED_IN_BACKWARD = frozenset({"BiasAddGrad", "Conv2DBackpropFilter", "MatMul", "BatchMatMulV2"})

# The op types of LMS's swap ops (rewrite.py: EnsureShape out, Snapshot in), and their name scopes; a swapped-in
# tensor lands on the device through a Snapshot of its own (``landing_name``), which the backward pass reads.
SWAP_OPS = frozenset({"EnsureShape", "Snapshot"})
SWAP_OUT_SCOPE, SWAP_IN_SCOPE, LANDING = "lms_swap_out", "lms_swap_in", "lms_landed"
# The name scope of the ops recompute.py clones.
RECOMPUTE_SCOPE = "lms_recompute"

# Ops whose outputs hold no new memory of the step (variables, constants, arguments).
FREE_OPS = frozenset({"ReadVariableOp", "Const", "HostConst", "_Arg", "_DeviceArg", "VarHandleOp", "NoOp",
                      "_Retval", "_DeviceRetval"}) | SHAPE_OPS

# Ops that yield the step's input batch.
INPUT_OPS = frozenset({"IteratorGetNext", "OptionalGetValue", "_Arg"})

_REPLICA_PREFIX = re.compile(r"^(replica_\d+/)?")
# A replica's gradient ops: the tape opens its scope at the graph's top, so they read "gradient_tape/replica_N/...".
_REPLICA_OF = re.compile(r"^(?:(?:gradient_tape|gradients(?:_\d+)?)/)?(replica_\d+/)")


def replica_prefix(op_name: str) -> str:
    """The ``replica_N/`` scope a distribution strategy gives a replica's ops ("" for the first replica), its
    forward ops' ("replica_1/model/...") and its gradient ops' ("gradient_tape/replica_1/model/...") alike.

    Example:
        >>> replica_prefix("replica_1/model/dense/MatMul"), replica_prefix("model/dense/MatMul")
        ('replica_1/', '')
        >>> replica_prefix("gradient_tape/replica_1/model/dense/MatMul/MatMul_1")
        'replica_1/'
    """
    found = _REPLICA_OF.match(op_name)
    return found.group(1) if found else ""


_REWRITE_SCOPES = ("ArithmeticOptimizer",)  # Grappler's optimizers that name a node they make after the one it replaces
_STAGE = re.compile(r"[A-Z][A-Za-z0-9]*_")


def grappler_origins(name: str) -> list[str]:
    """The names the node a Grappler optimizer made in place of another may have had: ``scope/Optimizer/Stage_name``
    or ``scope/Optimizer/Stage_rule_name`` (a rule such as a dtype) come from ``scope/name``, and such a name from
    a rewrite again from its own origins, most likely first.

    Example:
        >>> grappler_origins("dense/Tensordot/ArithmeticOptimizer/FoldTransposeIntoMatMul_MatMul")
        ['dense/Tensordot/MatMul']
        >>> grappler_origins("a/Cast_1/ArithmeticOptimizer/ReorderCastLikeAndValuePreserving_float_Cast")
        ['a/Cast_1/float_Cast', 'a/Cast_1/Cast']
    """
    scope, _, last = name.rpartition("/")
    scope, _, optimizer = scope.rpartition("/")
    stage = _STAGE.match(last)
    if optimizer not in _REWRITE_SCOPES or stage is None:
        return []
    rest = last[stage.end():]
    names = [rest] + ([rest.partition("_")[2]] if "_" in rest else [])
    found = []
    for each in names:
        origin = f"{scope}/{each}" if scope else each
        found += [origin] + grappler_origins(origin)
    return found


@functools.lru_cache(maxsize=1 << 16)  # asked tens of thousands of times a first step, of fewer names
def op_name_in_step(name: str) -> str:
    """An op's name inside the train step: without the function-call scopes TensorFlow puts before an
    executed op, nor a replica's scope.

    Example:
        >>> op_name_in_step("StatefulPartitionedCall/adam/mul_4"), op_name_in_step("replica_1/gradient_tape/x")
        ('adam/mul_4', 'gradient_tape/x')
    """
    scopes = name.split("/")
    while len(scopes) > 1 and scopes[0].endswith("PartitionedCall"):
        scopes = scopes[1:]
    return _REPLICA_PREFIX.sub("", "/".join(scopes))


def is_backward(op_name: str) -> bool:
    """Whether an op (traced or executed) belongs to the backward pass: the gradient tape's scopes.

    Example:
        >>> [is_backward(n) for n in ("model/conv/Conv2D", "gradient_tape/model/conv/Conv2DBackpropInput",
        ...                           "StatefulPartitionedCall/gradients_1/x", "replica_1/gradient_tape/y")]
        [False, True, True, True]
    """
    scope = op_name_in_step(op_name).split("/")[0]
    return scope in ("gradient_tape", "gradients") or scope.startswith("gradients_")


def phase_of(op_name: str, optimizer_scope: str | None) -> str:
    """Which part of a Keras train step an op belongs to, from its name scope.

    Example:
        >>> [phase_of(name, "adam") for name in ("sequential/dense/MatMul",
        ...  "gradient_tape/sequential/dense/MatMul/MatMul", "adam/Sub_7", "StatefulPartitionedCall/adam/mul_4",
        ...  "lms_swap_in/sequential/dense/Relu_0/_90", "sequential/dense/Relu/lms_landed_0")]
        ['forward', 'backward', 'optimizer', 'optimizer', 'backward', 'backward']
    """
    if is_backward(op_name) or op_name_in_step(op_name).split("/")[0] == SWAP_IN_SCOPE or is_landing(op_name):
        return "backward"  # a swap-in is gated by a backward op: it runs in the backward pass
    if optimizer_scope and op_name_in_step(op_name).split("/")[0] == optimizer_scope:
        return "optimizer"
    return "forward"


def kind_of_op(op_name: str, optimizer_scope: str | None, swapped_in: bool = False, is_input: bool = False) -> str:
    """The kind (``core.peak.KINDS``) of a buffer made by op ``op_name`` in a Keras train step.

    Example:
        >>> [kind_of_op(n, "adam") for n in ("model/conv/Conv2D", "gradient_tape/model/conv/Conv2DBackpropInput",
        ...                                   "adam/Sqrt_3")]
        ['activations_kept', 'gradients', 'other']
    """
    if swapped_in:
        return "activations_swapped_in"
    if is_input:
        return "other"
    return {"forward": "activations_kept", "backward": "gradients"}.get(phase_of(op_name, optimizer_scope), "other")


def swap_name(tensor_name: str) -> str:
    """The name LMS's swap ops of a tensor carry after their scope ("lms_swap_in/<this>").

    Example:
        >>> swap_name("model/conv/Relu:0")
        'model/conv/Relu_0'
    """
    return re.sub(r"[^A-Za-z0-9_./-]", "_", tensor_name.replace(":", "_"))


def landing_name(tensor) -> str:
    """The name of the op a swapped ``tensor`` lands on the device through: under its producer's name, so that it
    sorts among the step's names where the producer does (Grappler orders a commutative op's inputs by name before
    it reassociates them with a constant: another place would group the arithmetic, and round, otherwise).

    Example:
        >>> from types import SimpleNamespace as T
        >>> landing_name(T(op=T(name="model/act/mul"), value_index=0))
        'model/act/mul/lms_landed_0'
    """
    return f"{tensor.op.name}/{LANDING}_{tensor.value_index}"


def is_landing(op_name: str) -> bool:
    """Whether an op (traced or executed) is where a swapped-in tensor lands on the device (``landing_name``).

    Example:
        >>> is_landing("StatefulPartitionedCall/model/act/mul/lms_landed_0"), is_landing("model/act/mul")
        (True, False)
    """
    return op_name.rsplit("/", 1)[-1].startswith(LANDING + "_")


def swapped_tensor_name(op_name: str) -> str | None:
    """For a swap-in op (traced or executed): the ``swap_name`` of the tensor it brings back; else None.

    Example:
        >>> swapped_tensor_name("StatefulPartitionedCall/lms_swap_in/model/conv/Relu_0"), swapped_tensor_name("x")
        ('model/conv/Relu_0', None)
    """
    marker = SWAP_IN_SCOPE + "/"
    return op_name.split(marker, 1)[1] if marker in op_name else None


def is_swap_op(op_name: str) -> bool:
    """Whether an op (traced or executed) is one of LMS's swap ops.

    Example:
        >>> is_swap_op("StatefulPartitionedCall/lms_swap_in/conv_Relu_0"), is_swap_op("conv/Relu")
        (True, False)
    """
    return any(scope in (SWAP_OUT_SCOPE, SWAP_IN_SCOPE) for scope in op_name.split("/"))


_GRADIENT_SUM = re.compile(r"^(replica_\d+/)?AddN(_\d+)?$")


def is_gradient_sum(op_name: str) -> bool:
    """Whether a traced op is one of the gradient tape's sums of a tensor's partial gradients (unscoped ``AddN``).

    Example:
        >>> [is_gradient_sum(n) for n in ("AddN_113", "replica_1/AddN", "gradient_tape/model/add/AddN")]
        [True, True, False]
    """
    return bool(_GRADIENT_SUM.match(op_name))


def is_join(op_name: str) -> bool:
    """Whether an op (traced or executed) is one of the backward order's joins (core/order.py).

    Example:
        >>> is_join("lms_order/conv2_block1_0_bn"), is_join("StatefulPartitionedCall/lms_order/x"), is_join("x/y")
        (True, True, False)
    """
    return op_name_in_step(op_name).split("/")[0] == JOIN_SCOPE


def clone_name(op, candidate: int, position: int) -> str:
    """The name of a recompute clone of ``op`` (the ``position``-th of the chain that recomputes candidate number
    ``candidate``): under the op's own name, so that it sorts among the step's names where the op does (as a swap's
    landing op does: ``landing_name``).

    Example:
        >>> from types import SimpleNamespace as T
        >>> clone_name(T(name="model/act/Relu"), 7, 1)
        'model/act/Relu/lms_recompute_7_1'
    """
    return f"{op.name}/{RECOMPUTE_SCOPE}_{candidate}_{position}"


def is_recompute_op(op_name: str) -> bool:
    """Whether an op (traced or executed) is one of the clones LMS recomputes a tensor with (``clone_name``).

    Example:
        >>> is_recompute_op("StatefulPartitionedCall/model/act/Relu/lms_recompute_7_1"), is_recompute_op("model/relu")
        (True, False)
    """
    return op_name.rsplit("/", 1)[-1].startswith(RECOMPUTE_SCOPE + "_")
