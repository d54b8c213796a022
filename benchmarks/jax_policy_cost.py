"""What LMS's checkpoint policy on JAX costs in step time on this CPU: a KerasHub GPT-2 from a config (4 layers,
hidden 128, sequence 128, batch 8, AdamW; tests/hub.py), a plain fit against ``LMS(n_tensors=-1)`` (every candidate
offloaded) under the policy now (``residuals.residual_policy``: the inside of an operation's derivative computed
again) and under the policy before (everything other than the offloaded names saveable). On a CPU the offload is a
copy within host memory; the difference between the two LMS rows is the recomputation.

Each variant: a fit of 40 steps; each step's time from the end of the one before, the device waited for
(``block_until_ready``), the first 5 steps (compile) left out; the median and the spread (10th-90th percentile).
Variants alternate over --rounds rounds, each a fresh model from the same seed.

    KERAS_BACKEND=jax python benchmarks/jax_policy_cost.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    options = parser.parse_args()
    import jax
    import keras
    import numpy as np
    from jax.ad_checkpoint import Saveable

    from lms_magic import LMS
    from lms_magic.lms.jax import residuals
    from tests.hub import language_model, tokens

    now_policy = residuals.residual_policy

    def before_policy(moved=frozenset(), to=None):
        def policy(primitive, *_, **params):
            return to if primitive.name == "name" and params.get("name") in moved else Saveable
        return policy

    class Timer(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.ends = [time.perf_counter()]

        def on_train_batch_end(self, batch, logs=None):
            jax.block_until_ready([v.value for v in self.model.trainable_variables])
            self.ends.append(time.perf_counter())

    x, y = tokens("gpt2", n=8 * options.steps, sequence=128)
    times: dict[str, list[float]] = {"plain": [], "LMS, the policy now": [], "LMS, the policy before": []}
    for _ in range(options.rounds):
        for name in times:
            residuals.residual_policy = before_policy if name.endswith("before") else now_policy
            model = language_model("gpt2", layers=4, hidden=128, sequence=128)
            timer = Timer()
            callbacks = [timer] if name == "plain" else [LMS(n_tensors=-1, verbose=0), timer]
            model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
            times[name].extend(np.diff(timer.ends)[5:])
    residuals.residual_policy = now_policy
    plain = np.median(times["plain"])
    print(f"GPT-2, 4 layers, hidden 128, sequence 128, batch 8, {options.rounds} rounds x {options.steps - 5} steps, "
          f"JAX {jax.__version__} on {jax.devices()[0].device_kind}")
    for name, seconds in times.items():
        low, median, high = np.percentile(seconds, [10, 50, 90])
        print(f"  {name:>24}: {median * 1e3:6.1f} ms a step (10-90%: {low * 1e3:.1f}-{high * 1e3:.1f}), "
              f"{median / plain:.2f}x plain")


if __name__ == "__main__":
    main()
