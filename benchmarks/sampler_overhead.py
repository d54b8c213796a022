"""Overhead of profiling at 10 ms sampling (goal: time ratio at most 1.01).

Two workloads, each run with and without `profile_memory(interval_s=0.01)` (the
engine of %%gpumem), alternately in one process so drift hits both alike:
a CPU-bound pure-Python loop, and a small Keras fit on CPU.
Prints the median time of each and their ratio.
"""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from lms_magic import profile_memory  # noqa: E402


def cpu_loop():
    total = 0
    for i in range(6_000_000):
        total += i * i % 7
    return total


def make_keras_fit():
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(20_000, 32)).astype("float32")
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
    quartiles = statistics.quantiles(ratios, n=4)
    print(f"{name:<24} plain {statistics.median(plain):6.3f} s  profiled {statistics.median(profiled):6.3f} s  "
          f"ratio median {statistics.median(ratios):.3f} (IQR {quartiles[0]:.3f}-{quartiles[2]:.3f}, {rounds} pairs)")


def main():
    print("workload, 10 ms sampling; goal: median ratio <= 1.01")
    compare("CPU-bound Python loop", cpu_loop, rounds=20)
    compare("Keras fit (20k rows)", make_keras_fit(), rounds=20)


if __name__ == "__main__":
    main()
