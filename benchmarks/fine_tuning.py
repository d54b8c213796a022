"""KerasHub causal LMs fine-tuned with LoRA (issue 60's size) on TensorFlow's simulated 256 MiB device: the
answers against the allocator, and what LMS() costs a whole fit.

Gemma-, Llama- and Mistral-style from a config (4 layers, hidden 256, 4 query / 1 key-value heads, vocabulary
4096, 256 tokens, LoRA rank 4), AdamW, a weighted sparse-categorical accuracy, ``(x, y, sample_weight)``. In a
fresh process per batch, three times: a plain fit of 6 steps, each step's peak read from the allocator (BFC) after
the first (the median of the three); in others, ``LMS()`` on the same model from the same seed for 6 steps, once at
batch 4 and three times at batch 8, where something moves (its figure for a plain step: its first step read from
the allocator where nothing moved, else predicted; what it moved; the median whole fit's time over the median
plain fit's). The fits take the same batches as a ``tf.data`` set with autotuning off, both ways: where tf.data
autotunes (arrays given to ``fit`` are put in one), freeing the data as ``fit`` returns can wait for the autotuning
thread's next round (rounds come at doubling intervals), 0-1.7 s of a 4 s fit with or without LMS, decided by
when the fit ends (docs/measurements.md).
In another process: ``explain_fit`` asked at batch 8 (it measures a plain step at the largest batch predicted to
fit and at half of it, and corrects its figures) and its figure at batch 6, held to batch 6's plain peak (the
median of three fresh processes).

    python benchmarks/fine_tuning.py [--families gemma llama mistral] [--dtypes float32 mixed_bfloat16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from common import CODE, Figure, child_env, report

SIZE = dict(layers=4, hidden=256, vocabulary=4096)
SEQUENCE = 256
PLAIN_RUNS = 3  # plain fits per batch, each in a fresh process
LMS_RUNS = {4: 1, 8: 3}  # fits with LMS per batch, each in a fresh process: three where something moves (the time goal)
OTHER = 6  # the batch explain_fit's figure is held to (it measures 8, or the largest predicted to fit, and half)

TRIAL = """
import json, sys, time
args = json.loads(sys.argv[1])
import lms_magic
lms_magic.simulate_accelerator(memory="256MiB")
import keras
import tensorflow as tf
from lms_magic import LMS
from lms_magic.memory.frameworks import resettable_counter
from tests.hub import causal_lm, lm_data
size = args["size"]
data = lm_data(n=args["batch"] * 6, sequence=args["sequence"], vocabulary=size["vocabulary"])
found = {}
if args["kind"] in ("lms", "plain"):
    class Peaks(keras.callbacks.Callback):
        def __init__(self):
            super().__init__(); self.read = []
        def on_train_batch_begin(self, batch, logs=None):
            global counter
            counter = resettable_counter("/CPU:0")  # found once TensorFlow's runtime has started
            counter.reset()
        def on_train_batch_end(self, batch, logs=None):
            if batch >= 1: self.read.append(counter.read()[1])

    for way in (args["kind"],):  # each way in a fresh process: the allocator's chunks depend on what ran before
        model = causal_lm(args["family"], dtype=args["dtype"], **size)
        batches = tf.data.Dataset.from_tensor_slices(data).batch(args["batch"])
        options = tf.data.Options()
        options.autotune.enabled = False  # no autotuning thread for the fit's end to wait on (the docstring)
        peaks, extra = Peaks(), [LMS(verbose=0)] if way == "lms" else []
        start = time.perf_counter()
        history = model.fit(batches.with_options(options), epochs=1, verbose=0, callbacks=[peaks] + extra)
        found[way] = {"fit_s": time.perf_counter() - start, "peak": max(peaks.read), "loss": history.history["loss"]}
        if extra:
            s = extra[0].stats
            found[way].update(without=s.device_peak_bytes_without_lms, predicted=s.device_peak_bytes,
                              without_measured=s.without_lms_measured, step_measured=s.measured_step_peak_bytes,
                              moved=s.swapped_tensors + s.recomputed_tensors, active=s.active, notes=s.notes)
else:
    model = causal_lm(args["family"], dtype=args["dtype"], **size)
    explained = lms_magic.explain_fit(model, data, batch_size=args["batch"], batch_sizes=(args["other"],),
                                      modes=("without LMS",))
    found = {"peak": explained.modes[0].peak_bytes, "correction": str(explained.correction),
             "other": [p.peak_bytes for p in explained.frontier if p.batch_size == args["other"]][0]}
