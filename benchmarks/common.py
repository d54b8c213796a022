"""What the benchmarks share: the figures each reports to the suite (``report``), a spread's interval, and, for
the keras.applications ones, a compiled model and its data on the tests' two logical CPUs (/CPU:0 plays the
accelerator, /CPU:1 the host) and one measurement a fresh process.

    report([Figure("load_ext", "median of 10 interpreters", 0.12, "s", low=0.11, high=0.14, spread="min-max")])
    model, x, y = compiled_application("ResNet50", size=64, batch=8, steps=3)
    result = in_fresh_process(__file__, ["ResNet50", "plain"], size=64, batch=8, steps=3)
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

MODELS = ("DenseNet121", "ResNet50", "MobileNetV2", "EfficientNetB0")
ROOT = Path(__file__).resolve().parents[1]
# the checkout whose lms_magic (and tests' helpers) a benchmark runs: this one, or another (run.py --code DIR)
CODE = Path(os.environ.get("LMS_BENCH_CODE", ROOT))
FIGURES_VARIABLE = "LMS_BENCH_FIGURES"  # where run.py collects a benchmark's figures (a file of JSON lines)


@dataclass(frozen=True)
class Figure:
    """One figure a benchmark measured: ``value`` (a median, a count, a ratio) and its spread over the runs that
    made it (``low``-``high``, and what that range is)."""

    name: str  # what it is, e.g. "ResNet-50 224x224, frontier of 16 batch sizes"
    measure: str  # how, e.g. "median of 3 runs"
    value: float
    unit: str  # "s", "ms", "x", "MiB", "batch", ""
    low: float | None = None
    high: float | None = None
    spread: str = ""  # what low-high is: "min-max", "95% bootstrap interval of the median"
    goal: str = ""  # the goal the figure is held to, where it has one


def child_env(**extra: str) -> dict:
    """The environment of a benchmark's own child process: this one's, with ``CODE`` first on the path."""
    return {**os.environ, "PYTHONPATH": str(CODE), "TF_CPP_MIN_LOG_LEVEL": "3", **extra}


def report(figures: list[Figure]) -> None:
    """Prints each figure, and hands it to the suite (``run.py``) where it collects them."""
    for figure in figures:
        spread = f" ({figure.low:g}-{figure.high:g}, {figure.spread})" if figure.low is not None else ""
        goal = f"; goal {figure.goal}" if figure.goal else ""
        print(f"figure: {figure.name}: {figure.value:g} {figure.unit}{spread}, {figure.measure}{goal}")
    target = os.environ.get(FIGURES_VARIABLE)
    if target:
        with open(target, "a") as out:
            for figure in figures:
                out.write(json.dumps(asdict(figure)) + "\n")


def runs_figure(name: str, values: list[float], unit: str, scale: float = 1.0, goal: str = "") -> Figure:
    """The median of ``values`` (times ``scale``), with their min-max."""
    scaled = [value * scale for value in values]
    return Figure(name, f"median of {len(values)} runs", round(statistics.median(scaled), 4), unit,
                  round(min(scaled), 4), round(max(scaled), 4), "min-max", goal)


def bootstrap_median_interval(values, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of ``values``."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws)]


def ratio_figure(name: str, ratios: list[float], goal: str = "") -> Figure:
    """The median of paired ratios, with its 95% bootstrap interval."""
    low, high = bootstrap_median_interval(ratios)
    return Figure(name, f"median of {len(ratios)} alternating pairs", round(statistics.median(ratios), 4), "x",
                  round(low, 4), round(high, 4), "95% bootstrap interval of the median", goal)


def compiled_application(name: str, size: int, batch: int, steps: int):
    """keras.applications' ``name`` (seed 5, 10 classes, logits) compiled with SGD and momentum, and ``steps``
    batches of random images and labels (``tests/lms/tensorflow/fresh_peak.application``); the CPU is split first,
    as in the tests."""
    from tests.lms.tensorflow.fresh_peak import application

    split_tensorflow_cpu()
    model, (x, y) = application(name, size, batch, steps)
    return model, x, y


def split_tensorflow_cpu() -> None:
    """TensorFlow's CPU as two logical devices, one op at a time, as in the tests: ``CODE``'s package's
    ``split_cpu`` (an older checkout's tests split it themselves)."""
    sys.path.insert(0, str(CODE))
    try:
        from lms_magic.lms.devices import split_cpu
    except ImportError:
        from tests.conftest import _split_tensorflow_cpu

        _split_tensorflow_cpu()
        return
    split_cpu(2)


def fit_step_peaks(model, x, y, batch: int, lms=None) -> dict:
    """``model`` trained one epoch on ``(x, y)`` (with the callback ``lms``, if any): each step's loss, and the
    medians over the steps after the first of /CPU:0's allocator peak over what was held before the step
    (``step_peak_bytes``) and of the step time (``step_s``)."""
    import statistics
    import time

    import keras
    import tensorflow as tf

    class StepPeaks(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.peaks, self.times, self.losses = [], [], []

        def on_train_batch_begin(self, step, logs=None):
            tf.config.experimental.reset_memory_stats("CPU:0")
            self.before = tf.config.experimental.get_memory_info("CPU:0")["current"]
            self.started = time.perf_counter()

        def on_train_batch_end(self, step, logs=None):
            self.times.append(time.perf_counter() - self.started)
            self.peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - self.before)
            self.losses.append(float(logs["loss"]))

    record = StepPeaks()
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=([lms] if lms else []) + [record])
    return {"losses": record.losses, "step_peak_bytes": statistics.median(record.peaks[1:]),
            "step_s": statistics.median(record.times[1:])}


def in_fresh_process(script: str, one: list[str], size: int, batch: int, steps: int) -> dict:
    """``script --one ONE... --size --batch --steps`` in a fresh process (TensorFlow's allocator counts whole
    chunks, so a peak depends on what earlier models left in it); its last line of output, as JSON."""
    done = subprocess.run([sys.executable, script, "--one", *one, "--size", str(size), "--batch", str(batch),
                           "--steps", str(steps)], capture_output=True, text=True,
                          env=child_env())
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def fresh_runs(script: str, name: str, variants, size: int, batch: int, steps: int) -> dict:
    """Each of ``variants`` of model ``name`` measured by ``script`` in a fresh process, by variant."""
    return {variant: in_fresh_process(script, [name, variant], size, batch, steps) for variant in variants}


def header(size: int, batch: int, steps: int) -> str:
    return f"{size}x{size}, batch {batch}, {steps} steps, SGD with momentum; this machine's CPU as the accelerator"
