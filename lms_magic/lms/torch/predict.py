"""The PyTorch step as the plan sees it: the saved activations of its first step, replayed (no framework import).

PyTorch has no graph to replay before a step runs, so the first step is a probe: every eligible saved
activation is offloaded, and the offloader's events say in which order the forward pass saved them and
the backward pass read them back. That sequence, as replay nodes (core/simulate.py), predicts the peak of
the saved activations for any set offloaded (swapped out after they are saved, back in ``lb`` reads ahead
of their first reader); on CUDA the prediction is calibrated with the allocator's measured peak of the
probe (what the replay leaves out: gradients, workspace, temporaries).
"""

from __future__ import annotations

from ..core.plan import Candidate
from ..core.simulate import Node, Swap, replay, with_swaps


class SavedTensorStep:
    """A step's saved activations in forward order and the backward pass's reads of them.

    Args:
        candidates: every eligible saved activation of the step, in forward order.
        reads: the candidates in the order the backward pass read them (a candidate may appear more than once);
            candidates never seen read are taken as read in reverse forward order after the others.
        lb: how many reads ahead of its first reader an offloaded activation starts back.

    Example:
        >>> cands = [Candidate(f"saved:{i}", f"l{i}", "Dense", (10,), 100, i) for i in range(4)]
        >>> step = SavedTensorStep(cands, list(reversed(cands)))
        >>> step.transient_peak([]), step.transient_peak(cands[:2])
        (400, 200)
    """

    def __init__(self, candidates: list[Candidate], reads: list[Candidate], lb: int = 1):
        self.candidates, self.lb = list(candidates), lb
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

    def _swap(self, candidate: Candidate) -> Swap | None:
        readers = self._readers.get(candidate.tensor)
        if not readers:
            return None
        start = readers[0] - self.lb  # the read that starts the copy back; before the first: the forward's end
        trigger = f"b{start}" if start >= 0 else f"f{len(self.candidates) - 1}"
        return Swap((f"f{self._forward[candidate.tensor]}", 0), tuple(f"b{p}" for p in readers), trigger,
                    candidate.nbytes)

    def transient_peak(self, offloaded: list[Candidate]) -> int:
        """The peak of the saved activations on the device with ``offloaded`` waiting in host memory."""
        swaps = [swap for swap in map(self._swap, offloaded) if swap is not None]
        return replay(with_swaps(self.nodes, swaps)).peak_bytes
