"""The traced train step as the liveness replay sees it: :class:`TracedStep`, the ops of one trace of Keras's train
step (a ``FuncGraph``, available before the first step runs), their sizes at the traced batch size or at another
(a ``rescale.Rescaled``), their program order and what each tensor is (layer, shape, kind).

The plan is made on it before the first step; the graphs TensorFlow executed after Grappler and placement are
replayed in ``executed.py``, whose nodes take their sizes and order from it by name.
"""

from __future__ import annotations

import copy
import dataclasses

import tensorflow as tf

from ..core.indexed import IndexedGraph
from ..core.peak import SCRATCH_KIND, LiveTensor, explain_peak
from ..core.simulate import Node, Swap, as_soon_as_ready, collector_paused, replay_with_swaps
from .graph import (ALIASING_OPS, FORWARDING_OPS, FREE_OPS, INPUT_OPS, SHAPE_OPS, is_backward, is_join,
                    grappler_origins, is_recompute_op, kind_of_op, op_name_in_step, phase_of)
from .rescale import bytes_of, dims_inferred, dims_sized, sized_dims, static_bytes
from .rewrite import TensorCandidate

__all__ = ["TracedStep", "device_suffix", "recomputes_just_in_time"]


def device_suffix(device: str) -> str:
    """'/GPU:0' or '/job:localhost/.../device:GPU:0' -> 'device:GPU:0'."""
    return "device:" + tf.DeviceSpec.from_string(device).to_string().split("device:")[-1]


def _planned(swaps: list[TensorCandidate], names: dict | None = None) -> list[Swap]:
    """The replay's swaps; ``names``: a dict kept with the step's tensors (each one's names, read once)."""
    names = {} if names is None else names
    planned = []
    for item in swaps:
        if id(item.tensor) not in names:  # the step's ops hold its tensors: their numbers are theirs
            names[id(item.tensor)] = ((item.tensor.op.name, item.tensor.value_index),
                                      tuple(c.name for c in item.consumers), item.trigger.name)
        tensor, consumers, trigger = names[id(item.tensor)]
        planned.append(Swap(tensor, consumers, trigger, item.candidate.nbytes))
    return planned


def recomputes_just_in_time(nodes: list[Node]) -> list[Node]:
    """The recompute clones (made after the whole step, so last in program order) ordered just before their
    first reader, as TensorFlow's executor runs them: as soon as their gate has run. A chain's clones are
    placed from its last (read by the step's own ops) back, in whatever order the graph lists them."""
    clones = [node for node in nodes if is_recompute_op(node.name)]
    if not clones:
        return nodes
    readers: dict[str, list[str]] = {}
    for node in nodes:
        for name, _ in node.inputs:
            readers.setdefault(name, []).append(node.name)
    priority = {node.name: node.priority for node in nodes}

    def placed(name: str, seen=()) -> float:  # a clone's priority: just before its first reader's
        if name in seen:
            return priority[name]
        first = min((placed(reader, seen + (name,)) if is_recompute_op(reader) else priority[reader]
                     for reader in readers.get(name, ())), default=priority[name] + 0.001)
        return first - 0.001

    order = {node.name: placed(node.name) for node in clones if node.name in readers}
    return [dataclasses.replace(node, priority=order[node.name]) if node.name in order else node for node in nodes]


def _joins_when_ready(nodes: list[Node]) -> list[Node]:
    """The backward order's joins (made after the whole step) placed right after their last input: the executor
    runs a no-op as soon as it is ready."""
    priority = {node.name: node.priority for node in nodes}
    return [dataclasses.replace(node, priority=max((priority[n] for n in node.control_inputs if n in priority),
                                                   default=node.priority))
            if is_join(node.name) else node for node in nodes]


