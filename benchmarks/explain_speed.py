"""How long ``explain_fit`` takes (predictions only, nothing trained), on the backend ``KERAS_BACKEND`` names.

keras.applications' ResNet50 at 224x224 (no weights downloaded), SGD with momentum, against a 16 GiB device: the
explanation at ``--batch``, the largest batch each way of training fits, and, with ``--largest``, the frontier at
every ``--step`` from ``--step`` to ``--largest`` (``--largest 0``: no frontier, what an out-of-memory error says).
``--model gpt2`` or ``bert``: a KerasHub backbone from a config (tests/hub.py: ``--layers``, ``--hidden``, ``--size``
tokens, AdamW) instead. Each of ``--runs`` runs is a fresh process; printed per run: the wall time and the account,
then the figure (the median and min-max of the runs).

    python benchmarks/explain_speed.py --batch 64 --step 64 --largest 1024            # ResNet-50's frontier
    python benchmarks/explain_speed.py --batch 256 --largest 0                         # its out-of-memory account
    python benchmarks/explain_speed.py --model gpt2 --size 512 --batch 8 --step 8 --largest 128
    KERAS_BACKEND=torch python benchmarks/explain_speed.py --batch 64 --step 64 --largest 1024
    KERAS_BACKEND=jax python benchmarks/explain_speed.py --batch 256 --largest 0
"""

import argparse
import json
import os
import subprocess
import sys
import time

from common import CODE, child_env, report, runs_figure


def one_run(args) -> float:
    """One explanation in this process: its seconds (the account printed)."""
    sys.path.insert(0, str(CODE))
    import keras
    import numpy as np

    import lms_magic

    keras.utils.set_random_seed(0)
    if args.model in ("gpt2", "bert"):
        from tests.hub import language_model, tokens

        model = language_model(args.model, layers=args.layers, hidden=args.hidden, sequence=args.size)
        data = tokens(args.model, n=2, sequence=args.size)
    else:
        model = getattr(keras.applications, args.model)(weights=None, input_shape=(args.size, args.size, 3))
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
        data = (np.zeros((2, args.size, args.size, 3), "float32"), np.zeros(2, "int32"))
    sizes = list(range(args.step, args.largest + 1, args.step)) if args.largest else []
    # PyTorch's predictor predicts swaps alone (recompute and lean_ops are not predicted there)
    modes = ("without LMS", "LMS") if keras.backend.backend() == "torch" else None
    started = time.perf_counter()
    found = lms_magic.explain_fit(model, data, batch_size=args.batch, capacity=args.capacity, batch_sizes=sizes,
                                  modes=modes)
    seconds = time.perf_counter() - started
    print(found, file=sys.stderr)
    return seconds


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
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args)))
        return
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    times = []
    for run in range(args.runs):
        done = subprocess.run([sys.executable, __file__, "--one", *sys.argv[1:]], capture_output=True, text=True,
                              env=child_env())
        if done.returncode:
            raise RuntimeError(done.stderr[-3000:])
        times.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"run {run + 1}: {times[-1]:.1f} s\n{done.stderr.strip()}", flush=True)
    shape = f"{args.layers} layers, hidden {args.hidden}, {args.size} tokens" if args.model in ("gpt2", "bert") \
        else f"{args.size}x{args.size}"
    what = (f"a frontier of {len(range(args.step, args.largest + 1, args.step))} batch sizes" if args.largest
            else "the out-of-memory account (no frontier)")
    report([runs_figure(f"explain_fit on {backend}, {args.model} {shape}, batch {args.batch}, {what}", times, "s")])


if __name__ == "__main__":
    main()
