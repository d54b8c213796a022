"""TensorFlow's executed partition graphs as replay nodes (no TensorFlow import).

After Grappler and placement, TensorFlow splits a function into one graph per
device; an edge between devices becomes a ``_Send`` / ``_Recv`` pair that
share a ``tensor_name``. Here each ``_Recv`` becomes a copy of its ``_Send``'s
input, so the partitions read as one dataflow graph: a ``_Recv`` on the
accelerator allocates device memory (a swap-in lands there), one on the host
does not. The reader takes GraphDef protos, or anything with the same fields.
"""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple

from ..core.simulate import Node, as_soon_as_ready, collector_paused, execution_order
from .graph import (ALIASING_OPS, FORWARDING_OPS, FREE_OPS, SHAPE_OPS, SWAP_OPS, is_recompute_op, is_swap_op,
                    op_name_in_step)

def _parse_input(text: str) -> tuple[str, int, bool]:
    if text.startswith("^"):
        return text[1:], 0, True
    name, _, index = text.partition(":")
    return name, int(index) if index.isdigit() else 0, False


def _tensor_name(node) -> str:
    attr = node.attr["tensor_name"] if "tensor_name" in node.attr else None
    value = getattr(attr, "s", b"") if attr is not None else b""
    return value.decode() if isinstance(value, bytes) else str(value)


def nodes_from_partitions(partition_graphs: Iterable, device: str,
                          size_of: Callable[[str, str, int], int | None],
                          priority_of: Callable[[str], float | None],
                          undo_swaps: bool = False, optimizer_after: float | None = None,
                          scratch_of: Callable[[str], int] | None = None,
                          itemsizes_of: Callable | None = None,
                          elements_of: Callable[[str, str, int], int | None] | None = None,
                          chunk_of: Callable[[str], int] | None = None,
                          ) -> tuple[list[Node], list[str]]:
    """Builds replay nodes from partition graphs.

    Args:
        partition_graphs: GraphDef protos (``node`` with ``name``, ``op``,
            ``input``, ``device``, ``attr``).
        device: the accelerator's device name, or a suffix of it ("CPU:0").
        size_of: bytes of output ``index`` of node ``name`` (op type given), or None if unknown.
        priority_of: the program order of a node, or None (then it runs as
            soon as it is ready).
        undo_swaps: predict the graph without LMS: consumers of a swapped-in
            or recomputed tensor read the original device tensor, and the
            copies and clones disappear.
        optimizer_after: the program position after which the optimizer's updates come (they run as soon as
            their gradient is ready: ``core.simulate.as_soon_as_ready``), or None.
        scratch_of: the bytes node ``name``'s kernel holds beyond its outputs while it runs (measured:
            ``core.scratch``), held as one more output that no node reads; None: none.
        itemsizes_of: the bytes of an element of each output of a NodeDef, or None where not known
            (``internals.output_itemsizes``): an output of unknown size is then sized by its elements (a
            comparison's bool output of float32 inputs is a quarter of their bytes); None: by its inputs' bytes.
        elements_of: the elements of output ``index`` of node ``name`` where ``size_of`` does not know its bytes
            (a node Grappler made in place of a traced one, of another type), sized with ``itemsizes_of``.
        chunk_of: the bytes node ``name``'s first output held beyond its own in the allocator's chunk (measured:
            ``core.scratch.chunk_excess``), added to it; None: none.

    Returns:
        The nodes, and the names of device nodes whose size was unknown.
    """
    with collector_paused():
        return _nodes_from_partitions(partition_graphs, device, size_of, priority_of, undo_swaps, optimizer_after,
                                      scratch_of, itemsizes_of, elements_of, chunk_of)