class TracedStep:
    """The ops of one traced train step, with sizes and program order.

    Its state is its arguments (7) and what it reads of the ops once, each kept because the plan search asks it
    again and again: the ops by name and position, their outputs and inferred dimensions, the replay's nodes and
    their numbering, and the measured scratch and chunks by op at the batch asked last.
    """

    def __init__(self, ops, batch_size: int | None, host_device, input_bytes=(), ordered=None, known_dims=None,
                 scratch=None):
        """``host_device``: where swapped tensors wait; or a tuple of it and the devices whose ops are not
        this device's (the other replicas' under a distribution strategy): their buffers are not counted.
        ``known_dims``: :meth:`known_dims` where the caller has them already (the same ops' trace).
        ``scratch``: each kernel's scratch as measured (:meth:`with_scratch`), or None."""
        self.ops = list(ops)
        self.ordered = ordered  # the backward order (core.order.Ordered) inserted in these ops, or None
        self.batch_size = batch_size
        self.input_bytes = list(input_bytes)  # the batch's tensors, as the iterator yields them
        self._host = tuple(device_suffix(device) for device in
                           ((host_device,) if isinstance(host_device, str) else host_device))
        self._by_name = {op.name: op for op in self.ops}
        self._position = {op.name: index for index, op in enumerate(self.ops)}
        self._nodes: list[Node] | None = None
        self._indexed: IndexedGraph | None = None
        # the optimizer's ops come after the backward pass's last op in program order
        self.optimizer_after = max((index for index, op in enumerate(self.ops) if is_backward(op.name)), default=None)
        self._join_priority: dict[str, float] | None = None
        self._swap_names: dict = {}  # the replay's swaps' names by tensor (_planned), shared with ``at``'s steps
        self._sized_from: TracedStep | None = None  # the traced step this one is sized from (``at``)
        self._outputs: list | None = None  # each op's outputs as read from TensorFlow (_output_table)
        self._inferred: dict | None = known_dims  # shape inference's dimensions at an unknown-batch trace
        self.scratch = scratch  # each kernel's scratch as measured (core.scratch.KernelScratch), or None
        self._scratch_ops: dict[str, list[str]] | None = None  # traced op -> the measured ops it is (with_scratch)
        self._scratch_at: tuple | None = None  # (batch, the measured scratch there by op), for scratch_of
        self._chunks: tuple | None = None  # (batch, op as named in the step -> its chunk excess there): with_chunks

    def at(self, batch_size, input_bytes=()) -> "TracedStep":
        """The same ops sized at another ``batch_size`` (a :class:`~.rescale.Rescaled`): the ops' names, order and
        phases shared with this step, the sizes and the replay's nodes its own."""
        step = copy.copy(self)
        step.batch_size, step.input_bytes = batch_size, list(input_bytes)
        step._nodes = step._indexed = step._join_priority = None
        step._sized_from = self._sized_from or self
        return step

    def with_scratch(self, scratch) -> None:
        """Each kernel's scratch as measured (a ``core.scratch.KernelScratch``; None: none) held at its op in this
        step's replays: an output of the op that no op reads, so it lives while the kernel runs (the replay's
        nodes are made again)."""
        self.scratch, self._scratch_ops, self._scratch_at = scratch, None, None
        self._nodes = self._indexed = self._join_priority = None

    def with_chunks(self, excess: dict[str, int]) -> None:
        """What each op's outputs held beyond their bytes in a measured step at this step's batch (the allocator's
        chunks: ``core.scratch.chunk_excess``, by op as named in the step), added to the op's first output in the
        executed graphs' replays at that batch (:meth:`chunk_of`)."""
        self._chunks = (getattr(self.batch_size, "to", self.batch_size), dict(excess)) if excess else None

    def chunk_of(self, partition_name: str) -> int:
        """The chunk excess an executed node's first output held, as measured at this step's batch, else 0."""
        if self._chunks is None or self._chunks[0] != getattr(self.batch_size, "to", self.batch_size):
            return 0
        return self._chunks[1].get(op_name_in_step(partition_name), 0)

    def _scratch_by_op(self) -> dict[str, int]:
        """The measured scratch at this step's batch, by traced op (a measured op found by its name less leading
        scopes; one the trace does not hold, a fusion's, is left out)."""
        batch = getattr(self.batch_size, "to", self.batch_size)
        if self.scratch is None or not isinstance(batch, int):
            return {}
        if self._scratch_ops is None:
            self._scratch_ops = {}
            for measured in self.scratch.ops:
                op = self._lookup(measured)
                if op is not None:
                    self._scratch_ops.setdefault(op.name, []).append(measured)
        at = self.scratch.at(batch)
        return {op: max(at[name] for name in names) for op, names in self._scratch_ops.items()}

    def indexed(self) -> IndexedGraph:
        """The replay's nodes numbered once for the searches' replays (core/indexed.py)."""
        if self._indexed is None:
            self._indexed = IndexedGraph(self.nodes())
        return self._indexed

    def nodes(self) -> list[Node]:
        """The replay's nodes (built once: about 0.15 s for ResNet-50's 9,000 ops)."""
        if self._nodes is None:
            with collector_paused():
                self._nodes = self._build_nodes()
        return self._nodes

    def _output_table(self) -> list[tuple[bool, tuple]]:
        """Each op's outputs as read from TensorFlow once: (whether they hold no buffer, each one's (name,
        dimensions or None where its rank is unknown, item size))."""
        if self._outputs is None:
            self._outputs = [(op.type in FREE_OPS,
                              tuple((t.name, t.shape.as_list() if t.shape.rank is not None else None, t.dtype.size)
                                    for t in op.outputs)) for op in self.ops]
        return self._outputs

    def known_dims(self) -> dict[str, list[int]]:
        """Where this step was traced with an unknown batch and is sized at an int one: the dimensions TensorFlow's
        shape inference finds at that batch for the tensors traced with unknown ones (``rescale.dims_inferred``:
        a sequence length read from the input's shape is not the batch). Else empty (an unknown dimension is the
        batch)."""
        if self._inferred is None:
            sized_here = self._sized_from is None and isinstance(self.batch_size, int) and self.ops
            self._inferred = dims_inferred(self.ops[0].graph, self.batch_size) \
                if sized_here and _batch_unknown(self.ops[0].graph) else {}
        return self._inferred

    def _output_bytes(self) -> list[tuple[int, ...]]:
        """Each op's outputs' bytes at this step's batch size (0 where unknown or where they hold no buffer),
        from the traced step's outputs as read once."""
        known, scratch = self.known_dims(), self._scratch_by_op()
        sizes = [(0,) * len(outputs) if free else
                 tuple(0 if dims is None else
                       bytes_of(known.get(name) or dims_sized(name, dims, self.batch_size), itemsize) or 0
                       for name, dims, itemsize in outputs)
                 for free, outputs in (self._sized_from or self)._output_table()]
        if scratch:  # each kernel's scratch: one more output, read by no op
            sizes = [sizes[index] + (scratch[op.name],) if op.name in scratch else sizes[index]
                     for index, op in enumerate(self.ops)]
        return sizes

    def _build_nodes(self) -> list[Node]:
        sizes = self._output_bytes()
        if self._sized_from is not None:  # the traced step's nodes (order, edges, priorities), at this step's sizes
            return [Node(node.name, outputs, node.inputs, node.control_inputs, node.on_device, node.alias_input,
                         node.priority, node.forwards_input) for node, outputs in zip(self._sized_from.nodes(), sizes)]
        nodes = []
        for index, op in enumerate(self.ops):
            outputs = sizes[index]
            # Shape ops read metadata only: they hold no buffer (TensorFlow runs or folds them early).
            inputs = () if op.type in SHAPE_OPS else tuple((t.op.name, t.value_index) for t in op.inputs)
            nodes.append(Node(op.name, outputs, inputs, tuple(c.name for c in op.control_inputs),
                              on_device=not op.device.endswith(self._host),
                              alias_input=(-1 if op.type == "IdentityN" else 0) if op.type in ALIASING_OPS
                              and op.inputs else None, priority=index,
                              forwards_input=op.type in FORWARDING_OPS))
        step_inputs = {op.name for op in self.ops if op.type in INPUT_OPS or op.type == "Placeholder"
                       and op.outputs and op.outputs[0].dtype != tf.resource}
        return as_soon_as_ready(_joins_when_ready(recomputes_just_in_time(nodes)), step_inputs, self.optimizer_after)

    def predicted_transient_peak(self, swaps: list[TensorCandidate] = ()) -> int:
        """Device memory the step allocates at its peak, beyond what it holds before."""
        return self.replay(swaps).peak_bytes

    def replay(self, swaps: list[TensorCandidate] = (), explain: bool = False, resized=None):
        """The liveness replay of the step with ``swaps``: its peak and the op after which it happens
        (and, with ``explain``, the buffers live there). ``resized``: (this step traced at another batch size,
        its candidates of the same tensors): the replay's ``resized_live_bytes`` are its live bytes there
        (core/indexed.py), without a replay of its own."""
        other = None if resized is None else (resized[0].indexed(), _planned(resized[1], resized[0]._swap_names))
        with collector_paused():
            return replay_with_swaps(self.indexed(), _planned(swaps, self._swap_names), explain=explain, resized=other)

    def explain(self, swaps: list[TensorCandidate], persistent: list[LiveTensor], layer_of,
                optimizer_scope: str | None, result=None) -> dict:
        """``stats["peak"]`` for the step with ``swaps`` (see peak.explain_peak); ``result``: a replay of
        them made with ``explain=True`` already."""
        result = result if result is not None else self.replay(swaps, explain=True)
        copies = {f"{swap.tensor[0]}:{swap.tensor[1]}/device_copy": swap.tensor for swap in _planned(swaps)}

        def describe(tensor):
            name, index = tensor
            swapped = name in copies
            if swapped:
                name, index = copies[name]
            return self.describe(name, index, layer_of, optimizer_scope, swapped)

        return explain_peak(result, describe, persistent, phase_of(result.peak_after or "", optimizer_scope),
                            op_name_in_step(result.peak_after or ""))

    def describe(self, name: str, index: int, layer_of, optimizer_scope: str | None,
                 swapped: bool = False) -> LiveTensor:
        """The tensor that output ``index`` of op ``name`` (traced or executed) holds: layer, shape, kind."""
        op = self._lookup(name)
        if op is not None and index == len(op.outputs) and op.name in self._scratch_by_op():
            return self.scratch_tensor(op.name, layer_of)
        if op is None or index >= len(op.outputs):
            return LiveTensor(name, _layer_path(layer_of, name), None, 0, kind_of_op(name, optimizer_scope, swapped))
        tensor = op.outputs[index]
        shape = None if tensor.shape.rank is None else \
            tuple(self.known_dims().get(tensor.name) or sized_dims(tensor, self.batch_size))
        return LiveTensor(tensor.name, _layer_path(layer_of, op.name), shape, 0,
                          kind_of_op(op.name, optimizer_scope, swapped, is_input=op.type in INPUT_OPS))

    def scratch_tensor(self, name: str, layer_of) -> LiveTensor:
        """What op ``name``'s kernel holds while it runs, as a tensor of the peak (its bytes are the replay's)."""
        return LiveTensor(f"{op_name_in_step(name)} (kernel scratch)", _layer_path(layer_of, name), None, 0,
                          SCRATCH_KIND)

    def scratch_of(self, partition_name: str) -> int:
        """The scratch an executed op's kernel holds at this step's batch (measured: ``with_scratch``), else 0."""
        batch = getattr(self.batch_size, "to", self.batch_size)
        if self.scratch is None or not isinstance(batch, int):
            return 0
        if self._scratch_at is None or self._scratch_at[0] != batch:
            self._scratch_at = (batch, self.scratch.at(batch))
        return self._scratch_at[1].get(op_name_in_step(partition_name), 0)

    def _lookup(self, partition_name: str, rewritten: bool = False):
        """The traced op an executed node comes from: its name in the step (less the calls that wrap the step), else
        its name less leading scopes (never its bare last part); ``rewritten``: else the op a node Grappler's
        arithmetic optimizer made in its place was made from (``graph.grappler_origins``)."""
        op = self._by_name.get(op_name_in_step(partition_name))
        if op is not None:
            return op
        parts = partition_name.split("/")
        for start in range(max(len(parts) - 1, 1)):
            op = self._by_name.get("/".join(parts[start:]))
            if op is not None:
                return op
        for origin in grappler_origins(partition_name) if rewritten else ():
            op = self._lookup(origin)
            if op is not None:
                return op
        return None

    def elements_of(self, partition_name: str, op_type: str, index: int) -> int | None:
        """The elements of output ``index`` of an executed node, from the traced op it was made from (Grappler may
        have changed its type: a cast moved past a reshape), or None where not known."""
        op = self._lookup(partition_name, rewritten=True)
        if op is None or index >= len(op.outputs) or not op.outputs[index].dtype.size:
            return None
        nbytes = self._tensor_bytes(op.outputs[index])
        return None if nbytes is None else nbytes // op.outputs[index].dtype.size

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
        return self._tensor_bytes(op.outputs[index])

    def _tensor_bytes(self, tensor) -> int | None:
        """A traced tensor's bytes at this step's batch (its dimensions as inferred there, else sized by rule)."""
        known = self.known_dims().get(tensor.name)
        return static_bytes(tensor, self.batch_size) if known is None else bytes_of(known, tensor.dtype.size)

    def priority_of(self, partition_name: str) -> float | None:
        op = self._lookup(partition_name)
        if op is None:
            return None
        if is_join(op.name):
            if self._join_priority is None:
                self._join_priority = {node.name: node.priority for node in self.nodes() if is_join(node.name)}
            return float(self._join_priority[op.name])
        return float(self._position[op.name])


def _batch_unknown(graph) -> bool:
    """Whether ``graph`` takes its batch with an unknown batch dimension (its iterator's next element, or an
    argument that is not a handle)."""
    for op in graph.get_operations():
        if op.type in INPUT_OPS or op.type == "Placeholder":
            for tensor in op.outputs:
                if tensor.dtype != tf.resource and tensor.shape.rank and tensor.shape[0] is None:
                    return True
    return False


def _layer_path(layer_of, op_name: str) -> str:
    """The layer an op was made in, by its path where the resolver knows it (``rewrite.LayerResolver``)."""
    path = getattr(layer_of, "path", None)
    return path(op_name) if path is not None else layer_of(op_name)[0]
