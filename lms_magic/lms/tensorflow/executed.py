"""The executed train step: the partition graphs TensorFlow ran after Grappler and placement (collected during a
step: ``internals.collected_function_graphs``), replayed for the peaks with and without LMS, and, after a probe
(every eligible candidate swapped), with any subset of those swaps undone: the graph LMS plans on
(:class:`ExecutedStep`). Its nodes take their sizes and program order from the traced step (``traced.py``) by name.
"""

from __future__ import annotations

import dataclasses

from ..core.indexed import IndexedGraph
from ..core.peak import LiveTensor, explain_peak
from ..core.simulate import Node, collector_paused, replay
from .graph import is_backward, is_join, is_swap_op, op_name_in_step, phase_of, swap_name, swapped_tensor_name
from .internals import output_itemsizes
from .partitions import nodes_from_partitions, swap_ins, swapped_in
from .rewrite import TensorCandidate
from .traced import TracedStep, device_suffix, recomputes_just_in_time

__all__ = ["ExecutedGraphs", "ExecutedStep", "executed_peaks", "kernel_scratch_recorded", "peaks_by_device",
           "step_profile_recorded",
           "train_partitions"]


def step_profile_recorded(recorded, device: str | None, deferred: bool = False):
    """A block (a train step) whose profile ``recorded`` gets (a ``core.scratch.StepProfile``:
    ``internals.step_profiled``, which gives the block the profiler's start: ``deferred``, the block starts it),
    where ``device`` is not a GPU (as ``kernel_scratch_recorded``); elsewhere the block gets None."""
    import contextlib

    from .internals import step_profiled

    if (device or "").upper().startswith("/GPU"):
        return contextlib.nullcontext()
    return step_profiled(recorded, deferred)


def kernel_scratch_recorded(recorded, device: str | None):
    """A block (a train step) whose kernels' scratch ``recorded`` gets, by op as named in the step
    (``core.scratch.kernel_scratch`` of TensorFlow's profiler's allocator events: ``internals.step_profiled``),
    where ``device`` is not a GPU: on a GPU the profiler would trace the device too (CUPTI; its options are not
    honoured in TensorFlow 2.21), and the reading there has had no GPU run yet. Elsewhere nothing is read."""
    from ..core.scratch import kernel_scratch
    from .graph import op_name_in_step

    return step_profile_recorded(lambda profile: recorded(kernel_scratch(profile.events, op_name_in_step)), device)


class ExecutedGraphs:
    """The graphs TensorFlow executed in the step whose plan is checked: wanted (collected while the next step
    runs, until a step gives some), collected (read once, then released), or not wanted.

    Example:
        >>> graphs = ExecutedGraphs()
        >>> graphs.wanted, graphs.take()
        (True, None)
        >>> graphs.collected("metadata"); graphs.wanted, graphs.take(), graphs.take()
        (False, 'metadata', None)
    """

    def __init__(self):
        self.wanted = True  # the next step's graphs give the figures
        self._metadata = None

    def want(self) -> None:
        """The next step's graphs are collected (after a retrace)."""
        self.wanted, self._metadata = True, None

    def not_wanted(self) -> None:
        """No graph is collected or read (a plan taken over, or checked without them)."""
        self.wanted, self._metadata = False, None

    def collected(self, run_metadata) -> None:
        """What a step's collection gave (``internals.collected_function_graphs``)."""
        self.wanted, self._metadata = False, run_metadata

    def take(self):
        """The collected RunMetadata, once (None where none was collected); the proto is released."""
        metadata, self._metadata = self._metadata, None
        return metadata


def train_partitions(run_metadata):
    """The partition graphs of the executed train function in ``run_metadata``."""
    best, best_score = None, -1
    for function_graph in run_metadata.function_graphs:
        names = [node.name for graph in function_graph.partition_graphs for node in graph.node]
        score = 10**6 * any(is_swap_op(n) for n in names) + sum(is_backward(n) for n in names)
        if score > best_score:
            best, best_score = function_graph, score
    return list(best.partition_graphs) if best is not None and best_score > 0 else []


def _without_order(nodes: list[Node], ordered) -> list[Node]:
    """Executed nodes without the backward order's control edges (core.order.Ordered; None: none): its joins
    dropped, and an ordered op's control inputs from its join or from the ops that join waited on (Grappler's
    dependency optimizer puts those in place of a join it removes)."""
    if ordered is None:
        return nodes
    waited_on = {entry: set(ordered.joins[join]) | {join} for entry, join in ordered.waits.items()}
    kept = []
    for node in nodes:
        if is_join(node.name):
            continue
        drop = waited_on.get(op_name_in_step(node.name), set())
        controls = tuple(name for name in node.control_inputs if not is_join(name) and op_name_in_step(name) not in drop)
        kept.append(node if controls == node.control_inputs else dataclasses.replace(node, control_inputs=controls))
    return kept


