"""LMS on KerasHub's GPT-2 and BERT backbones (built from a config, no download), on each Keras backend.

4 layers, 4 heads, hidden 128, feed-forward 512, sequence 128, a Dense head over a 1000-token vocabulary,
AdamW, batch 8, two steps; ``LMS(n_tensors=-1)`` (every candidate moved) against a plain fit from the same seed.
Prints, per backend and model: the candidates, what moved, the predicted device peak with and without LMS and
their ratio, and whether the losses are identical. TensorFlow runs on ``simulate_accelerator()`` (its CPU as an
accelerator and a host), with oneDNN off and op determinism on.

    python benchmarks/keras_hub_lms.py [--backends jax torch tensorflow]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from common import CODE, Figure, child_env, report

SCRIPT = """
import json, os, sys
import lms_magic
if os.environ["KERAS_BACKEND"] == "tensorflow":
    lms_magic.simulate_accelerator()
    import tensorflow as tf
    tf.config.experimental.enable_op_determinism()
from lms_magic import LMS
from tests.hub import fit_both
found = {}
for kind in ("gpt2", "bert"):
    callback = LMS(n_tensors=-1, verbose=0)
    (plain_loss, _), (loss, _) = fit_both(kind, callback, layers=4, hidden=128, sequence=128)
    stats = callback.stats
    found[kind] = {"candidates": stats.candidates, "moved": stats.swapped_tensors + stats.recomputed_tensors,
                   "peak": stats.device_peak_bytes, "without": stats.device_peak_bytes_without_lms,
                   "same_loss": loss == plain_loss}
print(json.dumps(found))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["jax", "torch", "tensorflow"])
    options = parser.parse_args()
    print(f"{'backend':<11}{'model':<6}{'candidates':>11}{'moved':>7}{'without (MiB)':>15}{'with (MiB)':>12}{'ratio':>7}"
          "  same losses")
    figures = []
    for backend in options.backends:
        done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=CODE,
                              env=child_env(KERAS_BACKEND=backend, TF_ENABLE_ONEDNN_OPTS="0"))
        if done.returncode:
            print(f"{backend}: failed\n{done.stderr[-2000:]}")
            continue
        for kind, run in json.loads(done.stdout.strip().splitlines()[-1]).items():
            print(f"{backend:<11}{kind:<6}{run['candidates']:>11}{run['moved']:>7}{run['without'] / 2**20:>15.1f}"
                  f"{run['peak'] / 2**20:>12.1f}{run['peak'] / run['without']:>7.3f}  {run['same_loss']}")
            what = f"KerasHub {kind} (4 layers, hidden 128, 128 tokens, batch 8) on {backend}, every candidate moved"
            figures += [Figure(f"{what}: predicted peak over without LMS", "one fit", round(run["peak"] / run["without"], 3),
                               "x"),
                        Figure(f"{what}: losses identical to plain", "1 yes, 0 no", int(run["same_loss"]), "")]
    report(figures)


if __name__ == "__main__":
    main()
