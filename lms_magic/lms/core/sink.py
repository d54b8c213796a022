"""Values the backward pass computes again, made just before their first reader.

``jax.checkpoint`` puts what it computes again (the inside of an operation's derivative, say tanh's output
before its name) at the start of the backward pass, all of it; XLA fuses each into its reader (they are
element-wise, mostly), so none of them is held through the backward pass. A replay in program order would
hold each from the start of the backward pass to its reader. :func:`sink_recomputed` reorders the replay's
nodes so each value made in the backward pass from the forward pass's values alone runs just before its first
reader: the same nodes, in an order that keeps every input before its reader. Framework-free.
"""

from __future__ import annotations

import dataclasses


def sink_recomputed(nodes: list, recomputed: set) -> list:
    """``nodes`` (``core.indexed.Node``, in program order) with each of ``recomputed`` (node names: made in the
    backward pass from the forward pass's values alone, none of them reading the loss's cotangent) moved just
    before its first reader, and the priorities renumbered in the new order (nodes of priority -1, the inputs,
    stay first).

    Example:
        >>> from lms_magic.lms.core.indexed import Node
        >>> nodes = [Node("x", (4,), priority=-1), Node("y", (4,), (("x", 0),), priority=0),
        ...          Node("again", (4,), (("x", 0),), priority=1), Node("dy", (4,), (("y", 0),), priority=2),
        ...          Node("dx", (4,), (("dy", 0), ("again", 0)), priority=3)]
        >>> [node.name for node in sink_recomputed(nodes, {"again"})]
        ['x', 'y', 'dy', 'again', 'dx']
    """
    if not recomputed:
        return nodes
    readers: dict[str, list[str]] = {}
    for node in nodes:
        for source in {source for source, _ in node.inputs}:
            readers.setdefault(source, []).append(node.name)
    # the order key: (the priority of the first reader that is not recomputed, how many steps before it)
    key = {node.name: (node.priority, 0) for node in nodes}
    for node in reversed(nodes):
        if node.name in recomputed and readers.get(node.name):
            first = min(key[reader] for reader in readers[node.name])
            key[node.name] = (first[0], first[1] - 1)
    index = {node.name: position for position, node in enumerate(nodes)}
    ordered = sorted(nodes, key=lambda node: (node.priority >= 0, key[node.name], index[node.name]))
    counter = iter(range(len(ordered)))
    return [node if node.priority < 0 else dataclasses.replace(node, priority=next(counter)) for node in ordered]
