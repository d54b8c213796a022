"""recompute="only" (gradient checkpointing through fit) on keras.applications models, on this machine's CPU.

For each model, a plain fit and a fit with ``LMS(recompute="only", n_tensors=-1)``, each in a fresh process
(TensorFlow's allocator counts whole chunks, so a peak depends on what earlier models left in it), on the two
logical CPUs the tests use: /CPU:0 plays the accelerator. A recomputed tensor never leaves /CPU:0, so its
allocator peak shows the saving as measured (a swapped one would still be counted: both logical CPUs share
the host's memory). Reports per model: the step's measured allocator peak over what was held before it
(median of the steps after the first), LMS's predicted peaks with and without (weights and optimizer state
included), the tensors recomputed, whether the losses are identical, and the step time (median).

    python benchmarks/lms_recompute.py [--size 64] [--batch 8] [--steps 5] [MODEL ...]
"""

from __future__ import annotations


from applications import cli, compiled_application, fit_step_peaks, fresh_runs, header


def measure(name: str, variant: str, size: int, batch: int, steps: int) -> dict:
    """One fit in this process: ``variant`` is "plain" or "recompute"."""
    model, x, y = compiled_application(name, size, batch, steps)
    from lms_magic import LMS

    lms = LMS(device="/CPU:0", host_device="/CPU:1", recompute="only", n_tensors=-1, verbose=0) \
        if variant == "recompute" else None
    out = fit_step_peaks(model, x, y, batch, lms)
    if variant == "recompute":
        stats = lms.stats
        out.update(predicted=stats.device_peak_bytes, predicted_without=stats.device_peak_bytes_without_lms,
                   persistent=stats.persistent_bytes, recomputed=stats.recomputed_tensors,
                   recomputed_bytes=stats.recomputed_bytes_per_step, candidates=stats.candidates)
    return out


def main(names, size: int, batch: int, steps: int) -> None:
    mib = 2**20
    print(header(size, batch, steps))
    for name in names:
        runs = fresh_runs(__file__, name, ("plain", "recompute"), size, batch, steps)
        plain, lms = runs["plain"], runs["recompute"]
        print(f"{name}: measured step peak {plain['step_peak_bytes'] / mib:.1f} -> {lms['step_peak_bytes'] / mib:.1f} MiB "
              f"({lms['step_peak_bytes'] / plain['step_peak_bytes'] - 1:+.0%}); predicted peak "
              f"{lms['predicted_without'] / mib:.1f} -> {lms['predicted'] / mib:.1f} MiB "
              f"({lms['predicted'] / lms['predicted_without'] - 1:+.0%}; weights and optimizer state "
              f"{lms['persistent'] / mib:.1f}); {lms['recomputed']} of {lms['candidates']} recomputable tensors "
              f"recomputed ({lms['recomputed_bytes'] / mib:.1f} MiB a step); losses "
              f"{'identical' if lms['losses'] == plain['losses'] else 'DIFFERENT'}; step time "
              f"{plain['step_s'] * 1000:.0f} -> {lms['step_s'] * 1000:.0f} ms ({lms['step_s'] / plain['step_s'] - 1:+.0%})")


if __name__ == "__main__":
    cli(__doc__, measure, main, steps=5)
