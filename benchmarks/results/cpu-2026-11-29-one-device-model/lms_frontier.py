"""explain_fit's figures with LMS (its default plan, and recompute="only") at batches its steps did not measure,
against LMS's own reading of a real fit's checked step at those batches in the same process (what a user's next
fit holds), on the simulated device. One process per model and repetition:

    PYTHONPATH=. python benchmarks/results/cpu-2026-11-29-one-device-model/lms_frontier.py [REPEATS] [MODEL ...]
"""

import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
MODELS = {  # name: (device memory, the batch explain_fit is asked, the batches compared) as benchmarks/closed_loop.py
    "unet": ("96MiB", 32, (8, 12, 24)),
    "convnext": ("96MiB", 48, (8, 16, 32)),
    "mobilenet_v3": ("96MiB", 48, (8, 16, 32)),
    "transformer": ("48MiB", 48, (8, 16, 32)),
    "reference_cnn": ("64MiB", 48, (8, 16, 32)),
}
WAYS = {"LMS": {}, "LMS, recompute": {"recompute": "only"}}


def build(name, n):
    from tests import models

    if name == "unet":
        return models.encoder_decoder(64), models.pixel_labels(n, 64)
    if name == "convnext":
        return models.convnext_style(64), models.images(n, 64)
    if name == "mobilenet_v3":
        return models.mobilenet_v3_style(64), models.images(n, 64)
    if name == "transformer":
        return models.transformer(), models.token_ids(n)
    return models.reference_cnn((32, 32, 3)), models.images(n, 32)


def one_process(name):
    import lms_magic

    memory, asked, batches = MODELS[name]
    lms_magic.simulate_accelerator(memory=memory)
    from lms_magic import LMS

    model, data = build(name, 64)
    found = lms_magic.explain_fit(model, data, batch_size=asked, modes=("without LMS", *WAYS), batch_sizes=batches,
                                  min_bytes=0)
    rows = []
    for mode in found.modes[1:]:
        tried = {step.batch_size for step in (mode.confirmed.tried if mode.confirmed else ())}
        budget = mode.magic.partition("--budget ")[2] or None
        for point in (p for p in found.frontier if p.mode == mode.mode and p.batch_size not in tried):
            lms = LMS(verbose=0, min_bytes=0, **WAYS[mode.mode], **({"budget": budget} if budget else {}))
            x, y = data
            count = 3 * point.batch_size
            model.fit(x[:count] if len(x) >= count else x, y[:count] if len(y) >= count else y,
                      batch_size=point.batch_size, epochs=1, verbose=0, shuffle=False, callbacks=[lms])
            held = lms.stats.measured_step_peak_bytes
            rows.append({"mode": mode.mode, "batch": point.batch_size, "predicted": point.peak_bytes, "held": held,
                         "moved": lms.stats.swapped_tensors + lms.stats.recomputed_tensors,
                         "tried": sorted(tried), "source": lms.stats.measured_source})
    print(json.dumps({"name": name, "correction": found.correction.words if found.correction else None,
                      "rows": rows}))


def main():
    if sys.argv[1:2] == ["--one"]:
        return one_process(sys.argv[2])
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    names = sys.argv[2:] or list(MODELS)
    for name in names:
        ratios = {}
        for repeat in range(repeats):
            done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True,
                                  timeout=900)
            if done.returncode:
                print(name, "failed:", done.stderr[-1500:], flush=True)
                continue
            found = json.loads(done.stdout.strip().splitlines()[-1])
            print(name, repeat, found["correction"], flush=True)
            for row in found["rows"]:
                ratio = row["predicted"] / row["held"] if row["held"] else None
                print(f"  {row['mode']} batch {row['batch']}: predicted {row['predicted'] / 2**20:.1f} MiB, "
                      f"held {row['held'] / 2**20 if row['held'] else float('nan'):.1f} MiB "
                      f"({'%.3f' % ratio if ratio else 'not read'}; moved {row['moved']}; its steps at "
                      f"{row['tried']}; {row['source']})", flush=True)
                if ratio:
                    ratios.setdefault(row["mode"], []).append(ratio)
        for mode, values in ratios.items():
            print(f"{name} {mode}: predicted over held, median {statistics.median(values):.3f}, "
                  f"{min(values):.3f}-{max(values):.3f} ({len(values)} figures)", flush=True)


if __name__ == "__main__":
    main()
