"""On a GPU capped at --memory-gib: an out-of-memory fit explained by ``%%gpumem``, and its predicted largest batch
checked by training there and one above.

Each trial runs in a fresh process (an out-of-memory error cannot poison the next), with the GPU capped the way a
smaller card would be: PyTorch with ``set_per_process_memory_fraction``, JAX with ``XLA_PYTHON_CLIENT_MEM_FRACTION``
(its allocator's pool). The trials, for ResNet-50 at 224x224 (SGD with momentum):

1. ``%%gpumem`` over ``model.fit(x, y, batch_size=--batch)`` in IPython's shell: the fit runs out of memory; printed
   are what the user sees (the account above the error) and whether the weights are as before (all of them, and
   the trainable ones: a forward pass that fails part-way has already moved BatchNormalization's statistics).
2. ResNet-50: a plain fit at the account's largest batch without LMS, then one above it (where the first fits) or 10% below
   (where it does not): whether each trains, and the allocator's measured peak (``torch.cuda.max_memory_allocated``,
   JAX's ``peak_bytes_in_use``). Where the two bracket nothing, the measured largest batch is searched (doubled
   until a fit fails or halved until one trains, then bisected to within 5%).
3. ``--model gpt2`` (KerasHub's GPT-2 from a config, ``--layers``, sequence ``--size``), instead of 2: the same
   batch with ``LMS()``: whether it trains, LMS's predicted peak with and without it, and the measured peak.

    KERAS_BACKEND=torch python benchmarks/gpu/explain_check.py --backend torch --memory-gib 16 --batch 256

    KERAS_BACKEND=jax python benchmarks/gpu/explain_check.py --backend jax --model gpt2 --size 2048 --batch 8

--device cpu --size 32 --batch 8 runs the code paths on a CPU (nothing runs out of memory there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRIAL = r"""
import contextlib, io, json, os, sys, time
args = json.loads(sys.argv[1])
if args["device"] == "cuda" and args["backend"] == "jax":
    import pynvml
    pynvml.nvmlInit()
    total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{min(1.0, args['memory_gib'] * 2**30 / total):.4f}"
if args["device"] == "cuda" and args["backend"] == "torch":
    import torch
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, args["memory_gib"] * 2**30 / total))
import keras, numpy as np
size, batch = args["size"], args["batch"]
keras.utils.set_random_seed(1)
if args["model"] == "resnet50":
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=1000)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.rand(batch * args["steps"], size, size, 3).astype("float32")
    y = np.random.randint(0, 1000, batch * args["steps"])
else:  # KerasHub's GPT-2 from a config (tests/hub.py): 4 heads, hidden 128, a 1000-token head, AdamW
    from tests.hub import language_model, tokens
    model = language_model("gpt2", layers=args["layers"], hidden=128, sequence=size)
    x, y = tokens("gpt2", n=batch * args["steps"], sequence=size)

def peak_bytes():
    if args["device"] != "cuda":
        return None
    if args["backend"] == "torch":
        import torch
        return torch.cuda.max_memory_allocated()
    import jax
    return (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")

found = {"batch": batch}
start = time.perf_counter()
if args["kind"] == "oom":
    from IPython.testing.globalipapp import get_ipython
    shell = get_ipython()
    shell.run_line_magic("load_ext", "lms_magic")
    shell.user_ns.update(model=model, x=x, y=y)
    before = [w.copy() for w in model.get_weights()]
    trainable = [keras.ops.convert_to_numpy(v).copy() for v in model.trainable_variables]
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        result = shell.run_cell(f"%%gpumem\nmodel.fit(x, y, batch_size={batch}, epochs=1, verbose=0)")
    text = said.getvalue()
    print(text[-12000:])
    error = result.error_in_exec
    try:
        found.update(weights_as_before=all(np.array_equal(a, b) for a, b in zip(before, model.get_weights())),
                     trainable_as_before=all(np.array_equal(a, keras.ops.convert_to_numpy(v))
                                             for a, v in zip(trainable, model.trainable_variables)))
    except Exception as unreadable:  # JAX: the failed step's arrays were assigned to the variables
        found.update(weights_as_before=f"unreadable: {type(unreadable).__name__}: {str(unreadable)[:200]}")
    found.update(error=None if error is None else type(error).__name__,
                 explained="ran out of device memory" in text,
                 largest={m: int(n) for m, n in
                          __import__("re").findall(r"^\s+(without LMS|LMS|LMS, recompute|LMS, lean_ops): .*largest batch (\d+)",
                                                   text, __import__("re").M)})
else:
    callbacks = []
    if args["kind"] == "lms":
        from lms_magic import LMS
        callbacks = [LMS(verbose=0)]
    try:
        history = model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=callbacks)
        found["trains"] = True
        found["loss"] = float(history.history["loss"][-1])
    except Exception as error:
        from lms_magic.memory.errors import is_out_of_memory
        if not is_out_of_memory(error):
            raise
        found["trains"] = False
        found["error"] = str(error)[:400]  # XLA's: the size it asked for
    found["measured_peak_bytes"] = peak_bytes()
    if callbacks:
        stats = callbacks[0].stats
        found.update({key: stats[key] for key in (
            "active", "reason", "candidates", "swapped_tensors", "swapped_bytes_per_step", "recomputed_tensors",
            "device_peak_bytes", "device_peak_bytes_without_lms", "peak_source", "prediction_source",
            "capacity_bytes", "budget_bytes", "plan_rule", "predicted_step_ratio", "compute_source")})