def _nodes_from_partitions(partition_graphs, device, size_of, priority_of, undo_swaps, optimizer_after,
                           scratch_of=None, itemsizes_of=None, elements_of=None, chunk_of=None):
    index = _PartitionIndex(partition_graphs, device)
    graph_nodes, sends, by_name, on_device = index.nodes, index.sends, index.by_name, index.on_device
    resolve, swapped_origin = index.resolve, index.swapped_origin

    removed: set[str] = set()
    rewired: dict[tuple[str, int], tuple[str, int]] = {}
    recomputed: dict[str, str] = {}  # a recompute clone -> the executed op it clones the candidate's producer of
    if undo_swaps:
        for node in graph_nodes:
            origin = index.recomputed_origin(node.name)
            if origin is not None:
                recomputed[node.name] = origin
                removed.add(node.name)
        for node in graph_nodes:
            if node.op == "_Recv" and on_device(node):
                origin = swapped_origin(node.name, 0)
                if origin is not None:
                    rewired[(node.name, 0)] = origin
                    removed.add(node.name)
        for node in graph_nodes:  # host copies that only fed swap-ins
            if not on_device(node) and (is_swap_op(node.name) or node.op in ("_Recv", "_Send")):
                removed.add(node.name)
        receivers: dict[str, list] = {}
        for node in graph_nodes:
            if node.op == "_Recv":
                receivers.setdefault(_tensor_name(node), []).append(node)
        for node in graph_nodes:
            if node.op == "_Send" and on_device(node) and node.input:
                readers = receivers.get(_tensor_name(node), [])
                if readers and all(r.name in removed for r in readers):
                    removed.add(node.name)

    referenced: dict[str, int] = {}
    inputs_of: dict[str, tuple[list, list]] = {}
    for node in graph_nodes:
        if node.name in removed:
            continue
        data, control = [], []
        if node.op == "_Recv":
            send = sends.get(_tensor_name(node))
            if send is not None and send.name not in removed and send.input:
                name, index, is_control = _parse_input(send.input[0])
                (control if is_control else data).append((name, index))
                control.append(send.name)
        for text in node.input:
            name, index, is_control = _parse_input(text)
            source = by_name.get(name)
            if source is not None and source.op in ("NextIteration", "RefNextIteration"):
                continue  # a loop's back edge: the replay walks one iteration
            if is_control:
                control.append(name)
            elif node.op not in SHAPE_OPS:  # shape ops read metadata, not the buffer
                data.append((recomputed[name], index) if name in recomputed else rewired.get((name, index),
                                                                                             (name, index)))
        inputs_of[node.name] = (data, control)
        for name, index in data:
            referenced[name] = max(referenced.get(name, 0), index + 1)

    unknown: list[str] = []
    nodes: list[Node] = []
    itemsizes = {} if itemsizes_of is None else {
        node.name: itemsizes_of(node) for node in graph_nodes if node.name not in removed}
    for node in graph_nodes:
        if node.name in removed:
            continue
        data, control = inputs_of[node.name]
        outputs = []
        for index in range(referenced.get(node.name, 0)):  # outputs nobody reads are left out
            if node.op in FREE_OPS:
                outputs.append(0)
                continue
            size = size_of(node.name, node.op, index)
            if size is None and node.op == "_Recv":
                source = resolve(node.name, index)
                source_node = by_name.get(source[0])
                source_op = source_node.op if source_node is not None else ""
                size = 0 if source_op in FREE_OPS else size_of(source[0], source_op, source[1])
            own = itemsizes.get(node.name)
            if size is None and elements_of is not None and own is not None and index < len(own):
                elements = elements_of(node.name, node.op, index)
                size = None if elements is None else elements * own[index]
            outputs.append(size)  # None: filled in below from the inputs
        chunk = chunk_of(node.name) if chunk_of is not None and outputs and outputs[0] else 0
        if chunk:  # the allocator's chunk for the first output, larger than its bytes: held while it lives
            outputs[0] += chunk
        scratch = scratch_of(node.name) if scratch_of is not None else 0
        if scratch:  # the kernel's own buffers, held while it runs: an output after those read
            outputs.append(scratch)
        alias = (-1 if node.op == "IdentityN" else 0) if node.op in ALIASING_OPS and data else None
        priority = priority_of(node.name)
        nodes.append(Node(node.name, tuple(outputs), tuple(data), tuple(control), on_device(node), alias,
                          -1.0 if priority is None else priority, node.op in FORWARDING_OPS))
    nodes = _fill_unknown_sizes(nodes, unknown, itemsizes)
    _propagate_priorities(nodes)
    step_inputs = {node.name for node in graph_nodes if node.name not in removed and _is_step_input(node)}
    return as_soon_as_ready(nodes, step_inputs, optimizer_after), unknown


_RESOURCE = 20  # DT_RESOURCE: a variable's (or an iterator's) handle, not the step's data


def _is_step_input(node) -> bool:
    """Whether an executed node yields the step's data: the iterator's next batch, or a function argument that is
    not a handle."""
    if node.op in ("IteratorGetNext", "IteratorGetNextSync", "OptionalGetValue"):
        return True
    return node.op in ("_Arg", "_DeviceArg") and "T" in node.attr and node.attr["T"].type != _RESOURCE


