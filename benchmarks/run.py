"""The benchmark suite: one entry, one registry, one table (``make bench``).

Each benchmark of the registry below runs as a script in a process of its own, on the Keras backend it names, and
hands its figures back (``common.report``: each a value with its spread). The suite writes one Markdown table, with
the date, the machine and the versions, to ``benchmarks/results/bench-DATE.md``, and each script's whole output,
with the command it ran first, to ``benchmarks/results/bench-DATE/NAME.log``.

    python benchmarks/run.py                    # every benchmark
    python benchmarks/run.py explain_speed      # one, or several by name
    python benchmarks/run.py --list             # the registry: name, what it measures, how long it takes
    python benchmarks/run.py --code /tmp/before explain_speed   # another checkout's lms_magic, the same scripts

``--code``: the scripts of this checkout run another checkout's package (and its ``tests`` helpers), so a figure
can be measured before and after a change with the same benchmark. Scripts that reach only the public API run on
any checkout.

The GPU figures come from ``benchmarks/gpu_checks.sh`` on a lent GPU (the scripts under ``benchmarks/gpu/``), its
raw output kept with the command it ran under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


@dataclass(frozen=True)
class Benchmark:
    """One entry of the suite: ``script`` with ``args``, on ``backend``, taking about ``minutes`` on a 2-core CPU (as
    measured on 2026-11-27: ``make bench`` whole, about 30 minutes)."""

    name: str
    measures: str
    minutes: float
    script: str
    args: tuple[str, ...] = ()
    backend: str = "tensorflow"
    env: dict = field(default_factory=dict)


REGISTRY = [
    Benchmark("load_time", "%load_ext lms_magic in a fresh interpreter", 0.5, "load_time.py"),
    Benchmark("sampler_overhead", "%%gpumem's sampler at 10 ms against no sampler, alternately", 1,
              "sampler_overhead.py"),
    Benchmark("dashboard_draw", "the %%lms_fit dashboard built after 10,000 steps a variant", 0.5, "dashboard_draw.py"),
    Benchmark("lms_fit_overhead", "%%lms_fit with nothing moved against a plain fit, per step", 0.5,
              "lms_fit_overhead.py"),
    Benchmark("lms_fits_cost", "LMS() left on models that fit a simulated 8 GiB device: a whole fit's time", 4,
              "lms_fits_cost.py"),
    Benchmark("lms_first_step", "a first and a second fit with LMS where something moves: extra time", 5.5,
              "lms_first_step.py", ("--models", "ResNet50", "DenseNet121")),
    Benchmark("lms_tune", "%lms_tune's slider response on ResNet-50; autotune's trials against a grid", 2,
              "lms_tune.py"),
    Benchmark("lms_tune_jax", "%lms_tune's slider response on JAX; the jaxpr replay against XLA's figure", 0.5,
              "lms_tune_jax.py", backend="jax"),
    Benchmark("explain_speed", "explain_fit on ResNet-50 224x224: a frontier of 16 batch sizes", 0.7,
              "explain_speed.py", ("--batch", "64", "--step", "64", "--largest", "1024")),
    Benchmark("explain_speed_account", "explain_fit on ResNet-50 224x224 at 256: the out-of-memory account", 0.6,
              "explain_speed.py", ("--batch", "256", "--largest", "0")),
    Benchmark("explain_speed_gpt2", "explain_fit on KerasHub GPT-2 (12 layers, 512 tokens): a frontier", 0.9,
              "explain_speed.py", ("--model", "gpt2", "--size", "512", "--batch", "8", "--step", "8",
                                   "--largest", "128")),
    Benchmark("explain_speed_torch", "explain_fit on PyTorch, ResNet-50 224x224: a frontier of 16 batch sizes", 0.6,
              "explain_speed.py", ("--batch", "64", "--step", "64", "--largest", "1024"), backend="torch"),
    Benchmark("explain_speed_jax", "explain_fit on JAX, ResNet-50 224x224 at 256: the out-of-memory account", 1,
              "explain_speed.py", ("--batch", "256", "--largest", "0", "--runs", "2"), backend="jax"),
    Benchmark("closed_loop", "explain_fit against TensorFlow's allocator on 5 models (simulated device): the peak "
              "predicted and corrected over measured, the largest batch confirmed against a bisection", 18,
              "closed_loop.py"),
    Benchmark("closed_loop_torch", "PyTorch: explain_fit's prediction without LMS over its CPU meter in a real step, "
              "the same 5 models", 1.5, "closed_loop.py", backend="torch"),
    Benchmark("batch_size_max", "%%lms_fit --batch-size max on lms_demo's CNN (64 MiB) over the fit at its batch alone",
              4, "largest_batch.py", ("--batch-size-max",)),
    Benchmark("largest_batch", "explain_fit's largest batch each way in 16 GiB: ResNet-50, DenseNet-121 224x224", 0.5,
              "largest_batch.py"),
    Benchmark("largest_batch_confirmed", "the demo CNN's largest batch on 64 MiB: predicted, and confirmed by fits",
              0.3, "largest_batch.py", ("--confirm",)),
    Benchmark("default_plan", "LMS's default plan on 6 architectures at 64x64, SGD: predicted peaks", 2.5,
              "lms_default_plan.py", ("--optimizers", "sgd")),
    Benchmark("recompute", 'recompute="only" on DenseNet121 and ResNet50 at 64x64: the allocator\'s peak', 1.2,
              "modes.py", ("--mode", "recompute", "DenseNet121", "ResNet50")),
    Benchmark("hybrid", "the hybrid plan against swaps alone: host-link bytes", 2,
              "modes.py", ("--mode", "hybrid", "DenseNet121", "ResNet50")),
    Benchmark("order_backward", "the backward pass a layer at a time: the allocator's peak, every candidate swapped",
              0.6, "modes.py", ("--mode", "order", "ResNet50")),
    Benchmark("torch_lean", "lean_ops on PyTorch: the bytes saved for the backward pass", 0.5, "modes.py",
              ("--mode", "lean"), backend="torch"),
    Benchmark("torch_recompute", 'recompute="only" on PyTorch: the predicted peak, the losses', 0.5, "modes.py",
              ("--mode", "recompute"), backend="torch"),
    Benchmark("keras_hub", "KerasHub GPT-2 and BERT with every candidate moved, on each backend", 1,
              "keras_hub_lms.py"),
    Benchmark("fine_tuning", "KerasHub causal LMs with LoRA on a simulated 256 MiB device: LMS's and explain_fit's "
              "figures against the allocator, a fit with LMS() against plain", 12, "fine_tuning.py"),
    Benchmark("step_orders", "a plain step of the demo CNN in fresh processes: the executor's two orders, by the "
              "allocator's events", 0.5, "closed_loop.py", ("--orders",)),
    Benchmark("devices", "JAX DataParallel on 2 and 4 host devices; MirroredStrategy over 2 accelerators", 0.5,
              "lms_devices.py"),
    Benchmark("soak", "a long-running kernel after an LMS fit: memory growth of plain calls", 1, "lms_soak.py"),
    Benchmark("jax_fits", "LMS fits on JAX (offload, the default plan, recompute): predicted peaks, losses", 1.2,
              "lms_jax.py", backend="jax"),
]


def gpu_present() -> bool:
    """Whether NVML sees a GPU (the package's own reader of it)."""
    from lms_magic.memory.nvml import GpuUnavailable, NvmlSource

    source = NvmlSource()
    try:
        source.open()
        return source.device_count() > 0
    except GpuUnavailable:
        return False


def versions(python: str, code: Path) -> str:
    """The versions the suite ran with, read by the interpreter that runs the benchmarks."""
    probe = ("import importlib.metadata as m\nfor name in ('lms-magic', 'tensorflow-cpu', 'tensorflow', 'keras', "
             "'torch', 'jax', 'ipython'):\n    try: print(f'{name} {m.version(name)}')\n    except Exception: pass")
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(code)}).stdout.split("\n")
    return ", ".join(line for line in found if line)


