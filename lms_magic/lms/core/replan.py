"""A plan checked against the device's own allocator after its first step: the budget to plan again for.

LMS plans in the replay's bytes (the graph's tensors). The allocator also holds what the graph does not show
(whole chunks for smaller requests, workspaces). Where the first step of a plan held more than the plan was allowed
to fill, the plan is made again for a budget smaller by the same ratio: the step's bytes the replay predicted over
those the allocator held.
"""

from __future__ import annotations


def budget_after_measuring(allowed_bytes: int | None, persistent_bytes: int, predicted_step_bytes: int,
                           measured_step_bytes: int) -> int | None:
    """The budget, in the replay's bytes, whose plan the device should hold within ``allowed_bytes``; None where the
    measured step held within it (the plan stands) or nothing was allowed.

    Args:
        allowed_bytes: what the plan was allowed to fill (its budget: the usable capacity or the user's).
        persistent_bytes: the weights and optimizer state, held between steps.
        predicted_step_bytes: the step's bytes past those, as the plan predicted them.
        measured_step_bytes: the allocator's peak of the step over what the device held before it.

    Example:
        >>> budget_after_measuring(1000, 200, 600, 700)  # 900 held of 1000 allowed: the plan stands
        >>> budget_after_measuring(1000, 200, 600, 1200)  # 1400 held: the step bytes are 2x the replay's
        600
    """
    if allowed_bytes is None or persistent_bytes + measured_step_bytes <= allowed_bytes:
        return None
    ratio = measured_step_bytes / max(1, predicted_step_bytes)
    return persistent_bytes + int((allowed_bytes - persistent_bytes) / ratio)


__all__ = ["budget_after_measuring"]