def executed_peaks(partitions, device: str, step: TracedStep, persistent: list[LiveTensor], layer_of,
                   optimizer_scope: str | None, with_lms: bool = True, without_lms: bool = True,
                   executed: "ExecutedStep | None" = None) -> tuple[dict | None, dict | None, int]:
    """The executed partitions replayed with LMS and without (its swaps and recomputes undone, and the backward
    order ``step.ordered`` where one was inserted), each explained (peak.explain_peak: its ``bytes`` include
    ``persistent``), and the count of unknown-size device nodes; ``with_lms`` / ``without_lms`` False: that
    replay is not made (None in its place). ``executed``: the same partitions' :class:`ExecutedStep`, whose nodes
    the replay with LMS reads rather than reading the partitions again."""
    suffix = device_suffix(device)
    brought_back = swapped_in(partitions, suffix)

    scratch_output: dict[str, int] = {}  # a node whose kernel holds scratch -> the output that stands for it

    def describe(tensor):
        name, index = tensor
        if scratch_output.get(name) == index:
            return step.scratch_tensor(name, layer_of)
        if name in brought_back:
            return step.describe(*brought_back[name], layer_of, optimizer_scope, swapped=True)
        return step.describe(name, index, layer_of, optimizer_scope)

    explained, unknown_count = [], 0
    for undo in (False, True):
        if not (without_lms if undo else with_lms):
            explained.append(None)
            continue
        if executed is not None and not undo:
            nodes, unknown = executed.nodes, executed.unknown
        else:
            nodes, unknown = nodes_from_partitions(
                partitions, suffix, step.size_of, step.priority_of, undo_swaps=undo,
                optimizer_after=step.optimizer_after, scratch_of=step.scratch_of, itemsizes_of=output_itemsizes,
                elements_of=step.elements_of, chunk_of=step.chunk_of)
        scratch_output.clear()
        scratch_output.update({node.name: len(node.outputs) - 1 for node in nodes if step.scratch_of(node.name)})
        if executed is None or undo:
            nodes = recomputes_just_in_time(_without_order(nodes, step.ordered) if undo else nodes)
        unknown_count = unknown_count or len(unknown)
        result = replay(nodes, explain=True)
        explained.append(explain_peak(result, describe, persistent, phase_of(result.peak_after or "", optimizer_scope),
                                      op_name_in_step(result.peak_after or "")))
    return explained[0], explained[1], unknown_count


def peaks_by_device(partitions, devices: list[str], step: TracedStep, persistent: list[LiveTensor], layer_of,
                    optimizer_scope: str | None) -> tuple[dict, list[str]]:
    """Under a distribution strategy: each replica's device replayed on its own executed graph, with LMS and
    without (``stats.device_peaks``), and a note for each device whose peaks could not be predicted."""
    peaks, notes = {}, []
    for device in devices:
        try:
            with_lms, without_lms, _ = executed_peaks(partitions, device, step, persistent, layer_of, optimizer_scope)
        except Exception as error:  # a prediction must never stop training
            notes.append(f"{device}'s peaks not predicted ({type(error).__name__}: {error})")
            continue
        peaks[device] = {"with_lms": with_lms["bytes"], "without_lms": without_lms["bytes"]}
    return peaks, notes