found["seconds"] = round(time.perf_counter() - start, 1)
print("RESULT " + json.dumps(found, default=str), flush=True)
"""


def trial(kind: str, batch: int, options) -> dict:
    """One trial in a fresh process; its RESULT line, or {"failed": why}."""
    args = dict(kind=kind, batch=batch, backend=options.backend, device=options.device, size=options.size,
                memory_gib=options.memory_gib, steps=options.steps, model=options.model, layers=options.layers)
    env = {**os.environ, "KERAS_BACKEND": options.backend, "PYTHONPATH": f"{ROOT}{os.pathsep}" +
           os.environ.get("PYTHONPATH", ""), "TF_CPP_MIN_LOG_LEVEL": "3"}
    limit_s = options.account_timeout_s if kind == "oom" and options.account_timeout_s else options.trial_timeout_s
    try:
        done = subprocess.run([sys.executable, "-c", TRIAL, json.dumps(args)], capture_output=True, text=True,
                              env=env, timeout=limit_s)
    except subprocess.TimeoutExpired:
        return {"batch": batch, "failed": f"over {limit_s} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if kind == "oom":
        print(done.stdout.replace(lines[-1], "") if lines else done.stdout, flush=True)
    if not lines:
        return {"batch": batch, "failed": done.stderr[-3000:]}
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch", choices=["torch", "jax"])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--memory-gib", type=float, default=16)
    parser.add_argument("--model", default="resnet50", choices=["resnet50", "gpt2"])
    parser.add_argument("--size", type=int, default=224, help="the image side (resnet50) or sequence length (gpt2)")
    parser.add_argument("--layers", type=int, default=12, help="gpt2's transformer layers")
    parser.add_argument("--batch", type=int, default=256, help="a batch that does not fit")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--trial-timeout-s", type=float, default=150)
    parser.add_argument("--account-timeout-s", type=float, default=None,
                        help="the out-of-memory trial's limit (its account compiles and replays; default: --trial-timeout-s)")
    parser.add_argument("--max-batch", type=int, default=4096, help="the search's largest batch")
    parser.add_argument("--oom-only", action="store_true", help="the out-of-memory trial alone")
    parser.add_argument("--plain-fit-only", action="store_true",
                        help="gpt2: a plain fit instead of the out-of-memory trial (the account of a deep model "
                             "takes longer than a device call may)")
    parser.add_argument("--lms-only", action="store_true", help="gpt2: the LMS trial alone")
    parser.add_argument("--plain-only", action="store_true", help="gpt2: the plain fit trial alone")
    options = parser.parse_args()
    started = time.perf_counter()
    what = (f"ResNet-50 {options.size}x{options.size}" if options.model == "resnet50" else
            f"GPT-2 ({options.layers} layers, hidden 128, sequence {options.size})")
    print(f"{what} on {options.backend}, {options.device}, capped at {options.memory_gib:g} GiB", flush=True)
    if options.plain_only:
        print("fit trial:", json.dumps(trial("fit", options.batch, options), default=str), flush=True)
        return
    if options.lms_only:
        account = {}
    elif options.plain_fit_only:  # no account: a plain fit at the batch, then the LMS trial
        print("fit trial:", json.dumps(trial("fit", options.batch, options)), flush=True)
        account = {}
    else:
        account = trial("oom", options.batch, options)
        print("oom trial:", json.dumps({k: v for k, v in account.items() if k != "failed"}),
              account.get("failed", ""), flush=True)
    if options.model == "gpt2":  # the batch that ran out of memory, with LMS
        print("lms trial:", json.dumps(trial("lms", options.batch, options)), flush=True)
        print(f"done in {time.perf_counter() - started:.0f} s", flush=True)
        return
    predicted = account.get("largest", {}).get("without LMS")
    if options.oom_only:
        return
    if not predicted:
        print("no predicted largest batch without LMS: nothing to check")
        return
    tried = {}

    def fit_at(batch: int) -> bool:
        if batch not in tried:
            tried[batch] = trial("fit", batch, options)
            print("fit trial:", json.dumps(tried[batch]), flush=True)
        return bool(tried[batch].get("trains"))

    # the prediction, then one above it (where it trains) or 10% below (where it does not)
    trains = fit_at(predicted)
    fit_at(predicted + 1 if trains else max(1, int(predicted * 0.9)))
    # where that brackets nothing, the measured largest batch: doubled until a fit fails (or halved until one trains),
    # then bisected to within 5%
    ok = max([b for b, r in tried.items() if r.get("trains")], default=0)
    failed = min([b for b, r in tried.items() if r.get("trains") is False], default=None)
    while failed is None and ok and ok < options.max_batch:
        failed = None if fit_at(ok * 2) else ok * 2
        ok = ok * 2 if failed is None else ok
    while failed is not None and not ok and failed > 1:  # halved until a fit trains
        ok = failed // 2 if fit_at(failed // 2) else 0
        failed = failed if ok else failed // 2
    while failed is not None and ok and failed - ok > max(1, ok // 20):
        middle = (ok + failed) // 2
        if fit_at(middle):
            ok = middle
        else:
            failed = middle
    print(f"predicted largest batch without LMS {predicted}; measured: {ok} trains, {failed} does not", flush=True)
    print(f"done in {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
