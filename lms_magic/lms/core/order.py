"""One layer's gradient at a time: an order for the backward pass that lowers its peak and changes no value.

Where a gradient forks (a residual block's output gradient feeds both the block's branch and its
shortcut), an executor runs both branches' gradients side by side, as ready ops come, and each
BatchNormalization gradient makes several full-size intermediates: ResNet-50's backward peak holds
both branches' at once. This module orders the backward pass by *groups* (a layer's gradient ops):
one group runs only when the one before it has finished, depth first (a branch is finished before
its sibling starts). The same ops run on the same inputs, so every value is bit for bit the same;
only when they run changes. A group's swap-ins wait for the group before it (``Ordered.before``),
so they arrive as the group starts, not while a sibling runs.

The order is a list of control edges: a *join* per group (it waits on the group's last ops, those
whose outputs no op of the group reads) and, on each of the next group's first ops (those that read
no op of the group that itself waits on something), an edge from that join. The groups must form
an acyclic graph through the ops between them (a layer called twice can make a cycle): otherwise
there is no order.

Example:
    >>> from lms_magic.lms.core.simulate import Node, replay
    >>> def node(name, size, *sources):  # in program order: both branches interleaved
    ...     return Node(name, (size,), tuple((s, 0) for s in sources), priority=len(nodes))
    >>> nodes = []
    >>> for args in [("g", 100), ("a1", 100, "g"), ("b1", 100, "g"), ("a2", 10, "a1"), ("b2", 10, "b1"),
    ...              ("sum", 10, "a2", "b2")]:
    ...     nodes.append(node(*args))
    >>> groups = {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}
    >>> ordered = backward_order(nodes, groups.get)
    >>> ordered.groups, replay(nodes).peak_bytes, replay(ordered.applied(nodes)).peak_bytes
    (['b', 'a'], 300, 210)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from .simulate import Node, collector_paused, execution_order

JOIN_SCOPE = "lms_order"


def join_name(group: str) -> str:
    """The name of a group's join (a no-op that waits on the group's last ops).

    Example:
        >>> join_name("conv2_block1_0_bn")
        'lms_order/conv2_block1_0_bn'
    """
    return f"{JOIN_SCOPE}/{group}"


@dataclass(frozen=True)
class Ordered:
    """A backward order: the groups in the order they run, and the control edges that make it so.

    ``joins``: join name -> the group's last ops (the join's control inputs). ``waits``: a group's
    first op -> the join it waits on (the previous group's). ``before``: every op of a group after
    the first -> the join of the group before it (what a swap-in for that op waits on).
    """

    groups: list[str]
    joins: dict[str, tuple[str, ...]]
    waits: dict[str, str]
    before: dict[str, str]

    def applied(self, nodes: list[Node]) -> list[Node]:
        """``nodes`` with the joins and the waits on them, for a replay (a join runs right after its
        last input, as the executor runs a no-op once it is ready)."""
        priority = {node.name: node.priority for node in nodes}
        with_waits = [dataclasses.replace(node, control_inputs=node.control_inputs + (self.waits[node.name],))
                      if node.name in self.waits else node for node in nodes]
        return with_waits + [Node(name, (), (), last, True, None, max(priority[n] for n in last))
                             for name, last in self.joins.items()]


def backward_order(nodes: list[Node], group_of: Callable[[str], str | None],
                   adoptable: Callable[[str], bool] = lambda name: False,
                   may_wait: Callable[[str], bool] = lambda name: True) -> Ordered | None:
    """The backward pass's groups one at a time, depth first, as control edges; None where there is
    nothing to order (fewer than two groups) or the groups form a cycle.

    Args:
        nodes: the step's graph (simulate.Node), its priorities the program order.
        group_of: an op's group (its layer's gradient) or None (not in one: forward ops, the
            optimizer's, sums of a tensor's gradients).
        adoptable: ops outside every group that join the group of their inputs where all their
            grouped inputs come from one group (a sum of one layer's partial gradients), so the group
            is finished only when they have run. Defaults to none.
        may_wait: whether a group's first op may take the control edge (a graph optimizer may not fuse an
            op that has one with its neighbour, and the fused kernel's results can differ in the last bit);
            one that may not runs when its inputs are ready. Defaults to all.
    """
    with collector_paused():
        return _backward_order(nodes, group_of, adoptable, may_wait)


def _backward_order(nodes, group_of, adoptable, may_wait) -> Ordered | None:
    group: dict[str, str] = {}
    above: dict[str, frozenset] = {}  # node -> the nearest groups it depends on (through ungrouped nodes)
    members: dict[str, list[Node]] = {}
    depends: dict[str, set] = {}
    empty = frozenset()
    for node in execution_order(nodes):
        sources = [name for name, _ in node.inputs] + list(node.control_inputs)
        nearest = set()
        for source in sources:
            if source in group:
                nearest.add(group[source])
            else:
                nearest |= above.get(source, empty)
        own = group_of(node.name)
        if own is None and len(nearest) == 1 and adoptable(node.name):
            own = next(iter(nearest))
        if own is None:
            above[node.name] = frozenset(nearest) if nearest else empty
            continue
        group[node.name] = own
        members.setdefault(own, []).append(node)
        depends.setdefault(own, set()).update(nearest - {own})
    if len(members) < 2:
        return None
    order = _depth_first(members, depends)
    if order is None:
        return None
    read_by: dict[str, set] = {}
    for node in nodes:
        for source, _ in node.inputs:
            read_by.setdefault(source, set()).add(node.name)
    joins, waits, before, previous = {}, {}, {}, None
    for name in order:
        own = members[name]
        in_group = {node.name for node in own}
        waiting = {node.name for node in own if node.inputs or node.control_inputs}  # not constants
        for node in own:
            if previous is not None:
                if node.name in waiting and not any(source in waiting for source, _ in node.inputs) \
                        and may_wait(node.name):
                    waits[node.name] = previous
                before[node.name] = previous
        last = tuple(node.name for node in own if not read_by.get(node.name, set()) & in_group)
        previous = join_name(name)
        joins[previous] = last
    return Ordered(order, joins, waits, before)


def _depth_first(members: dict[str, list[Node]], depends: dict[str, set]) -> list[str] | None:
    """A topological order of the groups that finishes a branch before its sibling starts: the group
    made ready last runs next (ties: the one whose ops come later in the program first). None on a cycle."""
    users: dict[str, list[str]] = {name: [] for name in members}
    waiting = {name: len(depends[name]) for name in members}
    for name, sources in depends.items():
        for source in sources:
            users[source].append(name)
    first = {name: min(node.priority for node in own) for name, own in members.items()}
    stack = sorted((name for name in members if not waiting[name]), key=first.__getitem__)
    order = []
    while stack:
        name = stack.pop()
        order.append(name)
        ready = []
        for user in users[name]:
            waiting[user] -= 1
            if not waiting[user]:
                ready.append(user)
        stack += sorted(ready, key=first.__getitem__)
    return order if len(order) == len(members) else None
