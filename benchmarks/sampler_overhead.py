"""Overhead of profiling at 10 ms sampling (goal: time ratio at most 1.01).

Two workloads, each run with and without `profile_memory(interval_s=0.01)` (the
engine of %%gpumem), alternately in one process so drift hits both alike:
a CPU-bound pure-Python loop, and a small Keras fit on CPU. For each: the
median ratio with a bootstrap 95% interval, and how many pairs would resolve
the ratio to +-0.005 at this run's spread. Also the cost of one sample,
measured directly: at 100 samples/s it bounds the sampler's own CPU share.
"""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from common import Figure, bootstrap_median_interval, ratio_figure, report  # noqa: E402
from lms_magic import profile_memory  # noqa: E402

FIGURES: list[Figure] = []


def cpu_loop():
    total = 0
    for i in range(1_500_000):
        total += i * i % 7
    return total


def make_keras_fit():
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(5_000, 32)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile("adam", "binary_crossentropy")
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)  # warm up: tracing

    def fit():
        model.fit(x, y, batch_size=64, epochs=1, verbose=0)

    return fit


def timed(work, profiled: bool) -> float:
    start = time.perf_counter()
    if profiled:
        with profile_memory(interval_s=0.01):
            work()
    else:
        work()
    return time.perf_counter() - start


def compare(name, work, rounds):
    """Pairs of runs in alternating order (plain first, then profiled first)."""
    plain, profiled, ratios = [], [], []
    for round_index in range(rounds):
        if round_index % 2:
            profiled_s, plain_s = timed(work, True), timed(work, False)
        else:
            plain_s, profiled_s = timed(work, False), timed(work, True)
        plain.append(plain_s)
        profiled.append(profiled_s)
        ratios.append(profiled_s / plain_s)
    low, high = bootstrap_median_interval(ratios)
    spread = statistics.stdev(ratios)
    FIGURES.append(ratio_figure(f"profile_memory at 10 ms sampling over none: {name}", ratios, "<= 1.01"))
    needed = int((1.96 * spread / 0.005) ** 2) + 1  # pairs for a +-0.005 interval on the mean ratio
    print(f"{name:<24} plain {statistics.median(plain):6.3f} s  profiled {statistics.median(profiled):6.3f} s  "
          f"ratio median {statistics.median(ratios):.4f} (95% interval {low:.4f}-{high:.4f}, {rounds} pairs; "
          f"+-0.005 would need about {needed} pairs at this spread)")


def sample_cost_us(samples: int = 20_000) -> float:
    """Microseconds one sample of the profiler takes (no GPU here: RSS and bookkeeping)."""
    from lms_magic.memory.profile import MemoryProfiler

    profiler = MemoryProfiler(interval_s=3600).start()  # its own thread stays asleep
    started = time.perf_counter()
    for _ in range(samples):
        profiler._sample()
    cost = (time.perf_counter() - started) / samples * 1e6
    profiler.stop()
    return cost


def main():
    cost = sample_cost_us()
    print(f"one sample: {cost:.1f} us, so 100 samples/s take {cost * 100 / 1e4:.2f}% of a core")
    print("workload, 10 ms sampling; goal: median ratio <= 1.01")
    compare("CPU-bound Python loop", cpu_loop, rounds=100)
    compare("Keras fit (5k rows)", make_keras_fit(), rounds=100)
    report(FIGURES + [Figure("one sample of the profiler (RSS and bookkeeping, no GPU)", "20,000 samples",
                             round(cost, 1), "us")])


if __name__ == "__main__":
    main()
