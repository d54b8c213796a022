"""What the backward pass keeps on the device with every LMS candidate offloaded, on Keras's JAX backend: the
residuals of the checkpointed step (``jax``'s own ``saved_residuals``, the values the forward pass hands to the
backward pass, with their memory kinds), not a prediction. Under the policy LMS used before (every value other
than the offloaded names saveable) and under ``residuals.residual_policy`` (what it uses now).

KerasHub's GPT-2 and BERT from a config (tests/hub.py: 4 layers, 4 heads, hidden 128, sequence 128, batch 8,
AdamW), as issue 38's table. The arguments (variables, batch) are left out: they are on the device anyway.

    KERAS_BACKEND=jax python benchmarks/jax_residuals.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import jax
    from jax._src.ad_checkpoint import saved_residuals  # public only as print_saved_residuals
    from jax.ad_checkpoint import Offloadable, Saveable

    from lms_magic.lms.jax.predict import _nbytes
    from lms_magic.lms.jax.residuals import named_residuals, residual_policy
    from lms_magic.lms.jax.predictor import JaxStepPredictor
    from tests.hub import language_model, tokens

    offload = Offloadable(src="device", dst="pinned_host")
    for kind in ("gpt2", "bert"):
        model = language_model(kind, layers=4, hidden=128, sequence=128)
        x, y = tokens(kind, n=8, sequence=128)
        predictor = JaxStepPredictor(model, (jax.tree_util.tree_map(lambda a: a[:2], x), y[:2]))
        inner, args = predictor._inner_and_args(8)
        step = predictor.trace(8)
        moved = frozenset(c.tensor for c in predictor.eligible(1, 8))

        def before(primitive, *_, **params):  # LMS's policy before residual_policy
            return offload if primitive.name == "name" and params.get("name") in moved else Saveable

        print(f"{kind}: {len(step.candidates)} candidates, {len(moved)} eligible (min_bytes), all of them offloaded")
        for label, policy in (("nothing moved", residual_policy()), ("before", before),
                              ("now", residual_policy(moved, offload))):
            kept = saved_residuals(jax.checkpoint(named_residuals(inner), policy=policy), *args)
            device = sum(_nbytes(a) for a, why in kept if "argument" not in why and "<host>" not in str(a))
            host = sum(_nbytes(a) for a, why in kept if "<host>" in str(a))
            print(f"  {label:>13}: kept on the device {device / 2**20:6.1f} MiB, on the host {host / 2**20:6.1f} MiB")
        print(f"  the replay's peak: without {step.transient_peak([]) / 2**20:.1f} MiB, with every eligible "
              f"offloaded {step.transient_peak(list(predictor.eligible(1, 8))) / 2**20:.1f} MiB (the step's own "
              f"bytes, no weights)", flush=True)


if __name__ == "__main__":
    main()
