"""XLA's compiled figure for ResNet-50's loss and gradient on JAX's default device, at several batches: the
function the replay traces and LMS runs with nothing moved ("checkpointed": ``residuals.differentiated``; until
2026-11-26 every residual saveable under its ``jax.checkpoint``, since then every named value saved and the rest
computed again) and ``inner``'s own ``jax.value_and_grad`` (what ``lms/jax/compiled.py`` compiles). Compiles
only: nothing is allocated for a step.

    KERAS_BACKEND=jax python benchmarks/gpu/jax_compiled_check.py --size 224 120 242 384
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--plain-only", action="store_true", help="inner's own value and gradient alone")
    parser.add_argument("batches", type=int, nargs="+")
    options = parser.parse_args()
    import jax
    import keras
    import numpy as np

    from lms_magic.lms.jax.residuals import differentiated
    from lms_magic.lms.jax.predictor import JaxStepPredictor

    size = options.size
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=1000)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sample = (np.zeros((2, size, size, 3), "float32"), np.zeros((2,), "int64"))
    predictor = JaxStepPredictor(model, sample)
    print("device:", jax.devices()[0].device_kind, flush=True)
    for batch in options.batches:
        inner, args = predictor.step_function(batch)
        checkpointed, specs = differentiated(inner, args)
        functions = (("checkpointed", checkpointed), ("plain", jax.value_and_grad(inner, has_aux=True)))
        for name, function in functions[1:] if options.plain_only else functions:
            started = time.perf_counter()
            analysis = jax.jit(function).lower(*specs).compile().memory_analysis()
            figures = {key: getattr(analysis, f"{key}_size_in_bytes") for key in ("argument", "output", "temp", "alias")}
            total = figures["argument"] + figures["output"] + figures["temp"] - figures["alias"]
            print(json.dumps(dict(batch=batch, function=name, total_gib=round(total / 2**30, 3), **figures,
                                  seconds=round(time.perf_counter() - started, 1))), flush=True)


if __name__ == "__main__":
    main()
