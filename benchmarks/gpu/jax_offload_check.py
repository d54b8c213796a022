"""On a GPU with JAX: what LMS's offloading step holds against a plain step, and which naming of the values
XLA compiles lower (issue 60).

Each trial is a fresh process fitting KerasHub's Gemma-style causal LM with LoRA (``hub_lora_check.py``'s setup)
one way: ``plain``; ``lms`` (``LMS(n_tensors=-1)`` as shipped: every floating-point value named, every candidate
planned for offload, held to XLA's compiled figures); ``lms-dots`` (the same with only the outputs of matrix
products and convolutions named: every other value is recomputed from them in the backward pass, as JAX's
``dots_saveable`` policy does, and XLA fuses it); ``lms-dots-lhs`` (the same with XLA's latency-hiding scheduler).
Printed per trial: the loss, the allocator's peak of the process (``peak_bytes_in_use``), what LMS moved and
its notes, and for ``lms`` XLA's ``memory_analysis()`` of the loss and gradient compiled as the model's own
(``own``), as LMS planned it before XLA's check (``plan``), and with the matrix products named: nothing
offloaded (``dots_saved``), every one offloaded (``dots_offloaded``). The trials run side by side.

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
import json, os, sys, time
args = json.loads(sys.argv[1])
if args["way"].endswith("-lhs"):
    os.environ["XLA_FLAGS"] = "--xla_gpu_enable_latency_hiding_scheduler=true"
import jax, jax.numpy as jnp, keras, numpy as np
from jax.ad_checkpoint import checkpoint_name, Offloadable
from lms_magic import LMS
from lms_magic.lms.jax import backend as jax_backend, internals as jax_internals, residuals
from lms_magic.lms.jax.residuals import moved_policy, residual_name, residual_policy, shape_specs

HEAVY = ("dot_general", "conv_general_dilated")

def named_heavy(inner):
    # residuals.named_residuals with only the matrix products' and convolutions' outputs named
    def named(*step_args):
        leaves, tree = jax.tree_util.tree_flatten(step_args)
        closed, shapes = jax.make_jaxpr(lambda *flat: inner(*jax.tree_util.tree_unflatten(tree, flat)),
                                        return_shape=True)(*leaves)
        jaxpr, values = closed.jaxpr, {}
        read = lambda var: var.val if type(var).__name__ == "Literal" else values[var]
        values.update(zip(jaxpr.constvars, closed.consts)); values.update(zip(jaxpr.invars, leaves))
        for index, eqn in enumerate(jaxpr.eqns):
            outputs = jax_internals.jaxpr_equation_bound(eqn, [read(var) for var in eqn.invars])
            if eqn.primitive.name in HEAVY:
                outputs = [checkpoint_name(o, residual_name(eqn, index)) if jnp.issubdtype(o.dtype, jnp.floating)
                           else o for o in outputs]
            values.update(zip(eqn.outvars, outputs))
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shapes), [read(v) for v in jaxpr.outvars])
    return named

raw, planned = [], []
naming = residuals.named_residuals
def recording(inner):
    raw.append(inner)
    return named_heavy(inner) if args["way"].startswith("lms-dots") else naming(inner)
residuals.named_residuals = recording
held = jax_backend.JaxBackend._held_to_xla
def held_recording(self, plan, inner, step_args, own):
    planned.append((inner, shape_specs(step_args), frozenset(c.tensor for c in plan.moved), self.host_kind))
    return held(self, plan, inner, step_args, own)
jax_backend.JaxBackend._held_to_xla = held_recording

from tests.hub import causal_lm  # the tests' KerasHub causal LM, at issue 60's size
model = causal_lm("gemma", seed=1, layers=4, hidden=256, vocabulary=4096, dtype=args["dtype"])
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
                 predicted_without=s.device_peak_bytes_without_lms, notes=s.notes[:3],
                 planned=len(planned[0][2]) if planned else None)
if args["way"] == "lms" and planned:
    inner, specs, chosen, host = planned[0]
    def analysed(function):
        try:
            a = jax.jit(function).lower(*specs).compile().memory_analysis()
            return {k: getattr(a, k) for k in ("temp_size_in_bytes", "host_temp_size_in_bytes", "argument_size_in_bytes",
                                               "output_size_in_bytes", "alias_size_in_bytes")}
        except Exception as error:
            return f"{type(error).__name__}: {str(error)[:200]}"
    heavy = named_heavy(raw[0])
    everything = lambda prim, *_, **kw: Offloadable(src="device", dst=host) if prim.name == "name" else False
    found["analysis"] = {
        "own": analysed(jax.value_and_grad(raw[0], has_aux=True)),
        "plan": analysed(jax.value_and_grad(jax.checkpoint(inner, policy=moved_policy(chosen, False, host)), has_aux=True)),
        "dots_saved": analysed(jax.value_and_grad(jax.checkpoint(heavy, policy=residual_policy()), has_aux=True)),
        "dots_offloaded": analysed(jax.value_and_grad(jax.checkpoint(heavy, policy=everything), has_aux=True)),
    }
print("RESULT " + json.dumps(found, default=str))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", nargs="+", default=["float32", "mixed_bfloat16"])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--ways", nargs="+", default=["plain", "lms", "lms-dots", "lms-dots-lhs"])
    parser.add_argument("--parallel", type=int, default=8)
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
