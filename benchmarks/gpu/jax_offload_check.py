"""On a GPU with JAX: what LMS's offloading step holds against a plain step, and why (issue 60).

Each trial is a fresh process fitting KerasHub's Gemma-style causal LM with LoRA (``hub_lora_check.py``'s setup)
one way: ``plain``, ``lms`` (every candidate offloaded) or ``lms-nocse`` (the same with ``jax.checkpoint``'s
``prevent_cse=False``). Printed per trial: the allocator's peak of the process (``peak_bytes_in_use``) and, for
the LMS ways, XLA's ``memory_analysis()`` of the loss and gradient LMS traced, compiled four ways: as the model's
own (``own``), under LMS's policy with the planned values offloaded (``offloaded``), the same with
``prevent_cse=False`` (``offloaded_nocse``), with every value not offloaded saveable
(``offloaded_rest_saveable``), and under the policy with nothing offloaded (``saved``). The trials
run side by side (each peak is its own process's).

    python benchmarks/gpu/jax_offload_check.py --batch 8 16
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TRIAL = r"""
import functools, json, sys, time
args = json.loads(sys.argv[1])
import jax, keras, numpy as np
from lms_magic import LMS
from lms_magic.lms.jax import backend as jax_backend
from lms_magic.lms.jax.residuals import residual_policy, shape_specs

if args["way"] == "lms-nocse":
    checkpoint = jax.checkpoint
    jax.checkpoint = lambda fun, **kw: checkpoint(fun, **{**kw, "prevent_cse": False})

captured = []
plan = jax_backend.JaxBackend._plan
def recording(self, inner, step_args):
    chosen = plan(self, inner, step_args)
    captured.append((inner, shape_specs(step_args), chosen, self.host_kind))
    return chosen
jax_backend.JaxBackend._plan = recording

import keras_hub
keras.mixed_precision.set_global_policy(args["dtype"])
keras.utils.set_random_seed(1)
backbone = keras_hub.models.GemmaBackbone(vocabulary_size=4096, num_layers=4, num_query_heads=4,
    num_key_value_heads=1, hidden_dim=256, intermediate_dim=512, head_dim=64)
model = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
backbone.enable_lora(4)
model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()])
batch, steps = args["batch"], 4
rng = np.random.default_rng(0)
ids = rng.integers(0, 4096, (batch * steps, 256)).astype("int32")
mask = np.ones_like(ids); mask[:, 200:] = 0
lms = LMS(n_tensors=-1, verbose=0)
start = time.perf_counter()
history = model.fit({"token_ids": ids, "padding_mask": mask}, np.roll(ids, -1, axis=1), sample_weight=mask.astype("float32"),
                    batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[lms] if args["way"] != "plain" else [])
found = {"args": args, "loss": history.history["loss"][-1], "fit_s": time.perf_counter() - start,
         "peak": (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")}
if args["way"] != "plain":
    s = lms.stats
    found.update(moved=s.swapped_tensors, moved_bytes=s.swapped_bytes_per_step, predicted=s.device_peak_bytes,
                 predicted_without=s.device_peak_bytes_without_lms, notes=s.notes[:3])
    from jax.ad_checkpoint import Offloadable
    inner, specs, chosen, host = captured[0]
    def analysed(function):
        try:
            a = jax.jit(function).lower(*specs).compile().memory_analysis()
            return {k: getattr(a, k) for k in dir(a) if k.endswith("_in_bytes")}
        except Exception as error:
            return f"{type(error).__name__}: {str(error)[:200]}"
    offload = residual_policy(chosen, Offloadable(src="device", dst=host))
    found["analysis"] = {
        "own": analysed(jax.value_and_grad(inner, has_aux=True)),
        "offloaded": analysed(jax.value_and_grad(jax.checkpoint(inner, policy=offload), has_aux=True)),
        "offloaded_nocse": analysed(jax.value_and_grad(jax.checkpoint(inner, policy=offload, prevent_cse=False),
                                                       has_aux=True)),
        "offloaded_rest_saveable": analysed(jax.value_and_grad(jax.checkpoint(inner, policy=lambda prim, *_, **kw:
            Offloadable(src="device", dst=host) if prim.name == "name" and kw.get("name") in chosen else True),
            has_aux=True)),
        "saved": analysed(jax.value_and_grad(jax.checkpoint(inner, policy=residual_policy()), has_aux=True)),
    }
print("RESULT " + json.dumps(found, default=str))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", nargs="+", default=["float32", "mixed_bfloat16"])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--ways", nargs="+", default=["plain", "lms", "lms-nocse"])
    parser.add_argument("--parallel", type=int, default=6)
    parser.add_argument("--trial-timeout-s", type=float, default=180)
    options = parser.parse_args()
    env = {**os.environ, "KERAS_BACKEND": "jax", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    trials = [dict(dtype=d, batch=b, way=w) for d in options.dtype for b in options.batch for w in options.ways]

    def run(args):
        try:
            done = subprocess.run([sys.executable, "-c", TRIAL, json.dumps(args)], capture_output=True, text=True,
                                  env=env, timeout=options.trial_timeout_s, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return f"trial {json.dumps(args)} timed out"
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        return lines[-1][7:] if lines else f"trial {json.dumps(args)} failed: {done.stderr[-1500:]}"

    with concurrent.futures.ThreadPoolExecutor(options.parallel) as pool:
        for line in pool.map(run, trials):
            print(line, flush=True)


if __name__ == "__main__":
    main()
