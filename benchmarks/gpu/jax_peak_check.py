"""On a GPU, JAX: where a plain fit's allocator peak is reached, against XLA's figures (issue 60's 0.73 and 1.14).

Each trial is a fresh process: KerasHub's Gemma-style causal LM with LoRA (as ``hub_lora_check.py``), a plain fit
of ``(x, y, sample_weight)``, 4 steps, with JAX's ``bytes_in_use`` and ``peak_bytes_in_use`` read after the model is
built, when the fit begins and after each step (the process's peak cannot be reset, so each reading is the peak
so far). Then XLA's figures: LMS's (the loss and gradient compiled, ``memory_analysis()``, plus the optimizer
state) and Keras's whole ``train_step`` compiled as ``fit`` runs it (state donated), each with its parts.
Each (dtype, batch) runs as: ``grow`` (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, XLA's algorithm search's results
written to a file), ``grow-cached`` (the same, the search's results read from that file: the peak without the
search's own buffers), ``whole`` (JAX's default pool, taken whole: ``XLA_PYTHON_CLIENT_MEM_FRACTION=0.05``); with
``--autotune 0`` also ``grow`` with ``--xla_gpu_autotune_level=0`` (no search).

    python benchmarks/gpu/jax_peak_check.py --dtype float32 mixed_bfloat16 --batch 8 16 --parallel 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TRIAL = r"""
import json, sys
args = json.loads(sys.argv[1])
import jax, keras, numpy as np

def stats():
    s = jax.devices()[0].memory_stats() or {}
    return {k: s.get(k) for k in ("bytes_in_use", "peak_bytes_in_use", "largest_alloc_size")}

found = {"args": args, "readings": {}}
from tests.hub import causal_lm  # the tests' KerasHub causal LM, at issue 60's size
model = causal_lm("gemma", seed=1, layers=4, hidden=256, vocabulary=4096, dtype=args["dtype"])
found["readings"]["built"] = stats()
batch, steps = args["batch"], 4
rng = np.random.default_rng(0)
ids = rng.integers(0, 4096, (batch * steps, 256)).astype("int32")
mask = np.ones_like(ids); mask[:, 200:] = 0
x, y, sw = {"token_ids": ids, "padding_mask": mask}, np.roll(ids, -1, axis=1), mask.astype("float32")

class Readings(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        found["readings"]["fit_begins"] = stats()
    def on_train_batch_end(self, batch, logs=None):
        found["readings"][f"step_{batch}"] = stats()

model.fit(x, y, sample_weight=sw, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[Readings()])

def parts(analysis):
    return {k: getattr(analysis, k, None) for k in ("argument_size_in_bytes", "output_size_in_bytes",
            "temp_size_in_bytes", "alias_size_in_bytes", "generated_code_size_in_bytes",
            "host_temp_size_in_bytes", "host_argument_size_in_bytes", "host_output_size_in_bytes")}

one = (jax.tree_util.tree_map(lambda a: a[:batch], x), y[:batch], sw[:batch])
try:
    from lms_magic.lms.jax.predictor import JaxStepPredictor
    from lms_magic.lms.jax.residuals import shape_specs
    predictor = JaxStepPredictor(model, one)
    found["lms_figure"] = predictor.plain_peak_bytes(batch)
    inner, specs = predictor.step_function(batch)
    function = jax.value_and_grad(inner, has_aux=True)
    found["lms_parts"] = parts(jax.jit(function).lower(*shape_specs(specs)).compile().memory_analysis())
    found["optimizer_state"] = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                                   for v in model.optimizer.variables)
except Exception as error:
    found["lms_error"] = f"{type(error).__name__}: {str(error)[:300]}"
try:
    state = model._get_jax_state(trainable_variables=True, non_trainable_variables=True,
                                 optimizer_variables=True, metrics_variables=True)
    spec = lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype)
    lowered = jax.jit(model.train_step, donate_argnums=0).lower(
        jax.tree_util.tree_map(spec, state), jax.tree_util.tree_map(spec, one))
    found["train_step_parts"] = parts(lowered.compile().memory_analysis())
except Exception as error:
    found["train_step_error"] = f"{type(error).__name__}: {str(error)[:300]}"
found["readings"]["end"] = stats()
print("RESULT " + json.dumps(found, default=str))
"""


def trial(args: dict, timeout_s: float) -> str:
    env = {**os.environ, "KERAS_BACKEND": "jax", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    flags = [env.get("XLA_FLAGS", "")]
    results = f"/tmp/autotuned-{args['dtype']}-{args['batch']}.txt"
    if args["pool"] == "whole":
        env.update(XLA_PYTHON_CLIENT_PREALLOCATE="true", XLA_PYTHON_CLIENT_MEM_FRACTION="0.05")
    elif args["pool"] == "grow" and args["autotune"] is None:
        flags.append(f"--xla_gpu_dump_autotune_results_to={results}")
    elif args["pool"] == "grow-cached":
        flags.append(f"--xla_gpu_load_autotune_results_from={results}")
    if args["autotune"] is not None:
        flags.append(f"--xla_gpu_autotune_level={args['autotune']}")
    env["XLA_FLAGS"] = " ".join(filter(None, flags))
    try:
        done = subprocess.run([sys.executable, "-c", TRIAL, json.dumps(args)], capture_output=True, text=True,
                              env=env, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return f"trial {json.dumps(args)} timed out"
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return lines[-1][7:] if lines else f"trial {json.dumps(args)} failed: {done.stderr[-1500:]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", nargs="+", default=["float32", "mixed_bfloat16"])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--autotune", type=int, nargs="*", default=[], help="also with these autotune levels")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--trial-timeout-s", type=float, default=150)
    options = parser.parse_args()
    def chain(trials):  # one after the other: grow-cached reads what grow wrote
        return [trial(args, options.trial_timeout_s) for args in trials]

    chains = []
    for dtype in options.dtype:
        for batch in options.batch:
            chains.append([dict(dtype=dtype, batch=batch, pool=pool, autotune=None) for pool in ("grow", "grow-cached")])
            chains.append([dict(dtype=dtype, batch=batch, pool="whole", autotune=None)]
                          + [dict(dtype=dtype, batch=batch, pool="grow", autotune=level) for level in options.autotune])
    with ThreadPoolExecutor(options.parallel) as pool:
        for lines in pool.map(chain, chains):
            print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
