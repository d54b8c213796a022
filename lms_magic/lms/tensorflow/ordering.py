"""The backward pass one layer's gradient at a time, in a traced TensorFlow train step (core/order.py).

Each Keras layer's gradient ops (``gradient_tape/<model>/<layer>/...``) are a group; the tape's
unscoped sums of one layer's partial gradients (``AddN``) join it. The order is inserted as
``NoOp`` joins and control edges (bit-identical: no op or input changes), and only where the
liveness replay of the step with every eligible candidate swapped predicts a lower peak with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from ..core.order import Ordered, backward_order
from ..core.plan import Selection
from ..core.simulate import execution_order
from . import internals as tf_internals
from .graph import FUSED_IN_BACKWARD, is_backward, is_gradient_sum, replica_prefix
from .traced import TracedStep
from .rewrite import TensorCandidate, find_candidates


@dataclass
class OrderedStep:
    """A traced step with its backward order inserted: its ops, replay step and candidates."""

    ops: list
    step: TracedStep
    candidates: list[TensorCandidate]
    ordered: Ordered
    added: list  # the control edges inserted: (op, join)

    def remove(self) -> None:
        """Takes the order out of the graph again."""
        remove_order(self.added)


def ordered_step(graph, start: int, step: TracedStep, layer_of, lb: int, host_device: str) -> OrderedStep | None:
    """Inserts the backward order of ``step`` (the trace of ``graph``'s ops from ``start``, its nodes not yet
    read or read before any rewrite) and finds the candidates on the ordered step; None where nothing orders."""
    ordered = step_order(step, layer_of)
    if ordered is None:
        return None
    added = insert_order(graph, ordered)
    ops = graph.get_operations()[start:]
    known = step.known_dims()  # the ordered step's tensors are the step's, its joins added
    traced = TracedStep(ops, step.batch_size, host_device, step.input_bytes, ordered, known_dims=known)
    candidates, _ = find_candidates(ops, layer_of, lb, step.batch_size, order=(rank_of(traced), ordered),
                                    known_dims=known)
    return OrderedStep(ops, traced, candidates, ordered, added)


def lowers_the_peak(selection: Selection, unordered: tuple[TracedStep, list], ordered: OrderedStep) -> bool:
    """Whether the ordered step with every eligible candidate swapped has a lower predicted peak than
    the unordered one (``(step, candidates)``) so."""
    def all_swapped(step, candidates) -> int:
        names = {c.tensor for c in selection.eligible(item.candidate for item in candidates)}
        return step.predicted_transient_peak([item for item in candidates if item.candidate.tensor in names])

    return all_swapped(ordered.step, ordered.candidates) < all_swapped(*unordered)


def ordered_if_lower(graph, start: int, step: TracedStep, candidates: list, layer_of, lb: int, host_device,
                     selection: Selection) -> OrderedStep | None:
    """The step with its backward order inserted (``ordered_step``) where that lowers the predicted peak with every
    eligible candidate swapped (``lowers_the_peak``; ``candidates``: the unordered step's), as ``LMS`` decides it;
    else None, the graph as it was."""
    step.nodes()  # read before the order changes the ops' control inputs
    attempt = ordered_step(graph, start, step, layer_of, lb, host_device)
    if attempt is not None and lowers_the_peak(selection, (step, candidates), attempt):
        return attempt
    if attempt is not None:
        attempt.remove()
    return None


def step_order(step, layer_of) -> Ordered | None:
    """The order of a traced step (traced.TracedStep, its nodes read before any rewrite), or None."""
    def group_of(name: str) -> str | None:
        if not is_backward(name):
            return None
        layer, layer_type = layer_of(name)
        return replica_prefix(name) + layer if layer_type else None

    fused = {op.name for op in step.ops if op.type in FUSED_IN_BACKWARD}
    return backward_order(step.nodes(), group_of, is_gradient_sum, lambda name: name not in fused)


def rank_of(step) -> dict[str, int]:
    """Each op's place in the replay's execution order of ``step`` (a TracedStep of the ordered graph)."""
    return {node.name: index for index, node in enumerate(execution_order(step.nodes()))}


def insert_order(graph, ordered: Ordered) -> list[tuple[object, object]]:
    """Adds the joins and the waits on them to ``graph``; returns the (op, join) control edges added."""
    by_name = {op.name: op for op in graph.get_operations()}
    joins = {}
    for name, last in ordered.joins.items():
        with graph.as_default(), graph.name_scope(None), tf.control_dependencies([by_name[n] for n in last]):
            joins[name] = tf.raw_ops.NoOp(name=name)
    added = []
    for op_name, join in ordered.waits.items():
        tf_internals.add_control_input(by_name[op_name], joins[join])
        added.append((by_name[op_name], joins[join]))
    return added


def remove_order(added: list[tuple[object, object]]) -> None:
    """Takes the control edges ``insert_order`` added out again (its joins stay, waited on by nothing)."""
    for op, join in added:
        tf_internals.remove_control_input(op, join)
