"""Predicted device memory of a train step, from TensorFlow's graphs.

Two sources feed the same liveness replay (simulate.py): the traced FuncGraph
(available before the first step runs, used to plan for a budget), and the
partition graphs that TensorFlow actually executed after Grappler and
placement (collected during the first step: compat.collected_function_graphs).
"""

from __future__ import annotations

import tensorflow as tf

from .partitions import ALIASING_OPS, FREE_OPS, nodes_from_partitions
from .simulate import FORWARDING_OPS, Node, Swap, replay, with_swaps
from .tensorflow import SHAPE_OPS, TensorCandidate, static_bytes


def device_suffix(device: str) -> str:
    """'/GPU:0' or '/job:localhost/.../device:GPU:0' -> 'device:GPU:0'."""
    return "device:" + tf.DeviceSpec.from_string(device).to_string().split("device:")[-1]


def variables_bytes(model) -> int:
    """Bytes of the model's and optimizer's variables (held through the step)."""
    variables = list(model.variables)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not getattr(optimizer, "built", True):
        optimizer = type(optimizer).from_config(optimizer.get_config())  # sized on a copy: the model's untouched
        optimizer.build(model.trainable_variables)
    if optimizer is not None:
        variables += list(getattr(optimizer, "variables", []))
    total, seen = 0, set()
    for variable in variables:
        if id(variable) in seen:
            continue
        seen.add(id(variable))
        count = 1
        for dim in variable.shape:
            count *= int(dim)
        total += count * tf.as_dtype(variable.dtype).size
    return total


class TracedStep:
    """The ops of one traced train step, with sizes and program order."""

    def __init__(self, ops, batch_size: int | None, host_device: str, input_bytes=()):
        self.ops = list(ops)
        self.batch_size = batch_size
        self.input_bytes = list(input_bytes)  # the batch's tensors, as the iterator yields them
        self._host = device_suffix(host_device)
        self._by_name = {op.name: op for op in self.ops}
        self._position = {op.name: index for index, op in enumerate(self.ops)}
        self._nodes: list[Node] | None = None

    def nodes(self) -> list[Node]:
        """The replay's nodes (built once: about 0.15 s for ResNet-50's 9,000 ops)."""
        if self._nodes is None:
            self._nodes = self._build_nodes()
        return self._nodes

    def _build_nodes(self) -> list[Node]:
        nodes = []
        for index, op in enumerate(self.ops):
            outputs = tuple(0 if op.type in FREE_OPS else (static_bytes(t, self.batch_size) or 0) for t in op.outputs)
            # Shape ops read metadata only: they hold no buffer (TensorFlow runs or folds them early).
            inputs = () if op.type in SHAPE_OPS else tuple((t.op.name, t.value_index) for t in op.inputs)
            nodes.append(Node(op.name, outputs, inputs, tuple(c.name for c in op.control_inputs),
                              on_device=not op.device.endswith(self._host),
                              alias_input=(-1 if op.type == "IdentityN" else 0) if op.type in ALIASING_OPS
                              and op.inputs else None, priority=index,
                              forwards_input=op.type in FORWARDING_OPS))
        return nodes

    def predicted_transient_peak(self, swaps: list[TensorCandidate] = ()) -> int:
        """Device memory the step allocates at its peak, beyond what it holds before."""
        return self.replay(swaps).peak_bytes

    def replay(self, swaps: list[TensorCandidate] = ()):
        """The liveness replay of the step with ``swaps``: its peak and the op after which it happens."""
        planned = [Swap((item.tensor.op.name, item.tensor.value_index), tuple(c.name for c in item.consumers),
                        item.trigger.name, item.candidate.nbytes) for item in swaps]
        return replay(with_swaps(self.nodes(), planned))

    def _lookup(self, partition_name: str):
        parts = partition_name.split("/")
        for start in range(len(parts)):
            op = self._by_name.get("/".join(parts[start:]))
            if op is not None:
                return op
        return None

    def size_of(self, partition_name: str, op_type: str, index: int) -> int | None:
        if op_type in ("_Recv", "_Send"):
            return None
        if op_type in ("IteratorGetNext", "OptionalGetValue"):
            return self.input_bytes[index] if index < len(self.input_bytes) else None
        op = self._lookup(partition_name)
        if op is None:
            return None
        if index >= len(op.outputs):
            return 0  # an output that a fusion added (a bias gradient): small
        return static_bytes(op.outputs[index], self.batch_size)

    def priority_of(self, partition_name: str) -> float | None:
        op = self._lookup(partition_name)
        return None if op is None else float(self._position[op.name])


def phase_of(op_name: str, optimizer_scope: str | None) -> str:
    """Which part of a Keras train step an op belongs to, from its name scope.

    Example:
        >>> [phase_of(name, "adam") for name in ("sequential/dense/MatMul",
        ...  "gradient_tape/sequential/dense/MatMul/MatMul", "adam/Sub_7")]
        ['forward', 'backward', 'optimizer']
    """
    scopes = op_name.split("/")
    if scopes[0] in ("gradient_tape", "gradients") or scopes[0].startswith("gradients_"):
        return "backward"
    if optimizer_scope and scopes[0] == optimizer_scope:
        return "optimizer"
    return "forward"


def train_partitions(run_metadata):
    """The partition graphs of the executed train function in ``run_metadata``."""
    best, best_score = None, -1
    for function_graph in run_metadata.function_graphs:
        names = [node.name for graph in function_graph.partition_graphs for node in graph.node]
        score = 10**6 * any("lms_swap" in n for n in names) + sum("gradient_tape" in n for n in names)
        if score > best_score:
            best, best_score = function_graph, score
    return list(best.partition_graphs) if best is not None and best_score > 0 else []


def executed_transient_peaks(partitions, device: str, step: TracedStep) -> tuple[int, int, int]:
    """(peak with LMS, peak without LMS, unknown-size device nodes) from executed partitions."""
    suffix = device_suffix(device)
    with_lms, unknown = nodes_from_partitions(partitions, suffix, step.size_of, step.priority_of)
    without_lms, _ = nodes_from_partitions(partitions, suffix, step.size_of, step.priority_of, undo_swaps=True)
    return replay(with_lms).peak_bytes, replay(without_lms).peak_bytes, len(unknown)
