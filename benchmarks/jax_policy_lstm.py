"""LMS's checkpoint policy on JAX for a step with loops, on this CPU: two stacked LSTMs (128 units, 64 steps of 32
features, batch 32, Adam), every candidate offloaded (``LMS(n_tensors=-1, min_bytes=0)``). A loop's insides are
not names: under the policy now (``residuals.residual_policy``) they are computed again in the backward pass,
under the policy before (everything other than the offloaded names saveable) they were kept on the device.

Printed: the residuals the backward pass keeps on the device and on the host (JAX's own ``saved_residuals``, the
variables and the batch left out), and the step time against a plain fit (5 rounds of 35 timed steps, the first 5
of each fit left out, the device waited for each step; the median and the 10th-90th percentile).

    KERAS_BACKEND=jax python benchmarks/jax_policy_lstm.py
"""

from __future__ import annotations

import os
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> None:
    import jax
    import keras
    import numpy as np
    from jax._src.ad_checkpoint import saved_residuals  # public only as print_saved_residuals
    from jax.ad_checkpoint import Offloadable, Saveable

    from lms_magic import LMS
    from lms_magic.lms.jax import residuals
    from lms_magic.lms.jax.predict import _nbytes
    from lms_magic.lms.jax.predictor import JaxStepPredictor

    now = residuals.residual_policy

    def before(moved=frozenset(), to=None):
        def policy(primitive, *_, **params):
            return to if primitive.name == "name" and params.get("name") in moved else Saveable
        return policy

    def build():
        keras.utils.set_random_seed(2)
        inputs = keras.Input((64, 32))
        hidden = keras.layers.LSTM(128, return_sequences=True)(inputs)
        hidden = keras.layers.LSTM(128)(hidden)
        model = keras.Model(inputs, keras.layers.Dense(10)(hidden))
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    predictor = JaxStepPredictor(build(), (np.zeros((2, 64, 32), "float32"), np.zeros((2,), "int64")))
    inner, args = predictor._inner_and_args(32)
    moved = frozenset(c.tensor for c in predictor.trace(32).candidates)
    offload = Offloadable(src="device", dst="pinned_host")
    print(f"two LSTMs (128 units), 64 steps, batch 32: {len(moved)} candidates, all offloaded")
    for label, policy in (("nothing moved", now()), ("now", now(moved, offload)), ("before", before(moved, offload))):
        kept = saved_residuals(jax.checkpoint(residuals.named_residuals(inner), policy=policy), *args)
        device = sum(_nbytes(a) for a, why in kept if "argument" not in why and "<host>" not in str(a))
        host = sum(_nbytes(a) for a, why in kept if "<host>" in str(a))
        print(f"  {label:>13}: kept on the device {device / 2**20:6.2f} MiB, on the host {host / 2**20:6.2f} MiB")

    class Timer(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.ends = [time.perf_counter()]

        def on_train_batch_end(self, batch, logs=None):
            jax.block_until_ready([v.value for v in self.model.trainable_variables])
            self.ends.append(time.perf_counter())

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32 * 40, 64, 32)).astype("float32"), rng.integers(0, 10, 32 * 40)
    times: dict[str, list[float]] = {"plain": [], "LMS, the policy now": [], "LMS, the policy before": []}
    for _ in range(5):
        for name in times:
            residuals.residual_policy = before if name.endswith("before") else now
            model, timer = build(), Timer()
            callbacks = [timer] if name == "plain" else [LMS(n_tensors=-1, min_bytes=0, verbose=0), timer]
            model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
            times[name].extend(np.diff(timer.ends)[5:])
    residuals.residual_policy = now
    plain = np.median(times["plain"])
    for name, seconds in times.items():
        low, median, high = np.percentile(seconds, [10, 50, 90])
        print(f"  {name:>24}: {median * 1e3:6.1f} ms a step (10-90%: {low * 1e3:.1f}-{high * 1e3:.1f}), "
              f"{median / plain:.2f}x plain")


if __name__ == "__main__":
    main()
