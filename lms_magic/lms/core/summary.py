"""The one line LMS prints once its plan is made, for every backend (pure: formatting of ``LmsStats``).

Each backend names what it moves in its own words (:class:`Words`); the line is made here, once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...units import MIB
from .plan import Rule
from .stats import LmsStats


@dataclass(frozen=True)
class Words:
    """How one backend names what it moves, for :func:`summary_line`.

    Attributes:
        label: the line's start: "LMS", "LMS (PyTorch)", "LMS (JAX)".
        unit: what a candidate is: "tensors", "saved activations", "saved values".
        verb: how it moves to the host: "swapping", "offloading".
        destination: where it waits: "/CPU:1", "pinned host memory".
        device: the device whose peak is predicted: "/GPU:0", "cuda:0", "device".
        lb: the swap-in distance as the backend counts it ("lb=1", "lb=1 layers"); None where the backend does
            not honour it.
        lean: what ``lean_ops`` changes: "BatchNormalization gradient", "BatchNormalization".
        recomputed_layers: the layers recomputed, where the backend recomputes whole layers (PyTorch); None else.
    """

    label: str
    unit: str
    verb: str
    destination: str
    device: str
    lb: str | None = None
    lean: str = "BatchNormalization gradient"
    recomputed_layers: int | None = None


def checked_step_held(stats) -> tuple[int, str] | None:
    """What the step of the plan that stands held as LMS checked it, and how that was read: where the device's
    allocator (or the simulated device's, less what the host held) read that plan's step and its peak is not
    already the figure given as measured; else None. ``stats``: LmsStats or its dict.

    Example:
        >>> checked_step_held({"measured_step_peak_bytes": 9, "predicted_step_peak_bytes": 7, "device_peak_bytes": 7})
        (9, 'its allocator')
        >>> checked_step_held({"measured_step_peak_bytes": 9, "predicted_step_peak_bytes": 8, "device_peak_bytes": 7})
    """
    read = stats if isinstance(stats, dict) else vars(stats)
    held = read.get("measured_step_peak_bytes")
    if held is None or read.get("peak_source") == "measured" or \
            read.get("predicted_step_peak_bytes") != read.get("device_peak_bytes"):  # another plan's step
        return None
    return held, read.get("measured_source") or "its allocator"


def summary_line(stats: LmsStats, words: Words) -> str:
    """What moves, the predicted peaks, the predicted step time, and what else LMS changed: one line.

    Example:
        >>> stats = LmsStats(active=True, candidates=9, swapped_tensors=3, swapped_bytes_per_step=3 * 2**20,
        ...                  plan_rule="lowest predicted peak", device_peak_bytes=10 * 2**20,
        ...                  device_peak_bytes_without_lms=14 * 2**20, prediction_source="the replay")
        >>> summary_line(stats, Words("LMS", "tensors", "swapping", "/CPU:1", "/CPU:0", lb="lb=1"))
        'LMS: swapping 3 of 9 tensors (3.0 MiB per step, lb=1; plan: lowest predicted peak) to /CPU:1; predicted /CPU:0 peak 10.0 MiB with LMS, 14.0 MiB without (the replay)'
        >>> stats.devices = ["/GPU:0", "/GPU:1"]  # under a MirroredStrategy
        >>> summary_line(stats, Words("LMS", "tensors", "swapping", "/CPU:0", "/GPU:0")).split("; ")[1:3]
        ['plan: lowest predicted peak) to /CPU:0 on each of 2 devices (/GPU:0, /GPU:1)', 'predicted per-device peak 10.0 MiB with LMS, 14.0 MiB without (the replay)']
    """
    recomputed, swapped = stats.recomputed_tensors, stats.swapped_tensors
    rule = f"first {recomputed + swapped}" if stats.plan_rule is Rule.FIRST_N else stats.plan_rule
    plan = f"plan: {rule}" if rule else ""
    layers = f" in {words.recomputed_layers} layers" if words.recomputed_layers is not None else ""
    recomputed_mib = f"{stats.recomputed_bytes_per_step / MIB:.1f} MiB per step"
    swapped_mib = f"{stats.swapped_bytes_per_step / MIB:.1f} MiB per step" + (f", {words.lb}" if words.lb else "")
    if recomputed and not swapped:
        what = (f"recomputing {recomputed} {words.unit}{layers} ({recomputed_mib}{'; ' + plan if plan else ''}), "
                "nothing offloaded to host memory")
    elif recomputed:
        what = (f"recomputing {recomputed}{layers} ({recomputed_mib}) and {words.verb} {swapped} ({swapped_mib}) "
                f"of {stats.candidates} {words.unit}{' (' + plan + ')' if plan else ''} to {words.destination}")
    else:
        what = (f"{words.verb} {swapped} of {stats.candidates} {words.unit} ({swapped_mib}"
                f"{'; ' + plan if plan else ''}) to {words.destination}")
    several = stats.devices if len(stats.devices) > 1 else None
    if several:  # a distribution strategy's replicas: the same plan on each, the figures each one's
        what += f" on each of {len(several)} devices ({', '.join(several)})"
    peak, without = stats.device_peak_bytes, stats.device_peak_bytes_without_lms
    device = "per-device" if several else words.device
    read = stats.without_lms_source or "its allocator, in a step that moved nothing"
    if peak is not None and stats.without_lms_measured and stats.peak_source == "measured":  # nothing moved
        peaks = f"measured {device} peak {peak / MIB:.1f} MiB ({read})"
    elif peak is not None:
        peaks = (f"predicted {device} peak {peak / MIB:.1f} MiB with LMS"
                 + (f" ({stats.prediction_source}), {without / MIB:.1f} MiB without as measured ({read})"
                    if stats.without_lms_measured else
                    f" ({stats.prediction_source}), {without / MIB:.1f} MiB without ({read})"
                    if stats.without_lms_source and without is not None else
                    f", {without / MIB:.1f} MiB without ({stats.prediction_source})" if without is not None else
                    f", not predicted without ({stats.prediction_source})"))
    else:
        peaks = "no device peak predicted"
    held = checked_step_held(stats)
    if held is not None:
        peaks += f"; its checked step held {held[0] / MIB:.1f} MiB ({held[1]})"
    ratio = stats.predicted_step_ratio if swapped or not recomputed else None
    return (f"{words.label}: {what}; {peaks}"
            + (f"; predicted step time {ratio - 1:+.0%}" if ratio else "")
            + (" (transfers only: the recomputes' own time is not counted)" if ratio and recomputed else "")
            + (f"; lean {words.lean} in {stats.lean_layers} layers" if stats.lean_layers else "")
            + (f"; backward pass one layer at a time ({stats.ordered_layers} layers)" if stats.ordered_layers else ""))
