"""The PyTorch step as the plan sees it: the saved activations of its first step, replayed (no framework import).

PyTorch has no graph to replay before a step runs, so the first step is a probe: every eligible saved
activation is offloaded, and the offloader's events say in which order the forward pass saved them and
the backward pass read them back. That sequence, as replay nodes (core/simulate.py), predicts the peak of
the saved activations for any set offloaded (swapped out after they are saved, back in ``lb`` reads ahead
of their first reader); on CUDA the prediction is calibrated with the allocator's measured peak of the
probe (what the replay leaves out: gradients, workspace, temporaries).

With ``recompute``, :func:`recompute_step` rewrites that sequence for a set of layers run under
``torch.utils.checkpoint`` (torch/recompute.py): autograd keeps their inputs, saved as the layer starts,
and their own saved activations are gone after the forward pass and back, computed again, one read
before the backward pass first reads them; :func:`choose_recomputes` picks the layers.
"""

from __future__ import annotations

import dataclasses

from ..core.plan import Candidate
from ..core.simulate import Node, Swap, replay, with_swaps


class SavedTensorStep:
    """A step's saved activations in forward order and the backward pass's reads of them.

    Args:
        candidates: every eligible saved activation of the step, in forward order.
        reads: the candidates in the order the backward pass read them (a candidate may appear more than once);
            candidates never seen read are taken as read in reverse forward order after the others.
        lb: how many reads ahead of its first reader an offloaded activation starts back.
        recomputed: candidates (among ``candidates``) computed again instead: gone after the forward pass, back
            one read before their first reader, whatever is offloaded. Defaults to none.

    Example:
        >>> cands = [Candidate(f"saved:{i}", f"l{i}", "Dense", (10,), 100, i) for i in range(4)]
        >>> step = SavedTensorStep(cands, list(reversed(cands)))
        >>> step.transient_peak([]), step.transient_peak(cands[:2])
        (400, 200)
    """

    def __init__(self, candidates: list[Candidate], reads: list[Candidate], lb: int = 1,
                 recomputed: list[Candidate] = ()):
        self.candidates, self.lb = list(candidates), lb
        self.recomputed = list(recomputed)
        seen = {candidate.tensor for candidate in reads}
        reads = list(reads) + [c for c in reversed(self.candidates) if c.tensor not in seen]
        forward = {candidate.tensor: index for index, candidate in enumerate(self.candidates)}
        self.nodes = [Node(f"f{index}", (candidate.nbytes,), control_inputs=(f"f{index - 1}",) if index else (),
                           priority=index) for index, candidate in enumerate(self.candidates)]
        last = f"f{len(self.candidates) - 1}" if self.candidates else None
        self._readers: dict[str, list[int]] = {}  # a candidate's reads, as positions in the backward pass
        for candidate in (c for c in reads if c.tensor in forward):
            position = len(self.nodes) - len(self.candidates)
            name = f"b{position}"
            self.nodes.append(Node(name, (0,), ((f"f{forward[candidate.tensor]}", 0),),
                                   (last,) if last else (), priority=len(self.candidates) + position))
            self._readers.setdefault(candidate.tensor, []).append(position)
            last = name
        self._forward = forward

    def _swap(self, candidate: Candidate, lb: int | None = None) -> Swap | None:
        readers = self._readers.get(candidate.tensor)
        if not readers:
            return None
        start = readers[0] - (self.lb if lb is None else lb)  # the read that starts the copy back; before the first: the forward's end
        trigger = f"b{start}" if start >= 0 else f"f{len(self.candidates) - 1}"
        return Swap((f"f{self._forward[candidate.tensor]}", 0), tuple(f"b{p}" for p in readers), trigger,
                    candidate.nbytes)

    def transient_peak(self, offloaded: list[Candidate]) -> int:
        """The peak of the saved activations on the device with ``offloaded`` waiting in host memory."""
        swaps = [self._swap(candidate) for candidate in offloaded] + \
            [self._swap(candidate, lb=1) for candidate in self.recomputed]
        return replay(with_swaps(self.nodes, [swap for swap in swaps if swap is not None])).peak_bytes


