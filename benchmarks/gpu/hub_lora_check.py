"""On a GPU: a KerasHub Gemma-style causal LM fine-tuned with LoRA (issue 60's setup), and the demo CNN's
convolutions (issue 61: what cuDNN's kernels hold beyond the graph's tensors), predicted against the allocator.

Each trial is a fresh process. ``--model gemma`` builds KerasHub's ``GemmaCausalLM`` from a config (4 layers,
hidden 256, 4 query / 1 key-value heads, vocabulary 4096, LoRA rank 4, AdamW, a weighted sparse-categorical
accuracy), no preprocessor, and fits ``(x, y, sample_weight)`` with ``LMS(n_tensors=-1)`` (every candidate
moved) and plainly from the same
seed, each fit in its own process. Printed per trial: the losses each way, what LMS moved, LMS's predicted peak
with and without it, and the allocator's measured peak of each fit (PyTorch: ``max_memory_allocated`` over the
steps after the first; JAX: ``peak_bytes_in_use`` of the process, which cannot be reset). ``--model cnn`` asks
``explain_fit`` for the plain step's peak at each batch and measures a plain fit there (first).

    KERAS_BACKEND=torch python benchmarks/gpu/hub_lora_check.py --backend torch --model gemma --batch 8 16

--device cpu runs the code paths on a CPU (nothing is measured there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TRIAL = r"""
import faulthandler, json, sys, time
args = json.loads(sys.argv[1])
faulthandler.dump_traceback_later(args.pop("dump_after_s"), exit=True)  # where a slow trial was, before its kill
import keras, numpy as np
from lms_magic import LMS
on_cuda = args["device"] == "cuda"

def reset():
    if on_cuda and args["backend"] == "torch":
        import torch
        torch.cuda.reset_peak_memory_stats()

def peak():
    if not on_cuda:
        return None
    if args["backend"] == "torch":
        import torch
        return torch.cuda.max_memory_allocated()
    import jax
    return (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")

class Peaks(keras.callbacks.Callback):
    def __init__(self):
        super().__init__(); self.read = []
    def on_train_batch_begin(self, batch, logs=None):
        if batch >= 1: reset()
    def on_train_batch_end(self, batch, logs=None):
        if batch >= 1: self.read.append(peak())

def gemma(dtype):
    from tests.hub import causal_lm  # the tests' KerasHub causal LM, at issue 60's size
    return causal_lm("gemma", seed=1, layers=4, hidden=256, vocabulary=4096, dtype=dtype)

def cnn():
    keras.utils.set_random_seed(1)
    layers = [keras.Input((128, 128, 3))] + [keras.layers.Conv2D(16, 3, padding="same", activation="relu")
                                             for _ in range(8)]
    model = keras.Sequential(layers + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model

found = {"args": args}
batch, steps = args["batch"], 4
rng = np.random.default_rng(0)
if args["model"] == "gemma":
    ids = rng.integers(0, 4096, (batch * steps, 256)).astype("int32")
    mask = np.ones_like(ids); mask[:, 200:] = 0
    data = ({"token_ids": ids, "padding_mask": mask}, np.roll(ids, -1, axis=1), mask.astype("float32"))
    runs = {}
    for way in args["ways"]:
        model = gemma(args["dtype"])
        peaks, lms = Peaks(), LMS(n_tensors=-1, verbose=0)
        start = time.perf_counter()
        try:
            history = model.fit(data[0], data[1], sample_weight=data[2], batch_size=batch, epochs=1, shuffle=False, verbose=0,
                                callbacks=[peaks] + ([lms] if way == "lms" else []))
            runs[way] = {"loss": history.history["loss"], "metrics": {k: v[-1] for k, v in history.history.items()},
                         "peak": max([p for p in peaks.read if p] or [0]) or None, "fit_s": time.perf_counter() - start}
        except Exception as error:
            runs[way] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        if way == "lms":
            s = lms.stats
            runs[way].update(active=s.active, reason=s.reason, candidates=s.candidates, moved=s.swapped_tensors,
                             moved_bytes=s.swapped_bytes_per_step, predicted=s.device_peak_bytes,
                             predicted_without=s.device_peak_bytes_without_lms, source=s.peak_source,
                             notes=s.notes[:4])
    found["runs"] = runs
else:
    from lms_magic import explain_fit
    x = rng.random((batch * steps, 128, 128, 3), dtype="float32"); y = rng.integers(0, 10, batch * steps)
    model = cnn()
    peaks = Peaks()  # first: JAX's peak is the process's, and explain_fit may measure steps at other batches
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[peaks])
    found["measured"] = max([p for p in peaks.read if p] or [0]) or None
    started = time.perf_counter()
    try:
        explained = explain_fit(model, (x, y), batch_size=batch, capacity="4GiB", modes=("without LMS",),
                                confirm=False)
        found["predicted"] = explained.modes[0].peak_bytes
        found["explain_s"] = round(time.perf_counter() - started, 1)
    except Exception as error:
        found["predicted_error"] = f"{type(error).__name__}: {str(error)[:300]}"
print("RESULT " + json.dumps(found, default=str))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch", choices=("torch", "jax"))
    parser.add_argument("--model", default="gemma", choices=("gemma", "cnn"))
    parser.add_argument("--dtype", nargs="+", default=["float32", "mixed_bfloat16"])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--trial-timeout-s", type=float, default=120)
    parser.add_argument("--search-cached", action="store_true",
                        help="JAX: each trial again with XLA's algorithm search read from the first's results (the "
                             "peak then holds none of the search's own buffers)")
    options = parser.parse_args()
    env = {**os.environ, "KERAS_BACKEND": options.backend,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if options.backend == "jax":
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    dtypes = options.dtype if options.model == "gemma" else ["float32"]
    for dtype in dtypes:
        for batch in options.batch:
            for ways in ([["lms"], ["plain"]] if options.model == "gemma" else [[]]):
                runs = [None] + ([f"/tmp/searched-{options.model}-{dtype}-{batch}-{'-'.join(ways)}.txt"]
                                 if options.search_cached else [])
                for cached in runs:
                    args = dict(backend=options.backend, model=options.model, dtype=dtype, batch=batch,
                                device=options.device, ways=ways, dump_after_s=max(1, options.trial_timeout_s - 10))
                    here = dict(env)
                    if options.search_cached:
                        flag = "load" if cached else "dump"
                        args["search"] = "cached" if cached else "run"
                        here["XLA_FLAGS"] = (f"{env.get('XLA_FLAGS', '')} --xla_gpu_{flag}_autotune_results_"
                                             f"{'from' if cached else 'to'}={runs[-1]}").strip()
                    print(_trial(args, here, options.trial_timeout_s), flush=True)


def _trial(args: dict, env: dict, timeout_s: float) -> str:
    try:
        done = subprocess.run([sys.executable, "-c", TRIAL, json.dumps(args)], capture_output=True, text=True,
                              env=env, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired as expired:
        return f"trial {json.dumps(args)} timed out: {(expired.stderr or b'')[-1500:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return lines[-1][7:] if lines else f"trial {json.dumps(args)} failed: {done.stderr[-1500:]}"

if __name__ == "__main__":
    main()
