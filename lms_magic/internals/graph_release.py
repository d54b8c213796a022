"""Keras's Functional graphs told to release each intermediate output after its last reader (the step's
activations freed as a plain fit frees them, while a step runs under LMS's checks)."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Iterator


def _graphs_of(model) -> list:
    """Every Keras graph (Functional) that runs when ``model`` is called: its own, a Sequential's, nested ones."""
    graphs = []
    for layer in [model, *model._flatten_layers(include_self=False, recursive=True)]:
        graph = getattr(layer, "_functional", None) or layer  # a Sequential keeps its graph in _functional
        if hasattr(graph, "_nodes_by_depth") and all(graph is not seen for seen in graphs):
            graphs.append(graph)
    return graphs


def _release_plan(graph) -> list[tuple[object, tuple[int, ...]]]:
    """(node arguments, ids of the tensors no later node reads) for each node of ``graph``, in Keras's run order."""
    outputs = {id(tensor) for tensor in graph.outputs}
    last_reader: dict[int, object] = {}
    for depth in sorted(graph._nodes_by_depth, reverse=True):  # the order Function._run_through_graph runs
        for node in graph._nodes_by_depth[depth]:
            if node.operation and not node.is_input:
                for tensor in node.input_tensors:
                    last_reader[id(tensor)] = node
    dropped: dict[int, list[int]] = defaultdict(list)
    for key, node in last_reader.items():
        if key not in outputs:
            dropped[id(node)].append(key)
    return [(node.arguments, tuple(dropped[id(node)])) for node in last_reader.values() if dropped[id(node)]]


def graph_release_plan(model) -> list:
    """What ``graph_intermediates_released`` drops, for every Keras graph of ``model`` (made once per fit)."""
    return [entry for graph in _graphs_of(model) for entry in _release_plan(graph)]


@contextlib.contextmanager
def graph_intermediates_released(plan: list) -> Iterator[None]:
    """Inside the block, a Keras graph drops each intermediate tensor once the last layer that reads it has it.

    ``Function._run_through_graph`` keeps every layer's output in a dict
    until the whole forward pass is over: harmless where a graph compiler
    frees tensors by use (TensorFlow, JAX), but in eager PyTorch it keeps
    every activation on the device to the end of the forward pass, so
    activations offloaded to the host could not free their device memory
    before the peak. Only references are dropped: the values are the same.
    ``plan`` is ``graph_release_plan(model)``.
    """
    patched = []
    try:
        for arguments, keys in plan:
            if "fill_in" in arguments.__dict__:
                continue  # a node shared by two plans (a nested graph seen twice): patched once
            original = arguments.fill_in

            def fill_in(tensor_dict, _original=original, _keys=keys):
                filled = _original(tensor_dict)
                for key in _keys:
                    tensor_dict.pop(key, None)
                return filled

            arguments.fill_in = fill_in
            patched.append(arguments)
        yield
    finally:
        for arguments in patched:
            arguments.__dict__.pop("fill_in", None)