class _PartitionIndex:
    """The partition graphs' nodes by name, the _Send of each tensor name, and the walks across them."""

    def __init__(self, partition_graphs: Iterable, device: str):
        self.nodes = [node for graph in partition_graphs for node in graph.node]
        self.sends = {_tensor_name(node): node for node in self.nodes if node.op == "_Send"}
        self.by_name = {node.name: node for node in self.nodes}
        self.device = device
        self._in_step: dict[str, str] | None = None

    def recomputed_origin(self, name: str) -> str | None:
        """For a clone recompute.py made (``graph.clone_name``: ``<op>/lms_recompute_<candidate>_<i>``): the
        executed op it copies (for the chain's last clone, the only one with readers outside the chain, the
        candidate's producer); else None. Where Grappler renamed the op away, the clone stays (a warning for the
        prediction only)."""
        if not is_recompute_op(name):
            return None
        exact = name.rsplit("/", 1)[0]
        if exact in self.by_name:
            return exact
        op_name = op_name_in_step(exact)
        if self._in_step is None:
            self._in_step = {op_name_in_step(node.name): node.name for node in self.nodes}
        return self._in_step.get(op_name)

    def on_device(self, node) -> bool:
        return node.device.endswith(self.device)

    def resolve(self, name: str, index: int) -> tuple[str, int]:
        """Follows a _Recv back to what its _Send sends."""
        node = self.by_name.get(name)
        while node is not None and node.op == "_Recv":
            send = self.sends.get(_tensor_name(node))
            if send is None or not send.input:
                break
            name, index, _ = _parse_input(send.input[0])
            node = self.by_name.get(name)
        return name, index

    def swapped_origin(self, name: str, index: int) -> tuple[str, int] | None:
        """For a device _Recv of a swap-in: the device tensor that was swapped out."""
        node = self.by_name.get(name)
        if node is None or node.op != "_Recv" or not self.on_device(node):
            return None
        hops = 0
        while hops < 16:
            name, index = self.resolve(name, index)
            node = self.by_name.get(name)
            if node is None:
                return None
            if self.on_device(node):
                return (name, index) if hops else None
            if node.op not in SWAP_OPS or not is_swap_op(node.name):
                return None
            name, index, _ = _parse_input(node.input[0])
            hops += 1
        return None


def swapped_in(partition_graphs: Iterable, device: str) -> dict[str, tuple[str, int]]:
    """The device _Recv nodes that bring a swapped tensor back, each with the tensor it brings back.

    Example:
        >>> from types import SimpleNamespace as N
        >>> attr = lambda name: {"tensor_name": N(s=name.encode())}
        >>> graph = N(node=[N(name="relu", op="Relu", input=[], device="GPU:0", attr={}),
        ...     N(name="send_out", op="_Send", input=["relu"], device="GPU:0", attr=attr("t0")),
        ...     N(name="recv_out", op="_Recv", input=[], device="CPU:0", attr=attr("t0")),
        ...     N(name="lms_swap_in/relu", op="Snapshot", input=["recv_out"], device="CPU:0", attr={}),
        ...     N(name="send_in", op="_Send", input=["lms_swap_in/relu"], device="CPU:0", attr=attr("t1")),
        ...     N(name="recv_in", op="_Recv", input=[], device="GPU:0", attr=attr("t1"))])
        >>> swapped_in([graph], "GPU:0")
        {'recv_in': ('relu', 0)}
    """
    index = _PartitionIndex(partition_graphs, device)
    found = {}
    for node in index.nodes:
        if node.op == "_Recv" and index.on_device(node):
            origin = index.swapped_origin(node.name, 0)
            if origin is not None:
                found[node.name] = origin
    return found


def swap_ins(partition_graphs: Iterable, device: str) -> dict[str, tuple[str, tuple[str, int]]]:
    """The device _Recv nodes of swap-ins, each with the name of the host swap-in op before it (which names the
    swapped tensor, however Grappler renamed its producer) and the device tensor it brings back."""
    index = _PartitionIndex(partition_graphs, device)
    found = {}
    for recv, origin in swapped_in(partition_graphs, device).items():
        host_op = index.resolve(recv, 0)[0]
        found[recv] = (host_op, origin)
    return found