def recompute_step(candidates: list[Candidate], reads: list[Candidate], layer_inputs: dict[str, list[Candidate]],
                   layers, lb: int = 1, shared: dict | None = None) -> tuple[SavedTensorStep, list[Candidate]]:
    """The step as it runs with ``layers`` recomputed, and the activations autograd then saves, in the order the
    offloader sees them (what an offload plan is a prefix of).

    A recomputed layer's inputs (``layer_inputs[layer]``: the probe's candidate where some layer saved that
    storage, else one of its own) are saved as the layer starts, unless saved before, and read again where
    the backward pass first reads what the layer saved; the layer's other saved activations are recomputed,
    but for those a layer not recomputed saves too: that layer saves them (a convolution saves its view of the
    activation's output).

    Args:
        candidates: the probe's saved activations, in forward order.
        reads: the probe's backward reads of them, in order.
        layer_inputs: each recomputable layer's inputs.
        layers: the layers to recompute (names).
        lb: as for :class:`SavedTensorStep`.
        shared: for a candidate other layers saved too (the offloader's ``shared``): each such layer and the
            number of candidates saved before it did. Defaults to none.

    Example:
        >>> cand = lambda name, layer, nbytes, i: Candidate(name, layer, "", (1,), nbytes, i)
        >>> conv, centred = cand("x", "bn", 100, 0), cand("centred", "bn", 100, 1)  # a BatchNormalization's
        >>> step, saved = recompute_step([conv, centred], [centred, conv], {"bn": [conv]}, ["bn"])
        >>> [c.tensor for c in saved], [c.tensor for c in step.recomputed], step.transient_peak([])
        (['x'], ['centred'], 200)
        >>> SavedTensorStep([conv, centred], [centred, conv]).transient_peak([])  # the same here: one layer
        200
    """
    inputs = {layer: layer_inputs[layer] for layer in layers if layer in layer_inputs}
    own = {c.tensor for c in candidates if c.layer in inputs}
    saved_at_start = {c.tensor for layer_list in inputs.values() for c in layer_list}
    saved_later: dict[int, list[Candidate]] = {}  # before which probe candidate a kept one is saved
    for candidate in candidates:
        if candidate.tensor in own and candidate.tensor not in saved_at_start:
            sharers = [position for layer, position in (shared or {}).get(candidate.tensor, ()) if layer not in inputs]
            if sharers:
                saved_later.setdefault(min(sharers), []).append(candidate)
    kept = {c.tensor for later in saved_later.values() for c in later}
    forward: list[Candidate] = []
    placed: set[str] = set(kept)
    for index, candidate in enumerate(candidates):
        forward.extend(saved_later.pop(index, ()))
        for item in inputs.get(candidate.layer, ()):  # the layer starts: its inputs are saved (once)
            if item.tensor not in placed:
                forward.append(item)
                placed.add(item.tensor)
        if candidate.tensor not in placed:
            forward.append(candidate)
            placed.add(candidate.tensor)
    forward.extend(c for later in saved_later.values() for c in later)
    recomputed_names = {c.tensor for c in forward if c.tensor in own and c.tensor not in saved_at_start | kept}
    read_again: dict[int, list[Candidate]] = {}  # where the backward pass first reads a layer's saved activations
    for layer, position in _first_reads(reads, inputs).items():
        read_again.setdefault(position, []).extend(inputs[layer])
    new_reads: list[Candidate] = []
    for position, candidate in enumerate(reads):
        new_reads.extend(read_again.get(position, ()))
        new_reads.append(candidate)
    forward = [dataclasses.replace(c, forward_index=index) for index, c in enumerate(forward)]
    by_name = {c.tensor: c for c in forward}
    step = SavedTensorStep(forward, [by_name[c.tensor] for c in new_reads if c.tensor in by_name], lb,
                           [by_name[name] for name in by_name if name in recomputed_names])
    return step, [c for c in forward if c.tensor not in recomputed_names]


def _first_reads(reads: list[Candidate], layers) -> dict[str, int]:
    first: dict[str, int] = {}
    for position, candidate in enumerate(reads):
        if candidate.layer in layers:
            first.setdefault(candidate.layer, position)
    return first


@dataclasses.dataclass
class RecomputeChoice:
    """The layers :func:`choose_recomputes` recomputes, the step they make, and the bytes saved through it."""

    layers: list[str]
    step: SavedTensorStep
    saved: list[Candidate]

    @property
    def saved_bytes(self) -> int:
        """The bytes of the activations autograd keeps for the backward pass (the eligible ones)."""
        return sum(c.nbytes for c in self.saved)


def choose_recomputes(candidates: list[Candidate], reads: list[Candidate], layer_inputs: dict[str, list[Candidate]],
                      lb: int = 1, shared: dict | None = None) -> RecomputeChoice:
    """Each recomputable layer, in forward order, that keeps fewer bytes for the backward pass at no higher
    predicted peak (nothing offloaded) than the layers taken before it.

    Example:
        >>> cand = lambda name, layer, nbytes, i: Candidate(name, layer, "", (1,), nbytes, i)
        >>> x, centred, y = cand("x", "bn", 100, 0), cand("centred", "bn", 100, 1), cand("y", "relu", 100, 2)
        >>> choice = choose_recomputes([x, centred, y], [y, centred, x], {"bn": [x], "relu": [cand("in", "relu", 100, 0)]})
        >>> choice.layers, choice.saved_bytes, choice.step.transient_peak([])  # relu's input is as big as its output
        (['bn'], 200, 200)
    """
    base_step, chosen = SavedTensorStep(candidates, reads, lb), []
    best = RecomputeChoice([], base_step, list(candidates))
    best_peak = base_step.transient_peak([])
    order = list(dict.fromkeys(c.layer for c in candidates if c.layer in layer_inputs))
    for layer in order:
        step, saved = recompute_step(candidates, reads, layer_inputs, chosen + [layer], lb, shared)
        trial = RecomputeChoice(chosen + [layer], step, saved)
        peak = step.transient_peak([])
        if trial.saved_bytes < best.saved_bytes and peak <= best_peak:
            chosen, best, best_peak = chosen + [layer], trial, peak
    return best
