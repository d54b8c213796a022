"""The cost of %%lms_fit itself: `%%lms_fit --n-tensors 0` (no swapping) vs a plain fit.

Same model and data, run alternately in one IPython shell; compares the median
time per step (the first step, which traces, excluded). Goal: ratio <= 1.02.
"""

import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from IPython.testing.globalipapp import get_ipython  # noqa: E402

from common import bootstrap_median_interval, ratio_figure, report  # noqa: E402

SETUP = """
import keras, numpy as np, time
rng = np.random.default_rng(0)
x = rng.random((8192, 64), dtype="float32"); y = (x.sum(axis=1) > 32).astype("float32")
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1, activation="sigmoid")])
model.compile("adam", "binary_crossentropy")
class Steps(keras.callbacks.Callback):
    def on_train_begin(self, logs=None): self.times = []
    def on_train_batch_begin(self, batch, logs=None): self.t = time.perf_counter()
    def on_train_batch_end(self, batch, logs=None): self.times.append(time.perf_counter() - self.t)
steps = Steps()
model.fit(x, y, batch_size=64, epochs=1, verbose=0)
"""
FIT = "model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=[steps])"


def main(rounds: int = 40, interval_s: float | None = None) -> None:
    shell = get_ipython()
    shell.run_line_magic("load_ext", "lms_magic")
    shell.run_cell(SETUP)
    plain, magic, ratios = [], [], []
    for index in range(rounds):
        interval = "" if interval_s is None else f" -i {interval_s}"
        order = [("plain", FIT), ("magic", f"%%lms_fit -q --n-tensors 0{interval}\n" + FIT)]
        for name, source in (order if index % 2 == 0 else order[::-1]):
            assert shell.run_cell(source).success
            per_step = statistics.median(shell.user_ns["steps"].times[1:])
            (plain if name == "plain" else magic).append(per_step)
        ratios.append(magic[-1] / plain[-1])
    low, high = bootstrap_median_interval(ratios)
    needed = int((1.96 * statistics.stdev(ratios) / 0.005) ** 2) + 1
    print(f"sampling {'at the default interval' if interval_s is None else f'every {interval_s} s'}: "
          f"time per step: plain {statistics.median(plain) * 1000:.3f} ms, %%lms_fit --n-tensors 0 "
          f"{statistics.median(magic) * 1000:.3f} ms; ratio median {statistics.median(ratios):.3f} (95% interval "
          f"{low:.3f}-{high:.3f}) over {rounds} alternating pairs (goal <= 1.02); +-0.005 would need about "
          f"{needed} pairs at this spread")
    report([ratio_figure("%%lms_fit --n-tensors 0 over a plain fit: time per step (a small MLP)", ratios, "<= 1.02")])


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--interval", type=float, default=None, help="%%lms_fit's -i (default: its own)")
    options = parser.parse_args()
    main(options.rounds, options.interval)
