"""The peak explained: what fills device memory at the moment of the peak (pure Python).

A replay with ``explain=True`` lists the buffers live at its peak; here each is
given a kind, and the weights and optimizer state (held through the step) are
added, so that the kinds add up to the peak.

Example:
    >>> from lms_magic.lms.core.simulate import Node, replay
    >>> nodes = [Node("dense/MatMul", (400,)), Node("loss", (4,), (("dense/MatMul", 0),)),  # loss: forward
    ...          Node("gradient_tape/dense/MatMul", (400,), (("loss", 0), ("dense/MatMul", 0)))]
    >>> def describe(tensor):
    ...     kind = "gradients" if tensor[0].startswith("gradient_tape") else "activations_kept"
    ...     return LiveTensor(tensor[0], "dense", (10, 10), 0, kind)
    >>> peak = explain_peak(replay(nodes, explain=True), describe, [LiveTensor("dense/kernel", "dense",
    ...                     (10, 10), 400, "weights")], phase="backward", op="gradient_tape/dense/MatMul")
    >>> peak["by_kind"]["weights"], peak["by_kind"]["activations_kept"], peak["by_kind"]["gradients"]
    (400, 404, 400)
    >>> peak["bytes"] == sum(peak["by_kind"].values())
    True
    >>> peak["layers"]  # the step's own tensors, by the layer that made them
    [{'layer': 'dense', 'bytes': 804}]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# what each kernel holds while it runs beyond its inputs and outputs, as measured (core/scratch.py)
SCRATCH_KIND = "kernel_scratch"
KINDS = ("weights", "optimizer_state", "gradients", "activations_kept", "activations_swapped_in", SCRATCH_KIND,
         "other")
TOP = 10
TIMELINE_POINTS = 400  # the step's memory timeline in stats["peak"], at most this many points


def step_timeline(live_bytes: list[int], base_bytes: int = 0, points: int = TIMELINE_POINTS) -> list[int]:
    """A replay's live device memory after each op, in at most ``points`` values (each the largest of its
    stretch of ops, so the peak stays), with ``base_bytes`` (what the replay held apart) added.

    Example:
        >>> step_timeline([1, 5, 2, 2, 9, 1, 3], base_bytes=10, points=3)
        [15, 19, 13]
    """
    stretch = max(1, -(-len(live_bytes) // points))
    return [base_bytes + max(live_bytes[i:i + stretch]) for i in range(0, len(live_bytes), stretch)]


@dataclass(frozen=True)
class LiveTensor:
    """One tensor live at the peak: the op (or variable) that holds it, its layer, shape (None where the
    graph does not say), bytes and kind."""

    name: str
    layer: str
    shape: tuple | None
    nbytes: int
    kind: str

    def row(self) -> dict:
        return {"name": self.name, "layer": self.layer, "shape": None if self.shape is None else list(self.shape),
                "bytes": self.nbytes,
                "kind": self.kind}


def explain_peak(result, describe: Callable[[tuple[str, int]], LiveTensor], persistent: list[LiveTensor],
                 phase: str, op: str, top: int = TOP) -> dict:
    """``stats["peak"]``: the phase and op of a replay's peak, its bytes by kind, and its largest live tensors.

    Args:
        result: a ``Replay`` made with ``explain=True``.
        describe: the ``LiveTensor`` of a (producer, output index); its ``nbytes`` is replaced by the replay's.
        persistent: the tensors held through the step (weights, optimizer state).
        phase: "forward", "backward" or "optimizer": where the peak op runs.
        op: the name of the op after which the peak happens, as people read it.
        top: how many of the largest tensors to list. Defaults to 10.

    Returns:
        ``{"phase", "op", "bytes", "by_kind": {kind: bytes}, "top": [{"name", "layer", "shape", "bytes",
        "kind"}, ...], "timeline": [bytes, ...], "layers": [{"layer", "bytes"}, ...]}``, the kinds in ``KINDS``
        order and adding up to ``bytes``; ``layers`` the ``top`` layers holding the most of the step's own
        tensors (activations, gradients: the weights and optimizer state apart), largest first;
        ``timeline`` the device memory through the step (:func:`step_timeline`), its largest value ``bytes``.
    """
    if result.live_at_peak is None:
        raise ValueError("explain_peak needs a replay made with explain=True")
    tensors = list(persistent)
    for tensor, nbytes in result.live_at_peak:
        described = describe(tensor)
        tensors.append(LiveTensor(described.name, described.layer, described.shape, nbytes, described.kind))
    by_kind = {kind: 0 for kind in KINDS}
    for tensor in tensors:
        by_kind[tensor.kind if tensor.kind in by_kind else "other"] += tensor.nbytes
    largest = sorted(tensors, key=lambda t: t.nbytes, reverse=True)[:top]
    held_by_layer: dict[str, int] = {}  # the step's own tensors (not the weights and optimizer state) per layer
    for tensor in tensors[len(persistent):]:
        held_by_layer[tensor.layer] = held_by_layer.get(tensor.layer, 0) + tensor.nbytes
    layers = sorted(held_by_layer.items(), key=lambda item: -item[1])[:top]
    total = sum(by_kind.values())
    held_apart = total - result.peak_bytes  # the persistent tensors, where the replay did not count them
    timeline = step_timeline(result.live_bytes, held_apart) if result.live_bytes else []
    return {"phase": phase, "op": op, "bytes": total, "by_kind": by_kind,
            "top": [tensor.row() for tensor in largest], "timeline": timeline,
            "layers": [{"layer": layer or "(no layer)", "bytes": nbytes} for layer, nbytes in layers if nbytes]}


def format_peak(peak: dict) -> str:
    """One line: the peak's phase and op, then its make-up, largest kinds first, in the peak's unit (MiB from
    1 MiB, else KiB).

    Example:
        >>> format_peak({"phase": "backward", "op": "gradient_tape/conv/Conv2DBackpropFilter",
        ...              "bytes": 3 * 2**20, "by_kind": {"weights": 2**20, "gradients": 2 * 2**20}})
        'peak 3.0 MiB in the backward pass (after gradient_tape/conv/Conv2DBackpropFilter): gradients 2.0, weights 1.0'
        >>> format_peak({"phase": "forward", "op": "Cast", "bytes": 1536, "by_kind": {"weights": 1024, "other": 512}})
        'peak 1.5 KiB in the forward pass (after Cast): weights 1.0, other 0.5'
    """
    unit, name = (2**20, "MiB") if peak["bytes"] >= 2**20 else (2**10, "KiB")
    parts = ", ".join(f"{kind} {value / unit:.1f}" for kind, value in
                      sorted(peak["by_kind"].items(), key=lambda item: -item[1]) if value)
    return f"peak {peak['bytes'] / unit:.1f} {name} in the {peak['phase']} pass (after {peak['op']}): {parts}"
