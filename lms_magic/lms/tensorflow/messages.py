"""What the TensorFlow backend tells the user: the notes on a plan that moves nothing, and on the batch size.

Pure formatting of the fit's :class:`~lms_magic.lms.core.stats.LmsStats` and the plan (no TensorFlow import).
"""

from __future__ import annotations

from ...units import format_size
from ..core.plan import TRUSTED_FIT, Plan, Rule
from .graph import phase_of


def nothing_helps(op: str, peak_bytes: int | None, optimizer_scope: str | None) -> str:
    """The note when no plan predicts a lower peak than swapping nothing: where the peak is, and why.

    Example:
        >>> nothing_helps("adam/Sqrt_3", 2**20, "adam")
        'no swap lowers the predicted peak (1.0 MiB, after adam/Sqrt_3 in the optimizer pass: the optimizer update holds the gradients and its state while the activations are gone): nothing is swapped'
    """
    phase = phase_of(op, optimizer_scope)
    why = {"forward": "the forward pass has not yet produced the tensors a swap would free",
           "backward": "the tensors live there are read by the backward pass at that point or just after",
           "optimizer": "the optimizer update holds the gradients and its state while the activations are gone"}
    return (f"no swap lowers the predicted peak ({format_size(peak_bytes) if peak_bytes else '?'}, after {op} "
            f"in the {phase} pass: {why[phase]}): nothing is swapped")


def why_nothing(plan: Plan) -> str:
    """Why a plan made on the executed graphs moves nothing (the start of the step-out note)."""
    if plan.rule is Rule.FITS_DEVICE:
        return (f"the step fits the device ({format_size(plan.peak_bytes)} predicted, within "
                f"{format_size(plan.budget_bytes)})")
    if plan.rule is Rule.BUDGET:
        return "the step fits the budget without swaps"
    return "no swap lowers the peak the executed graphs predict"


def fits_with_room(plan: Plan, peak_bytes: int | None = None) -> str:
    """Why nothing moves where the traced step fits the device with room (``TRUSTED_FIT`` of the usable bytes);
    ``peak_bytes``: the traced step replayed with its kernels' scratch, as read in the first step.

    Example:
        >>> fits_with_room(Plan((), Rule.FITS_DEVICE, 2**20, 2**20, budget_bytes=8 * 2**20))
        'the step fits the device with room (1.0 MiB predicted on the traced graph, within 75% of the 8.0 MiB LMS plans to fill)'
    """
    held = f"{format_size(plan.peak_bytes)} predicted on the traced graph" if peak_bytes is None else \
        f"{format_size(peak_bytes)} predicted on the traced graph with its kernels' scratch as measured"
    return f"the step fits the device with room ({held}, within {TRUSTED_FIT:.0%} of the " \
           f"{format_size(plan.budget_bytes)} LMS plans to fill)"


def over_budget(where: str, peak_bytes: int, plan: Plan, scratch: bool) -> str:
    """The note where, after a step, ``where`` predicts the step the traced graph fit above the plan's budget
    (``scratch``: with each kernel's scratch as measured in it).

    Example:
        >>> over_budget("the traced graph", 9 * 2**20, Plan((), Rule.FITS_DEVICE, 2**20, 2**20, budget_bytes=8 * 2**20), True)
        "the traced graph predicts 9.0 MiB with each kernel's scratch as measured, above the 8.0 MiB the traced step fit: every eligible tensor swapped in the next step, to plan on its graphs"
    """
    held = " with each kernel's scratch as measured" if scratch else ""
    verb = "predict" if where.endswith("graphs") else "predicts"
    return (f"{where} {verb} {format_size(peak_bytes)}{held}, above the {format_size(plan.budget_bytes)} the traced "
            "step fit: every eligible tensor swapped in the next step, to plan on its graphs")


def stepped_out(why: str) -> str:
    """The note where LMS steps out after a step: nothing moves from the next one on."""
    return (f"{why}: nothing moves from the second step on, and the model trains with its own train function (with "
            "XLA where it was compiled so)")


def kept_own(why: str) -> str:
    """The note where LMS's first step moved nothing and that step, the model's own, runs on."""
    return (f"{why}: nothing moves from the second step on, and the step LMS traced runs on unchanged (the model's "
            "own: no second trace)")


def batch_notes(batch: int | None, source: str | None) -> list[str]:
    """What the user should know about the batch size a plan was sized for (``source``: where it came from).

    Example:
        >>> batch_notes(32, "the traced batch"), len(batch_notes(None, None))
        ([], 1)
    """
    if batch is None:
        return ["the batch size is unknown when TensorFlow traces this data and LMS found none in the fit call, so "
                "tensor sizes are unknown and nothing is swapped; pass batch_size_hint=..."]
    if source != "the traced batch":
        return [f"TensorFlow traces this data with an unknown batch size (a last batch smaller than the others, a "
                f"generator, tf.data without drop_remainder): LMS planned for batches of {batch} ({source})"]
    return []


def probe_kept(swapped: int, planned: int, extra_s: float, steps_left: int | None, retrace_s: float) -> str:
    """The note where the first step's swaps (every eligible tensor) stand rather than a retrace for the plan
    (``steps_left`` None: a fit of unknown length, whose copies cost nothing more).

    Example:
        >>> probe_kept(14, 6, 0.017, 1, 0.6)
        "the first step's 14 swaps stand (the plan would move 6): their extra copies add about 0.017 s over the 1 steps left by the step-time model, a second trace about 0.6 s"
        >>> probe_kept(14, 6, 0.0, None, 0.6).partition(": ")[2]
        'their copies cost no more than its by the step-time model, in a fit of unknown length'
    """
    if steps_left is None:
        return (f"the first step's {swapped} swaps stand (the plan would move {planned}): their copies cost no more "
                "than its by the step-time model, in a fit of unknown length")
    return (f"the first step's {swapped} swaps stand (the plan would move {planned}): their extra copies add about "
            f"{extra_s:.2g} s over the {steps_left} steps left by the step-time model, a second trace about "
            f"{retrace_s:.1f} s")


def planned_as_measured(allowed_bytes: int, budget_bytes: int, device_share: bool, source: str) -> str:
    """The note where LMS plans for the device's budget as the plain steps measured on it correct the replay.

    Example:
        >>> planned_as_measured(16 * 2**20, 12 * 2**20, True, "TensorFlow's allocator on CPU:0")
        "planned for 12.0 MiB in the replay's bytes: the 16.0 MiB usable of the device, as the plain steps explain_fit measured in TensorFlow's allocator on CPU:0 correct the replay"
    """
    what = "usable of the device" if device_share else "budget"
    return (f"planned for {format_size(budget_bytes)} in the replay's bytes: the {format_size(allowed_bytes)} {what}, "
            f"as the plain steps explain_fit measured in {source} correct the replay")