def machine() -> str:
    """The CPU (its model, vector extensions: a kernel's scratch differs by them) and oneDNN's switch, the cores and
    the system: every CPU figure names its machine."""
    from lms_magic.memory.machine import cpu_name

    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "TensorFlow's default")
    return (f"{cpu_name()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; "
            f"TF_ENABLE_ONEDNN_OPTS {onednn}")


def run_one(bench: Benchmark, code: Path, logs: Path) -> tuple[list[dict], float, str]:
    """Runs one benchmark: its figures, its seconds, and how it ended ("ok", or why not)."""
    figures_path = logs / f"{bench.name}.figures.jsonl"
    figures_path.unlink(missing_ok=True)
    command = [sys.executable, str(HERE / bench.script), *bench.args]
    env = {**os.environ, "KERAS_BACKEND": bench.backend, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(code),
           "LMS_BENCH_CODE": str(code), "LMS_BENCH_FIGURES": str(figures_path), **bench.env}
    shown = " ".join(f"{key}={value}" for key, value in (("KERAS_BACKEND", bench.backend), *bench.env.items()))
    started = time.perf_counter()
    with open(logs / f"{bench.name}.log", "w") as log:
        log.write(f"$ {shown} {shlex.join(command)}\n")
        log.flush()
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=HERE.parent, env=env)
    seconds = time.perf_counter() - started
    figures = [json.loads(line) for line in figures_path.read_text().splitlines()] if figures_path.exists() else []
    figures_path.unlink(missing_ok=True)
    return figures, seconds, "ok" if done.returncode == 0 else f"failed (exit {done.returncode}: see its log)"


