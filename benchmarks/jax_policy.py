"""LMS's checkpoint policy on Keras's JAX backend, on this machine: what the backward pass keeps on the device with
every candidate offloaded, and what the step costs, under the policy now (``residuals.residual_policy``: the named
values saved or moved, anything else computed again) and the policy before (everything other than the offloaded
names saveable).

Kept: the residuals of the checkpointed step as JAX lists them (``saved_residuals``, with their memory kinds), the
variables and the batch left out: not a prediction. Step time (``--rounds`` > 0): a plain fit against
``LMS(n_tensors=-1, min_bytes=0)`` under each policy, each a fresh model from the same seed, 40 steps a fit, each
step's time from the end of the one before with the device waited for, the first 5 left out; the median and the
10th-90th percentile. On a CPU the offload is a copy within host memory.

Models: KerasHub's GPT-2 or BERT from a config (tests/hub.py: 4 layers, 4 heads, hidden 128, sequence 128, batch
8, AdamW), or two stacked LSTMs (128 units, 64 steps of 32 features, batch 32, Adam): a loop's insides are not
names, so the policy now runs the loop again in the backward pass.

    KERAS_BACKEND=jax python benchmarks/jax_policy.py --model gpt2 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _build(kind: str, steps: int):
    """A compiled model, its sample (two rows), its data for ``steps`` steps and its batch size."""
    import keras
    import numpy as np

    if kind == "lstm":
        keras.utils.set_random_seed(2)
        inputs = keras.Input((64, 32))
        hidden = keras.layers.LSTM(128, return_sequences=True)(inputs)
        model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.LSTM(128)(hidden)))
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(32 * steps, 64, 32)).astype("float32"), rng.integers(0, 10, 32 * steps)
        return model, (x[:2], y[:2]), (x, y), 32
    from tests.hub import language_model, tokens

    x, y = tokens(kind, n=8 * steps, sequence=128)
    sample = ({key: value[:2] for key, value in x.items()}, y[:2])
    return language_model(kind, layers=4, hidden=128, sequence=128), sample, (x, y), 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2", choices=["gpt2", "bert", "lstm"])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of timed fits (0: the residuals alone)")
    options = parser.parse_args()
    import jax
    import keras
    import numpy as np
    from jax._src.ad_checkpoint import saved_residuals  # public only as print_saved_residuals
    from jax.ad_checkpoint import Offloadable, Saveable

    from lms_magic import LMS
    from lms_magic.lms.jax import residuals
    from lms_magic.lms.jax.traced import _nbytes
    from lms_magic.lms.jax.predictor import JaxStepPredictor

    now = residuals.residual_policy

    def before(moved=frozenset(), to=None):
        def policy(primitive, *_, **params):
            return to if primitive.name == "name" and params.get("name") in moved else Saveable
        return policy

    steps = 40
    model, sample, (x, y), batch = _build(options.model, steps)
    predictor = JaxStepPredictor(model, sample)
    inner, args = predictor._inner_and_args(batch)
    moved = frozenset(c.tensor for c in predictor.trace(batch).candidates)
    offload = Offloadable(src="device", dst="pinned_host")
    print(f"{options.model}, batch {batch}, JAX {jax.__version__} on {jax.devices()[0].device_kind}: {len(moved)} "
          f"candidates, all offloaded")
    for label, policy in (("nothing moved", now()), ("now", now(moved, offload)), ("before", before(moved, offload))):
        kept = saved_residuals(jax.checkpoint(residuals.named_residuals(inner), policy=policy), *args)
        device = sum(_nbytes(a) for a, why in kept if "argument" not in why and "<host>" not in str(a))
        host = sum(_nbytes(a) for a, why in kept if "<host>" in str(a))
        print(f"  {label:>13}: kept on the device {device / 2**20:6.2f} MiB, on the host {host / 2**20:6.2f} MiB")
    if options.rounds <= 0:
        return

    class Timer(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.ends = [time.perf_counter()]

        def on_train_batch_end(self, batch, logs=None):
            jax.block_until_ready([v.value for v in self.model.trainable_variables])
            self.ends.append(time.perf_counter())

    times: dict[str, list[float]] = {"plain": [], "LMS, the policy now": [], "LMS, the policy before": []}
    for _ in range(options.rounds):
        for name in times:
            residuals.residual_policy = before if name.endswith("before") else now
            model, timer = _build(options.model, steps)[0], Timer()
            callbacks = [timer] if name == "plain" else [LMS(n_tensors=-1, min_bytes=0, verbose=0), timer]
            model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
            times[name].extend(np.diff(timer.ends)[5:])
    residuals.residual_policy = now
    plain = np.median(times["plain"])
    print(f"  step time, {options.rounds} rounds of {steps - 5} steps:")
    for name, seconds in times.items():
        low, median, high = np.percentile(seconds, [10, 50, 90])
        print(f"  {name:>24}: {median * 1e3:6.1f} ms a step (10-90%: {low * 1e3:.1f}-{high * 1e3:.1f}), "
              f"{median / plain:.2f}x plain")


if __name__ == "__main__":
    main()
