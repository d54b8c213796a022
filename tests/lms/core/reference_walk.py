"""The execution order and the liveness walk written plainly (the ready nodes searched, each tensor a (name,
index) key, the live bytes counted as it goes): the reference the replay's engine (core/indexed.py, numbered,
flat and heap-ordered for speed) is held to."""

from lms_magic.lms.core.indexed import Node, Replay


def reference_order(nodes: list[Node]) -> list[int]:
    """The positions of ``nodes`` as the executor's rule runs them: of the ready nodes (every data and control
    input from the graph run), the lowest priority; among equals, the one readied last, and any readied before
    any ready from the start, those by position."""
    index = {node.name: position for position, node in enumerate(nodes)}
    preds = [{index[name] for name, _ in node.inputs if name in index} | {index[name] for name in node.control_inputs
                                                                        if name in index} for node in nodes]
    ready = {position: (nodes[position].priority, position) for position, sources in enumerate(preds) if not sources}
    done, order, readied = set(), [], 0
    while ready:
        position = min(ready, key=lambda p: (ready[p], p))
        del ready[position]
        done.add(position)
        order.append(position)
        for user, sources in enumerate(preds):  # users in node order: the tie-break of those readied together
            if position in sources and user not in done and user not in ready and sources <= done:
                readied += 1
                ready[user] = (nodes[user].priority, -readied)
    return order


def reference_replay(nodes: list[Node], persistent_bytes: int = 0, resized: list[tuple[int, ...]] | None = None) -> Replay:
    """The explained replay of ``nodes`` in the engine's execution order; ``resized``: the bytes of each node's
    outputs at other sizes, the order, buffers and frees kept."""
    order = [nodes[position] for position in reference_order(nodes)]
    sizes = dict(zip((node.name for node in nodes), resized)) if resized is not None else None
    readers: dict[tuple[str, int], int] = {}
    for node in nodes:
        for key in node.inputs:
            readers[key] = readers.get(key, 0) + 1
    buffer_of, buffer_bytes, buffer_sized, buffer_readers, writers = {}, [], [], [], []
    live = peak = live_sized = persistent_bytes
    peak_step, live_bytes, sized_bytes, allocated, freed = -1, [], [], [], []
    for step, node in enumerate(order):
        new = []
        for index, n_bytes in enumerate(node.outputs):
            n_bytes = n_bytes if node.on_device else 0
            key = (node.name, index)
            buffer = _shared(node, index, n_bytes, buffer_of, buffer_bytes, buffer_readers)
            if buffer is not None and buffer < 0:  # in place: this output now writes the input's buffer
                buffer = -buffer - 1
                writers[buffer].append((step, key))
            if buffer is None:
                buffer = len(buffer_bytes)
                sized = (sizes[node.name][index] if node.on_device else 0) if sizes is not None else 0
                buffer_bytes.append(n_bytes), buffer_sized.append(sized), buffer_readers.append(0)
                writers.append([(step, key)]), allocated.append(step), freed.append(len(order))
                live, live_sized = live + n_bytes, live_sized + sized
                new.append(buffer)
            buffer_of[key] = buffer
            buffer_readers[buffer] += readers.get(key, 0)
        live_bytes.append(live), sized_bytes.append(live_sized)
        if live > peak:
            peak, peak_step = live, step
        for key in node.inputs:
            buffer = buffer_of.get(key)
            if buffer is None:
                continue
            buffer_readers[buffer] -= 1
            if buffer_readers[buffer] == 0:
                live, live_sized, freed[buffer] = live - buffer_bytes[buffer], live_sized - buffer_sized[buffer], step
        for buffer in new:  # read by nobody: freed at once
            if buffer_readers[buffer] == 0:
                live, live_sized, freed[buffer] = live - buffer_bytes[buffer], live_sized - buffer_sized[buffer], step
                buffer_readers[buffer] = -1
    at_peak = [(max((w for w in writers[b] if w[0] <= peak_step), key=lambda w: w[0])[1], buffer_bytes[b])
               for b in range(len(buffer_bytes)) if buffer_bytes[b] and allocated[b] <= peak_step <= freed[b]]
    return Replay(peak, order[peak_step].name if peak_step >= 0 else None, [node.name for node in order],
                  at_peak, live_bytes, sized_bytes if sizes is not None else None)


def _shared(node, index, n_bytes, buffer_of, buffer_bytes, buffer_readers):
    """The buffer output ``index`` shares: an aliased input's, or (``-number - 1``) an input's that an in-place
    kernel takes over (same size, read by this node alone); None for a new buffer."""
    inputs = node.inputs
    if node.alias_input is not None:
        aliased = (inputs[index] if index < len(inputs) else None) if node.alias_input == -1 else \
            (inputs[node.alias_input] if index == 0 and node.alias_input < len(inputs) else None)
        if aliased in buffer_of:
            return buffer_of[aliased]
    if index == 0 and node.forwards_input and node.on_device:
        for key in inputs:
            buffer = buffer_of.get(key)
            if buffer is not None and buffer_readers[buffer] == 1 and buffer_bytes[buffer] == n_bytes > 0 \
                    and inputs.count(key) == 1:
                return -buffer - 1
    return None