print("RESULT " + json.dumps(found))
"""


def trial(**args) -> dict | None:
    done = subprocess.run([sys.executable, "-c", TRIAL, json.dumps({"size": SIZE, "sequence": SEQUENCE, **args})],
                          capture_output=True, text=True, cwd=CODE, env=child_env(KERAS_BACKEND="tensorflow"))
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        print(f"failed: {args}\n{done.stderr[-2000:]}")
        return None
    return json.loads(lines[-1][7:])


def seconds(runs: list[dict]) -> str:
    return ", ".join(f"{run['fit_s']:.1f}" for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["gemma", "llama", "mistral"])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "mixed_bfloat16"])
    options = parser.parse_args()
    figures, lms_ratios, measured_ratios, time_ratios, explain_ratios = [], [], [], [], []
    unmoved_time_ratios = []
    for family in options.families:
        for dtype in options.dtypes:
            # three plain fits (a plain step's peak and a fit's time move between processes), and with LMS
            fits = {batch: [trial(kind=way, family=family, dtype=dtype, batch=batch)
                            for way in ("plain",) * PLAIN_RUNS + ("lms",) * runs] for batch, runs in LMS_RUNS.items()}
            explained = trial(kind="explain", family=family, dtype=dtype, batch=8, other=OTHER)
            # the plain peak at a batch explain_fit did not measure, in three fresh processes (TensorFlow's CPU peak
            # moves between processes)
            at_other = [run["plain"]["peak"] for run in [trial(kind="plain", family=family, dtype=dtype, batch=OTHER)
                                                         for _ in range(3)] if run]
            for batch, runs in fits.items():
                if None in runs:
                    continue
                plains = [run["plain"] for run in runs[:PLAIN_RUNS]]
                lmses = [run["lms"] for run in runs[PLAIN_RUNS:]]
                lms = {**lmses[0], "fit_s": statistics.median(run["fit_s"] for run in lmses)}
                plain = {"peak": statistics.median(p["peak"] for p in plains),
                         "fit_s": statistics.median(p["fit_s"] for p in plains), "loss": plains[0]["loss"]}
                peaks = ", ".join(f"{p['peak'] / 2**20:.1f}" for p in plains)
                ratio = lms["without"] / plain["peak"] if lms.get("without") else None
                (measured_ratios if lms.get("without_measured") else lms_ratios).extend([ratio] if ratio else [])
                (time_ratios if lms["moved"] else unmoved_time_ratios).append(lms["fit_s"] / plain["fit_s"])
                same = all(run["loss"] == plain["loss"] for run in lmses)
                how = (f"measured in its first step (its later steps {lms['peak'] / 2**20:.1f} MiB)"
                       if lms.get("without_measured") else "predicted")
                held = (f"; with LMS predicted {lms['predicted'] / 2**20:.1f} MiB, its step held "
                        f"{lms['step_measured'] / 2**20:.1f} MiB less the host's" if lms["moved"] and
                        lms.get("step_measured") else "")
                print(f"{family} {dtype} batch {batch}: plain step peak {plain['peak'] / 2**20:.1f} MiB (median of "
                      f"{peaks}); LMS's "
                      f"figure {lms.get('without', 0) / 2**20:.1f} MiB, {how} ({ratio or 0:.3f}x){held}, "
                      f"moved {lms['moved']}, "
                      f"losses {'identical' if same else 'differ'}; "
                      f"fit {lms['fit_s']:.1f} s (median of {seconds(lmses)}) "
                      f"against {plain['fit_s']:.1f} s (median of {seconds(plains)}) "
                      f"({lms['fit_s'] / plain['fit_s']:.2f}x)",
                      flush=True)
            if explained is not None and at_other:
                measured = statistics.median(at_other)
                ratio = explained["other"] / measured
                explain_ratios.append(ratio)
                print(f"{family} {dtype}: explain_fit at batch 8 says {explained['other'] / 2**20:.1f} MiB at batch "
                      f"{OTHER}, measured {measured / 2**20:.1f} MiB (median of "
                      f"{', '.join(f'{p / 2**20:.1f}' for p in at_other)}): "
                      f"{ratio:.3f}x; {explained['correction']}", flush=True)
    what = f"KerasHub causal LMs with LoRA ({', '.join(options.families)}; {', '.join(options.dtypes)})"
    for name, values, goal in (("LMS's figure of a plain step, predicted (something moved), over the allocator's "
                                "peak", lms_ratios, "0.90-1.10"),
                               ("LMS's figure of a plain step, its first step measured (nothing moved), over the "
                                "allocator's peak of the later steps", measured_ratios, "0.90-1.10"),
                               (f"explain_fit's figure at batch {OTHER} (asked at 8) over the "
                                "allocator's peak",
                                explain_ratios, "0.90-1.10"),
                               ("a 6-step fit with LMS() where something moved over a plain fit (medians of 3 fresh "
                                "processes each)", time_ratios, "at most 1.2"),
                               ("a 6-step fit with LMS() where nothing moved over a plain fit", unmoved_time_ratios,
                                "")):
        if values:
            figures.append(Figure(f"{what}: {name}", f"median of {len(values)}", round(statistics.median(values), 3),
                                  "x", round(min(values), 3), round(max(values), 3), "min-max", goal))
    report(figures)


if __name__ == "__main__":
    main()