class ExecutedStep:
    """The partition graphs TensorFlow executed for a step that swapped every eligible candidate (the probe),
    with any subset of those swaps undone: the plan search's graph, as it runs after Grappler and placement.

    A candidate of the traced step is found among the executed swaps by its swap-in op's name (which names
    the tensor, however Grappler renamed its producer); undoing a swap makes its readers read the device
    tensor again, as without it. Candidates whose swap the executed graphs do not hold stay as they are in
    every prediction.
    """

    def __init__(self, partitions, device: str, traced: TracedStep):
        suffix = device_suffix(device)
        self.partitions = partitions
        self.nodes, self.unknown = nodes_from_partitions(partitions, suffix, traced.size_of, traced.priority_of,
                                                          optimizer_after=traced.optimizer_after,
                                                          scratch_of=traced.scratch_of, itemsizes_of=output_itemsizes,
                                                          elements_of=traced.elements_of,
                                                          chunk_of=traced.chunk_of)
        self.nodes = recomputes_just_in_time(self.nodes)
        self._indexed = None  # the nodes numbered for the replays (IndexedGraph), at the first
        self._swap_ins: dict[str, str] = {}  # the swap name of a traced tensor -> the device _Recv of its swap-in
        self._host_ops: dict[str, str] = {}  # that swap name -> the host swap-in op (gated on the trigger)
        self._origin: dict[str, tuple[str, int]] = {}  # that _Recv -> the executed tensor it brings back
        for recv, (host_op, origin) in swap_ins(partitions, suffix).items():
            tensor = swapped_tensor_name(host_op)
            if tensor is not None:
                self._swap_ins[tensor], self._host_ops[tensor] = recv, host_op
                self._origin[recv] = origin

    def holds(self, item: TensorCandidate) -> bool:
        """Whether the executed graphs hold the candidate's swap (Grappler may have fused its producer away)."""
        return swap_name(item.tensor.name) in self._swap_ins

    def transient_peak(self, items: list[TensorCandidate], gates: dict[str, str] | None = None,
                       reads: dict[str, str] | None = None) -> int:
        """Device memory the executed step allocates at its peak with only ``items`` swapped; ``gates`` (swap
        name -> swap name): a swap brought back at another's gate instead of its own (both in ``items``);
        ``reads`` (traced tensor name -> swap name): a device tensor read again at that swap's gate (by a
        recompute's clones)."""
        kept = {self._swap_ins.get(swap_name(item.tensor.name)) for item in items}
        undone = {recv: origin for recv, origin in self._origin.items() if recv not in kept}
        with collector_paused():
            if not gates and not reads:  # the search's replays: the graph numbered once (core/indexed.py)
                if self._indexed is None:
                    self._indexed = IndexedGraph(self.nodes)
                return self._indexed.replay(substitute=undone).peak_bytes
            nodes = [node if not any(name in undone for name, _ in node.inputs) else
                     dataclasses.replace(node, inputs=tuple(undone[name] if name in undone else (name, index)
                                                            for name, index in node.inputs))
                     for node in self.nodes if node.name not in undone]
            return replay(self._read_again(self._gates_moved(nodes, gates or {}), reads or {})).peak_bytes

    def _read_again(self, nodes: list[Node], reads: dict[str, str]) -> list[Node]:
        """``nodes`` with a reader of each tensor in ``reads`` run just before the first reader of the swap-in it
        names, as a clone runs (so it lives until there at least), where the executed graphs hold both."""
        if not reads:
            return nodes
        in_step = {op_name_in_step(node.name): node.name for node in nodes}  # an op's name in the step -> its node's
        by_name = {node.name: node for node in nodes}
        first_read: dict[str, float] = {}
        for node in nodes:
            for name, _ in node.inputs:
                first_read[name] = min(first_read.get(name, node.priority), node.priority)
        readers = []
        for index, (tensor, other) in enumerate(reads.items()):
            op_name, _, output = tensor.rpartition(":")
            source, recv = in_step.get(op_name), self._swap_ins.get(other, "")
            if source in by_name and recv in by_name:
                readers.append(Node(f"lms_read_again/{index}", (), ((source, int(output)),), (recv,), True, None,
                                    first_read.get(recv, by_name[recv].priority) - 0.001))
        return nodes + readers

    def _gates_moved(self, nodes: list[Node], gates: dict[str, str]) -> list[Node]:
        """``nodes`` with each swap in ``gates`` brought back at the other's gate: its host swap-in waits on
        what the other's waits on, and it and its copy to the device take the other's place in program order."""
        moved = {}  # node name -> (control inputs or None, priority)
        by_name = {node.name: node for node in nodes}
        for tensor, other in gates.items():
            host_op, gate_op = self._host_ops.get(tensor), by_name.get(self._host_ops.get(other, ""))
            recv, other_recv = by_name.get(self._swap_ins.get(tensor, "")), by_name.get(self._swap_ins.get(other, ""))
            if host_op not in by_name or gate_op is None or recv is None or other_recv is None:
                continue
            moved[host_op] = (gate_op.control_inputs, gate_op.priority)
            moved[recv.name] = (None, other_recv.priority)
            for node in nodes:  # the host _Send between them
                if not node.on_device and any(name == host_op for name, _ in node.inputs):
                    moved[node.name] = (None, gate_op.priority)
        return [node if node.name not in moved else dataclasses.replace(
            node, control_inputs=node.control_inputs if moved[node.name][0] is None else moved[node.name][0],
            priority=moved[node.name][1]) for node in nodes]