def number(value: float) -> str:
    """A figure as the table shows it: whole from 100 up, one decimal from 10, else three significant digits.

    Example:
        >>> number(1216), number(22.2939), number(6.3218), number(0.0001234)
        ('1216', '22.3', '6.32', '0.000123')
    """
    if value == int(value) or abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def cell(figure: dict) -> tuple[str, str]:
    value = f"{number(figure['value'])} {figure['unit']}".strip()
    spread = f"{number(figure['low'])}-{number(figure['high'])} ({figure['spread']})" \
        if figure.get("low") is not None else ""
    return value, spread


def table(rows: list[tuple[Benchmark, list[dict], float, str]], header: list[str]) -> str:
    lines = header + ["", "| benchmark | figure | value | spread | measured how | goal |",
                      "| --- | --- | --- | --- | --- | --- |"]
    for bench, figures, seconds, outcome in rows:
        if outcome != "ok" or not figures:
            lines.append(f"| {bench.name} | {bench.measures} | {outcome if outcome != 'ok' else 'no figure'} | | | |")
        for figure in figures:
            value, spread = cell(figure)
            lines.append(f"| {bench.name} | {figure['name']} | {value} | {spread} | {figure['measure']} | "
                         f"{figure.get('goal', '')} |")
    lines += ["", "Each benchmark's time: " + ", ".join(f"{bench.name} {seconds / 60:.1f} min"
                                                         for bench, _, seconds, _ in rows) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: every one that runs here)")
    parser.add_argument("--list", action="store_true", help="the registry, and nothing run")
    parser.add_argument("--code", type=Path, default=HERE.parent, help="the checkout whose lms_magic runs")
    parser.add_argument("--out", type=Path, default=None, help="the table (default results/bench-DATE.md)")
    args = parser.parse_args()
    by_name = {bench.name: bench for bench in REGISTRY}
    if args.list:
        for bench in REGISTRY:
            print(f"{bench.name:<24}{bench.minutes:>5g} min  {bench.backend:<10} {bench.measures}")
        return
    unknown = [name for name in args.names if name not in by_name]
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; --list names them")
    gpu = gpu_present()
    chosen = [by_name[name] for name in args.names] if args.names else REGISTRY
    stamp = datetime.date.today().isoformat()
    out = args.out or RESULTS / f"bench-{stamp}.md"
    logs = out.with_suffix("")
    logs.mkdir(parents=True, exist_ok=True)
    code = args.code.resolve()
    header = [f"# Benchmarks, {stamp}", "",
              f"- Machine: {machine()}; {'an NVIDIA GPU' if gpu else 'no GPU'}",
              f"- Python {platform.python_version()}; {versions(sys.executable, code)}",
              f"- Code: {code}" + (f" ({_commit(code)})" if _commit(code) else ""),
              f"- Command: `python benchmarks/run.py {shlex.join(sys.argv[1:])}`; each script's output: "
              f"`{logs.relative_to(HERE.parent) if logs.is_relative_to(HERE.parent) else logs}/`"]
    rows = []
    for bench in chosen:
        print(f"{bench.name}: {bench.measures} (about {bench.minutes:g} min)", flush=True)
        figures, seconds, outcome = run_one(bench, code, logs)
        rows.append((bench, figures, seconds, outcome))
        for figure in figures:
            value, spread = cell(figure)
            print(f"  {figure['name']}: {value}{f' ({spread})' if spread else ''}", flush=True)
        print(f"  {outcome}, {seconds / 60:.1f} min", flush=True)
        out.write_text(table(rows, header))
    print(f"table: {out}")


def _commit(code: Path) -> str:
    done = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


if __name__ == "__main__":
    main()
