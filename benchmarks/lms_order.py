"""The backward pass one layer's gradient at a time (LMS's order_backward), measured on this machine's CPU.

For each model, fits in fresh processes on the tests' two logical CPUs (/CPU:0 plays the accelerator,
one inter-op thread as on a GPU stream): plain, and LMS with every candidate swapped with the order
(order_backward=True) and without. A swapped tensor's host copy is counted by the same allocator as
/CPU:0's tensors (both logical CPUs share it), so the measured peaks hold the host copies too; both LMS
fits swap the same tensors. Per fit: the step's measured allocator peak over what was held before it
(median of the steps after the first), LMS's predicted peak (the executed graphs' replay), the layers
ordered, whether the losses are the plain fit's, the step time (median).

    python benchmarks/lms_order.py [--size 64] [--batch 8] [--steps 4] [MODEL ...]
"""

from __future__ import annotations


from applications import cli, compiled_application, fit_step_peaks, fresh_runs, header

VARIANTS = {"plain": None, "swap ordered": dict(n_tensors=-1, order_backward=True), "swap unordered": dict(n_tensors=-1)}


def measure(name: str, variant: str, size: int, batch: int, steps: int) -> dict:
    """One fit of ``name`` in this process, as ``variant`` (a key of VARIANTS) says."""
    model, x, y = compiled_application(name, size, batch, steps)
    from lms_magic import LMS

    lms = LMS(device="/CPU:0", host_device="/CPU:1", verbose=0, **VARIANTS[variant]) \
        if VARIANTS[variant] is not None else None
    out = fit_step_peaks(model, x, y, batch, lms)
    if VARIANTS[variant] is not None:
        stats = lms.stats
        out.update(predicted=stats.device_peak_bytes, source=stats.prediction_source, ordered=stats.ordered_layers)
    return out


def main(names, size: int, batch: int, steps: int) -> None:
    mib = 2**20
    print(header(size, batch, steps))
    for name in names:
        runs = fresh_runs(__file__, name, VARIANTS, size, batch, steps)
        plain = runs["plain"]
        print(f"{name}: plain measured step peak {plain['step_peak_bytes'] / mib:.1f} MiB, step {plain['step_s'] * 1000:.0f} ms")
        for variant in list(VARIANTS)[1:]:
            run = runs[variant]
            print(f"  {variant}: measured step peak {run['step_peak_bytes'] / mib:.1f} MiB; predicted peak "
                  f"{run['predicted'] / mib:.1f} MiB ({run['source']}); {run['ordered']} layers ordered; losses "
                  f"{'identical to plain' if run['losses'] == plain['losses'] else 'DIFFERENT from plain'}; "
                  f"step {run['step_s'] * 1000:.0f} ms")


if __name__ == "__main__":
    cli(__doc__, measure, main, steps=4)
