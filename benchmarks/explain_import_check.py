"""Whether a batch size sized by TensorFlow's shape inference (``batch_import``, what ``explain_fit`` reads batch
sizes off) predicts what a trace at that batch size does.

For each model, two predictors: one as ``explain_fit`` makes it (``rescale_batches`` from the start: traced once at
a prime from 64 up, batch 64 imported from it, the others read off those two), one tracing every batch size.
Compared at batch sizes 64, 1, 7, 100 and 333: the predicted peak with nothing and with every candidate moved, LMS's
plan for a device of 90% of the plain peak, the candidates' names and the FLOP estimate. Printed per model: the
batch traced, whether the import was refused (then traced), the predictions compared and those that differ.
``--lean-ops``: both predictors with ``lean_ops``, the one read off made as ``explain_fit`` makes it after the step
without (sized by the same rule where that step was imported: ``TensorFlowStepPredictor.sized_like``).

    python benchmarks/explain_import_check.py
    python benchmarks/explain_import_check.py --lean-ops --models ResNet50 DenseNet121 MobileNetV2 EfficientNetB0
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BATCHES = (64, 1, 7, 100, 333)


def models(names):
    import keras
    import numpy as np

    def application(name, size):
        def build():
            keras.utils.set_random_seed(1)
            model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3))
            model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
            return model, (np.zeros((2, size, size, 3), "float32"), np.zeros(2, "int32"))
        return build

    def hub(kind):
        def build():
            from tests.hub import language_model, tokens

            x, y = tokens(kind, n=2, sequence=64)
            return language_model(kind, sequence=64), (x, y)
        return build

    def lstm():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((20, 16)), keras.layers.LSTM(32, return_sequences=True),
                                  keras.layers.Flatten(), keras.layers.Dense(3)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model, (np.zeros((2, 20, 16), "float32"), np.zeros(2, "int32"))

    made = {"ResNet50": application("ResNet50", 224), "DenseNet121": application("DenseNet121", 64),
            "MobileNetV2": application("MobileNetV2", 96), "EfficientNetB0": application("EfficientNetB0", 64),
            "GPT-2": hub("gpt2"), "BERT": hub("bert"), "LSTM": lstm}
    return {name: made[name] for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ResNet50", "DenseNet121", "MobileNetV2", "EfficientNetB0",
                                                        "GPT-2", "BERT", "LSTM"])
    parser.add_argument("--lean-ops", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from lms_magic.lms.core.plan import Selection
    from lms_magic.lms.tensorflow.predictor import TensorFlowStepPredictor
    from lms_magic.lms.tensorflow.rewrite import Rescaled

    for name, build in models(args.models).items():
        model, sample = build()
        exact, read_off = (TensorFlowStepPredictor(model, sample, Selection(min_bytes=0), lean_ops=args.lean_ops)
                           for _ in range(2))
        read_off.rescale_batches = True
        how = "imported"
        if args.lean_ops:
            without = TensorFlowStepPredictor(model, sample, Selection(min_bytes=0))
            without.rescale_batches = True
            without.eligible(1, BATCHES[0])
            read_off.sized_like(without)
            if isinstance(without.trace(BATCHES[0]).batch_size, Rescaled):
                how = "sized as the step without lean_ops was"
        started = time.perf_counter()
        read_off.eligible(1, BATCHES[0])
        first_s = time.perf_counter() - started
        imported = isinstance(read_off.trace(BATCHES[0]).batch_size, Rescaled)
        compared, differ = 0, []
        for batch in BATCHES:
            plain = exact.predict(0, 1, batch)
            capacity = int(plain.peak_bytes * 0.9)
            pairs = {"nothing moved": (plain, read_off.predict(0, 1, batch)),
                     "all moved": (exact.predict(-1, 1, batch), read_off.predict(-1, 1, batch)),
                     "plan": (exact.planned(1, batch, capacity), read_off.planned(1, batch, capacity)),
                     "candidates": (exact.eligible(1, batch), read_off.eligible(1, batch)),
                     "FLOPs": (round(exact.estimated_compute_s(batch, "/CPU:0"), 12),
                               round(read_off.estimated_compute_s(batch, "/CPU:0"), 12))}
            for what, (expected, got) in pairs.items():
                compared += 1
                if expected != got:
                    differ.append(f"{what} at {batch}")
        print(f"{name}: traced at {read_off._traced[0]}, batch {BATCHES[0]} "
              f"{how if imported else 'traced (the import refused)'} ({first_s:.1f} s for both); "
              f"{compared} predictions compared, {len(differ)} differ {differ[:4]}", flush=True)


if __name__ == "__main__":
    main()
