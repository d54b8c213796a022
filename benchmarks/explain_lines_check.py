"""Whether a batch size's peak read off two replays (``core/batch_lines.py``) equals a replay at that batch size.

keras.applications models, no weights, SGD with momentum; two predictors of one model, each tracing batch 64 and
156 (as ``explain_fit``'s first two traces): one reads every batch size's peaks off lines, the other replays
them. Compared: the predicted peak with 0, 1, a third, half, all but one and all candidates moved, at 9 batch
sizes (the two traced among them). Printed per model: whether its peaks are read off lines (every tensor linear
in the batch; else both replay; where the two traces differ, each batch size is traced), the count compared and
differing, and the seconds each took (base replays included). ``gpt2:N`` or ``bert:N``: a KerasHub backbone from a
config (tests/hub.py, 4 layers, hidden 256, N tokens, AdamW); ``--min-bytes``: the candidates' size filter (LMS's
default is 64 KiB: then more tensors are eligible at larger batch sizes than at the two traced).

    python benchmarks/explain_lines_check.py --models ResNet50:224 DenseNet121:64 MobileNetV2:96 EfficientNetB0:64
    python benchmarks/explain_lines_check.py --models gpt2:256 bert:256 MobileNetV2:96 --min-bytes 65536
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ResNet50:224", "DenseNet121:64", "MobileNetV2:96",
                                                        "EfficientNetB0:64"])
    parser.add_argument("--min-bytes", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    import keras
    import numpy as np

    from lms_magic.lms.core.plan import Selection
    from lms_magic.lms.tensorflow.predictor import TensorFlowStepPredictor

    for spec in args.models:
        name, size = spec.split(":")
        size = int(size)
        if name in ("gpt2", "bert"):
            from tests.hub import language_model, tokens

            model, data = language_model(name, layers=4, hidden=256, sequence=size), tokens(name, n=2, sequence=size)
        else:
            model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3))
            model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
            data = (np.zeros((2, size, size, 3), "float32"), np.zeros(2, "int32"))

        def made():
            predictor = TensorFlowStepPredictor(model, data, Selection(min_bytes=args.min_bytes))
            predictor.rescale_batches = True
            predictor.trace(64)
            predictor.trace(156)
            return predictor

        lined, replayed = made(), made()
        replayed._live_lines = lambda *args: None  # every batch size replayed
        compared = differ = 0
        lines_s = replays_s = 0.0
        for batch in (1, 7, 64, 100, 156, 200, 333, 512, 1024):  # 64 and 156: the traces themselves
            count = len(lined.eligible(1, batch))
            replayed.eligible(1, batch)  # the candidates found apart from the timings, for both
            for moved in sorted({0, 1, count // 3, count // 2, count - 1, count}):
                started = time.perf_counter()
                got = lined.transient_peak(1, batch, moved)
                lines_s += time.perf_counter() - started
                started = time.perf_counter()
                expected = replayed.transient_peak(1, batch, moved)
                replays_s += time.perf_counter() - started
                compared += 1
                if got != expected:
                    differ += 1
                    print(f"  differs: batch {batch}, {moved} moved: {got} against {expected}")
        how = ("the two traces differ (every batch size traced)" if lined._rescale_source() is None else
               f"peaks read off lines: {lined._coincidences is not None}")
        shape = f"{size} tokens" if name in ("gpt2", "bert") else f"{size}x{size}"
        print(f"{name} {shape}, min_bytes {args.min_bytes}: {how}; {compared} predictions compared, "
              f"{differ} differ; read off lines {lines_s:.1f} s, replayed {replays_s:.1f} s", flush=True)


if __name__ == "__main__":
    main()
