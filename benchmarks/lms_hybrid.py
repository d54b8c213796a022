"""The hybrid plan (``LMS(recompute=True)``) against swaps alone, on keras.applications models, this machine's CPU.

For each model, three fits from the same weights and batches, each in a fresh process, on the two logical CPUs
the tests use (/CPU:0 plays the accelerator, /CPU:1 the host): plain, LMS with its default plan (swaps
alone), and LMS with the same plan made hybrid (the plan's tensors recomputed on the device where their clones
read only tensors the backward pass holds or swaps back in, the rest swapped). Reports per model: the peaks
LMS predicts from the executed graphs (weights and optimizer state included) with and without, the tensors
and bytes that cross the host link each step (each swapped tensor crosses it twice), the tensors
recomputed, and whether the losses and final weights equal the plain fit's to the bit. Host-link traffic,
not time, is the figure here: on a CPU both roles share one memory, so a swap costs no transfer.

    python benchmarks/lms_hybrid.py [--size 64] [--batch 8] [--steps 3] [MODEL ...]
"""

from __future__ import annotations

import hashlib

from applications import cli, compiled_application, fresh_runs, header


def measure(name: str, variant: str, size: int, batch: int, steps: int) -> dict:
    """One fit in this process: ``variant`` is "plain", "swap" or "hybrid"."""
    model, x, y = compiled_application(name, size, batch, steps)
    import numpy as np

    from lms_magic import LMS

    callbacks = [] if variant == "plain" else [LMS(device="/CPU:0", host_device="/CPU:1", verbose=0,
                                                   recompute=variant == "hybrid")]
    history = model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()
    out = {"losses": history.history["loss"], "weights_sha256": digest}
    if callbacks:
        stats = callbacks[0].stats
        out.update(predicted=stats.device_peak_bytes, predicted_without=stats.device_peak_bytes_without_lms,
                   source=stats.prediction_source, swapped=stats.swapped_tensors,
                   swapped_bytes=stats.swapped_bytes_per_step, recomputed=stats.recomputed_tensors,
                   recomputed_bytes=stats.recomputed_bytes_per_step, candidates=stats.candidates,
                   notes=[note for note in stats.notes if "hybrid" in note])
    return out


def main(names, size: int, batch: int, steps: int) -> None:
    mib = 2**20
    print(header(size, batch, steps))
    for name in names:
        runs = fresh_runs(__file__, name, ("plain", "swap", "hybrid"), size, batch, steps)
        plain = runs["plain"]
        print(f"\n{name}: predicted without LMS {runs['swap']['predicted_without'] / mib:.1f} MiB")
        for variant in ("swap", "hybrid"):
            run = runs[variant]
            same = run["losses"] == plain["losses"] and run["weights_sha256"] == plain["weights_sha256"]
            print(f"  {variant:6s} predicted {run['predicted'] / mib:6.1f} MiB ({run['source']}); host link "
                  f"{2 * run['swapped_bytes'] / mib:6.1f} MiB a step ({run['swapped']} swapped); "
                  f"{run['recomputed']} recomputed ({run['recomputed_bytes'] / mib:.1f} MiB); "
                  f"{'bit-identical' if same else 'DIFFERENT'} to the plain fit")
            for note in run.get("notes", []):
                print(f"         {note}")
        swap, hybrid = runs["swap"], runs["hybrid"]
        if swap["swapped_bytes"]:
            print(f"  hybrid / swap: host-link bytes {hybrid['swapped_bytes'] / swap['swapped_bytes']:.2f}, "
                  f"predicted peak {hybrid['predicted'] / swap['predicted']:.3f}")


if __name__ == "__main__":
    cli(__doc__, measure, main, steps=3)