def _fill_unknown_sizes(nodes: list[Node], unknown: list[str],
                        itemsizes: dict[str, tuple[int, ...] | None] | None = None) -> list[Node]:
    """An output of unknown size is taken to hold as many elements as the node's largest input (exact for
    element-wise ops, such as an optimizer's updates in nested functions, and comparisons), at its own element
    size where ``itemsizes`` knows both (a bool of a float32 input: a quarter of its bytes), else its bytes."""
    itemsizes = itemsizes or {}
    # an input's node by name (of a name two partitions share, the last one); each node's own place
    position = {node.name: index for index, node in enumerate(nodes)}
    own_position = {id(node): index for index, node in enumerate(nodes)}

    def itemsize(name: str, index: int) -> int | None:
        sizes = itemsizes.get(name)
        return sizes[index] if sizes is not None and index < len(sizes) else None

    for node in execution_order(nodes):
        at = own_position[id(node)]
        node = nodes[at]
        if all(size is not None for size in node.outputs):
            continue
        if node.on_device:
            unknown.append(node.name)
        known = [(nodes[position[name]].outputs[index], itemsize(name, index)) for name, index in node.inputs
                 if name in position and index < len(nodes[position[name]].outputs)]
        known = [(size, each) for size, each in known if size is not None]
        outputs = []
        for index, size in enumerate(node.outputs):
            if size is None:
                own = itemsize(node.name, index)
                size = max([nbytes // each * own if own and each else nbytes for nbytes, each in known], default=0)
            outputs.append(size)
        nodes[at] = Node(node.name, tuple(outputs), node.inputs, node.control_inputs, node.on_device,
                         node.alias_input, node.priority, node.forwards_input)
    return nodes


def _propagate_priorities(nodes: list[Node]) -> None:
    """Nodes without a program position take their latest input's (and run right after it)."""
    by_name = {node.name: node for node in nodes}
    position_of = {node.name: position for position, node in enumerate(nodes)}
    for node in execution_order(nodes):  # inputs get their priority first
        node = by_name[node.name]
        position = position_of[node.name]
        if node.priority >= 0:
            continue
        sources = [by_name[name].priority for name, _ in node.inputs if name in by_name] + \
                  [by_name[name].priority for name in node.control_inputs if name in by_name]
        nodes[position] = Node(node.name, node.outputs, node.inputs, node.control_inputs, node.on_device,
                               node.alias_input, max([p for p in sources if p >= 0], default=0.0),
                               node.forwards_input)
        by_name[node.name] = nodes[position]


class SwapRoute(NamedTuple):
    """One swapped tensor's way through the executed step: the device op (its name, type) and output that made it,
    the device ops that read it there (``readers``), the host ops that send it back (``swap_ins``) and the device ops
    it lands at (``landings``)."""

    producer: str
    op_type: str
    index: int
    readers: tuple
    swap_ins: tuple
    landings: tuple


def swap_routes(partition_graphs: Iterable, device: str) -> list[SwapRoute]:
    """Each swapped tensor's :class:`SwapRoute` in the partition graphs, in the order of its first swap-in.

    Example:
        >>> from types import SimpleNamespace as N
        >>> attr = lambda name: {"tensor_name": N(s=name.encode())}
        >>> graph = N(node=[N(name="relu", op="Relu", input=[], device="GPU:0", attr={}),
        ...     N(name="pool", op="MaxPool", input=["relu"], device="GPU:0", attr={}),
        ...     N(name="send_out", op="_Send", input=["relu"], device="GPU:0", attr=attr("t0")),
        ...     N(name="recv_out", op="_Recv", input=[], device="CPU:0", attr=attr("t0")),
        ...     N(name="lms_swap_in/relu", op="Snapshot", input=["recv_out"], device="CPU:0", attr={}),
        ...     N(name="send_in", op="_Send", input=["lms_swap_in/relu"], device="CPU:0", attr=attr("t1")),
        ...     N(name="recv_in", op="_Recv", input=[], device="GPU:0", attr=attr("t1")),
        ...     N(name="grad/lms_landed_0", op="Snapshot", input=["recv_in"], device="GPU:0", attr={})])
        >>> swap_routes([graph], "GPU:0")
        [SwapRoute(producer='relu', op_type='Relu', index=0, readers=('pool',), swap_ins=('lms_swap_in/relu',), landings=('grad/lms_landed_0',))]
    """
    index = _PartitionIndex(partition_graphs, device)
    readers: dict[tuple[str, int], list[str]] = {}
    for node in index.nodes:
        for text in node.input:
            name, position, control = _parse_input(text)
            if not control:
                readers.setdefault((name, position), []).append(node.name)
    routes: dict[tuple[str, int], SwapRoute] = {}
    for recv, origin in swapped_in(partition_graphs, device).items():
        send = index.sends.get(_tensor_name(index.by_name[recv]))
        swap_in = (_parse_input(send.input[0])[0],) if send is not None and send.input else ()
        producer = index.by_name.get(origin[0])
        on_device = tuple(name for name in readers.get(origin, ()) if index.on_device(index.by_name[name])
                          and index.by_name[name].op != "_Send")
        route = routes.get(origin) or SwapRoute(origin[0], producer.op if producer is not None else "", origin[1],
                                                on_device, (), ())
        routes[origin] = route._replace(swap_ins=route.swap_ins + swap_in,
                                        landings=route.landings + tuple(readers.get((recv, 0), ())))
    return list(routes.values())
