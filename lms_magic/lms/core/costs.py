"""The step-time cost of moving activations (pure Python).

The copies overlap compute on a side stream: the copies to the host run during the forward pass, the copies
back during the backward pass. So a step with LMS takes at least the forward pass or its copies out,
whichever is longer, plus the backward pass or its copies back:

    step = max(forward, moved / to_host) + max(backward, moved / to_device)

with the forward pass a third of the plain step's compute and the backward pass two thirds (a backward
op computes two gradients for a forward op's one). The ratio to the plain step is 1.0 when nothing moves
and grows with the bytes moved, so among plans that fit, the one that moves the fewest bytes is the one
with the least predicted step time. The swaps start with the first tensors of the forward pass, whose
copies have the whole step to hide in; the last layers' activations, whose copies back could not hide,
are the last to move.
"""

from __future__ import annotations

from dataclasses import dataclass

BACKWARD_SHARE = 2 / 3  # of a plain step's compute


@dataclass(frozen=True)
class StepCost:
    """What predicts a step's time: its compute (and where that figure comes from) and the host link.

    Example:
        >>> cost = StepCost(compute_s=0.3, source="measured", to_host_bytes_per_s=10e9, to_device_bytes_per_s=10e9)
        >>> cost.ratio(0), round(cost.ratio(1.5e9), 3), round(cost.ratio(4e9), 3)
        (1.0, 1.167, 2.667)
    """

    compute_s: float
    source: str  # "measured: ..." or "estimated: ..."
    to_host_bytes_per_s: float
    to_device_bytes_per_s: float

    @classmethod
    def estimated(cls, compute_s: float, what: str, link) -> "StepCost":
        """A cost whose compute is an estimate (``what`` says of what), over the host ``link`` (anything with
        ``device_to_host``, ``host_to_device`` and ``source``: ``memory.bandwidth.LinkBandwidth``).

        Example:
            >>> from types import SimpleNamespace
            >>> link = SimpleNamespace(device_to_host=1e9, host_to_device=2e9, source="a stated default")
            >>> StepCost.estimated(0.5, "2 GFLOP at 4 GFLOP/s", link).source
            'estimated: 2 GFLOP at 4 GFLOP/s; link: a stated default'
        """
        return cls(compute_s, f"estimated: {what}; link: {link.source}", link.device_to_host, link.host_to_device)

    def step_s(self, moved_bytes: int) -> float:
        """The predicted step time with ``moved_bytes`` copied out in the forward pass and back in the backward."""
        forward = self.compute_s * (1 - BACKWARD_SHARE)
        backward = self.compute_s - forward
        return max(forward, moved_bytes / self.to_host_bytes_per_s) + max(backward, moved_bytes / self.to_device_bytes_per_s)

    def ratio(self, moved_bytes: int) -> float:
        """The predicted step time with ``moved_bytes`` moved over the plain step's (1.0 when nothing moves)."""
        if moved_bytes <= 0 or self.compute_s <= 0:
            return 1.0
        # never below 1.0: where the copies hide, forward + backward is the compute, but not always to the last bit
        return max(1.0, self.step_s(moved_bytes) / self.compute_s)


def extra_copies_s(cost: StepCost, moved_bytes: int, planned_bytes: int, steps: int) -> float:
    """The time ``moved_bytes`` moved each step adds over ``planned_bytes``, over ``steps`` steps (0 where the
    copies of both hide under the compute): what keeping a probe's swaps costs against tracing the plan again.

    Example:
        >>> cost = StepCost(compute_s=0.3, source="measured", to_host_bytes_per_s=10e9, to_device_bytes_per_s=10e9)
        >>> extra_copies_s(cost, int(0.5e9), int(0.1e9), steps=100), round(extra_copies_s(cost, int(4e9), 0, 10), 2)
        (0.0, 5.0)
    """
    return cost.compute_s * (cost.ratio(moved_bytes) - cost.ratio(planned_bytes)) * steps


def probe_stands(cost: StepCost, probe_bytes: int, planned_bytes: int, steps_left: int | None,
                 retrace_s: float | None) -> bool:
    """Whether a first step that moved ``probe_bytes`` (every eligible tensor) runs on rather than a retrace for a
    plan that moves ``planned_bytes``: where its extra copies over the ``steps_left`` take less than the retrace's
    ``retrace_s``; where the fit's length or the retrace's time is unknown, only where they cost nothing more.

    Example:
        >>> cost = StepCost(compute_s=0.3, source="measured", to_host_bytes_per_s=10e9, to_device_bytes_per_s=10e9)
        >>> probe_stands(cost, int(4e9), 0, 10, 6.0), probe_stands(cost, int(4e9), 0, 100, 6.0)
        (True, False)
        >>> probe_stands(cost, int(0.5e9), int(0.1e9), None, None), probe_stands(cost, int(4e9), 0, None, None)
        (True, False)
    """
    if steps_left is None or retrace_s is None:
        return cost.ratio(probe_bytes) <= cost.ratio(planned_bytes)
    return extra_copies_s(cost, probe_bytes, planned_bytes, steps_left) < retrace_s

