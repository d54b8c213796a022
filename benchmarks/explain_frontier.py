"""How long ``explain_fit`` takes for a frontier over many batch sizes (predictions only, nothing trained).

keras.applications' ResNet50 at 224x224 (no weights downloaded), SGD with momentum, against a 16 GiB device: the
explanation at ``--batch``, the largest batch each way of training fits, and the frontier at every ``--step``
from ``--step`` to ``--largest``. Printed: the wall time, the traces made, and the frontier's largest batch at 90%
of plain speed. ``--model gpt2`` or ``bert``: a KerasHub backbone from a config (tests/hub.py: ``--layers``,
``--hidden``, ``--size`` tokens, AdamW) instead.

    python benchmarks/explain_frontier.py --batch 64 --step 64 --largest 1024
    python benchmarks/explain_frontier.py --batch 256 --largest 0   # no frontier: what an out-of-memory error says
    python benchmarks/explain_frontier.py --model gpt2 --layers 12 --hidden 768 --size 512 --batch 8 --step 8 --largest 128
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ResNet50")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step", type=int, default=64)
    parser.add_argument("--largest", type=int, default=1024)
    parser.add_argument("--capacity", default="16GiB")
    parser.add_argument("--layers", type=int, default=12, help="gpt2 / bert: transformer layers")
    parser.add_argument("--hidden", type=int, default=768, help="gpt2 / bert: hidden size")
    parser.add_argument("--profile", action="store_true", help="print the 30 costliest calls (cProfile)")
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    import keras
    import numpy as np
    import tensorflow as tf

    import lms_magic
    from lms_magic.lms.tensorflow.predictor import TensorFlowStepPredictor

    from lms_magic.lms.tensorflow import predictor as predictor_module

    traces, trace_s, imports = [], [], []  # the batch sizes traced and each trace's seconds; the shapes imported
    trace, dims_at = TensorFlowStepPredictor._trace, predictor_module.dims_at

    def counted(self, batch_size):
        trace(self, batch_size)
        traces.append(batch_size)
        trace_s.append(self.trace_s)

    def imported(graph, traced, batch_size):
        started = time.perf_counter()
        dims = dims_at(graph, traced, batch_size)
        imports.append((batch_size, time.perf_counter() - started, dims is not None))
        return dims

    TensorFlowStepPredictor._trace, predictor_module.dims_at = counted, imported
    keras.utils.set_random_seed(0)
    if args.model in ("gpt2", "bert"):
        from tests.hub import language_model, tokens

        model = language_model(args.model, layers=args.layers, hidden=args.hidden, sequence=args.size)
        data = tokens(args.model, n=2, sequence=args.size)
    else:
        model = getattr(keras.applications, args.model)(weights=None, input_shape=(args.size, args.size, 3))
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
        data = (np.zeros((2, args.size, args.size, 3), "float32"), np.zeros(2, "int32"))
    sizes = list(range(args.step, args.largest + 1, args.step))
    started = time.perf_counter()
    if args.profile:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.enable()
    found = lms_magic.explain_fit(model, data, batch_size=args.batch, capacity=args.capacity, batch_sizes=sizes)
    wall_s = time.perf_counter() - started
    if args.profile:
        profile.disable()
        pstats.Stats(profile).sort_stats(os.environ.get("SORT", "cumulative")).print_stats(int(os.environ.get("TOP", "30")))
    frontier = f"frontier at {len(sizes)} batch sizes {sizes[0]}..{sizes[-1]}" if sizes else "no frontier"
    shape = f"{args.layers} layers, hidden {args.hidden}, {args.size} tokens" if args.model in ("gpt2", "bert") \
        else f"{args.size}x{args.size}"
    print(f"TensorFlow {tf.__version__}, {args.model} {shape}, batch {args.batch}, capacity "
          f"{args.capacity}, {frontier} x {len(found.modes)} ways")
    print(f"explain_fit: {wall_s:.1f} s, {len(traces)} traces (at batch sizes {traces}), each "
          f"{', '.join(f'{seconds:.1f}' for seconds in trace_s)} s; shapes imported at "
          f"{', '.join(f'{batch} in {seconds:.1f} s' + ('' if ok else ' (refused)') for batch, seconds, ok in imports)}; "
          f"the others read off two")
    print(found)


if __name__ == "__main__":
    main()
