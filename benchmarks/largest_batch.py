"""The largest batch each way of training fits, as ``explain_fit`` predicts it (no GPU, nothing trained), and, on
lms_demo's simulated device, the prediction against fits that confirm it.

1. keras.applications models at ``--size`` (224), SGD with momentum, 1000 classes, against ``--capacity`` (16 GiB):
   ``explain_fit``'s largest batch without LMS, with LMS's default plan, with ``recompute="only"`` and with
   ``lean_ops`` (LMS plans to fill 80% of the device), and each over the largest without LMS.
2. ``--confirm``: the lms_demo CNN (8 Conv2D of 16 filters, 128x128 images, SGD) on the two logical CPUs, `/CPU:0`
   the accelerator with a capacity of ``--memory`` (64 MiB): ``explain_fit``'s largest batch without LMS, and the
   largest batch whose fit, in a fresh process, keeps TensorFlow's allocator on `/CPU:0` within the same usable
   bytes (the weights and optimizer state, plus the last of three steps' peak over what was allocated before it),
   found by checking batches outward from the prediction. On the split CPU both logical devices share one
   allocator (a tensor on `/CPU:1` counts in `/CPU:0`'s figures), so the LMS fits are not confirmed there.
3. ``--batch-size-max``: ``%%lms_fit --batch-size max`` over one epoch of the same CNN on 2048 images, on
   ``--memory``: the whole cell (choose, confirm, train) against the same fit at the batch it chose, with the same
   LMS options, alone; each cell in a fresh IPython process (the cell's time), alternately, the ratio per pair.

    python benchmarks/largest_batch.py --models ResNet50 DenseNet121
    python benchmarks/largest_batch.py --confirm
    python benchmarks/largest_batch.py --batch-size-max
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time

from common import CODE, ROOT, Figure, child_env, ratio_figure, report, runs_figure

SIZE, DEMO_BATCH = 128, 8


def _model():
    import keras

    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((SIZE, SIZE, 3))]
                             + [keras.layers.Conv2D(16, 3, padding="same", activation="relu") for _ in range(8)]
                             + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data(batch: int, steps: int):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.random((batch * steps, SIZE, SIZE, 3), dtype="float32"), rng.integers(0, 10, batch * steps)


def _measure_here(batch: int, memory: str, lms: bool) -> dict:
    """Three steps at ``batch``; the allocator's peak of the last over what was allocated before it."""
    import keras
    import tensorflow as tf

    import lms_magic

    lms_magic.simulate_accelerator(memory=memory)
    model = _model()

    class LastStepPeak(keras.callbacks.Callback):
        def on_train_batch_begin(self, index, logs=None):
            if index == 2:
                tf.config.experimental.reset_memory_stats("CPU:0")
                self.before = tf.config.experimental.get_memory_info("CPU:0")["current"]

        def on_train_batch_end(self, index, logs=None):
            if index == 2:
                self.peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - self.before

    record = LastStepPeak()
    callbacks = [record] + ([lms_magic.LMS(verbose=0)] if lms else [])
    model.fit(*_data(batch, 3), batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
    from lms_magic.lms.persistent import persistent_tensors

    persistent = sum(tensor.nbytes for tensor in persistent_tensors(model))
    return {"peak_bytes": persistent + record.peak}


def measured(batch: int, memory: str, lms: bool) -> int:
    # oneDNN on: its CPU allocator keeps the statistics that get_memory_info reads
    env = child_env(TF_ENABLE_ONEDNN_OPTS="1")
    done = subprocess.run([sys.executable, __file__, "--child", str(batch), "--memory", memory]
                          + (["--lms"] if lms else []), cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=1200)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"]


def confirmed(predicted: int, usable: int, memory: str, lms: bool) -> tuple[int, dict]:
    """The largest batch whose measured peak is within ``usable``, searched outward from ``predicted``."""
    seen: dict[int, int] = {}

    def fits(batch: int) -> bool:
        if batch not in seen:
            seen[batch] = measured(batch, memory, lms)
            print(f"    {'LMS' if lms else 'plain'} batch {batch}: measured {seen[batch] / 2**20:.1f} MiB "
                  f"({'within' if seen[batch] <= usable else 'above'} {usable / 2**20:.1f})", flush=True)
        return seen[batch] <= usable

    batch = max(predicted, 1)
    if fits(batch):
        while fits(batch + 1):
            batch += 1
        return batch, seen
    while batch > 1 and not fits(batch - 1):
        batch -= 1
    return batch - 1, seen



def by_prediction(names: list[str], size: int, batch: int, capacity: str) -> list[Figure]:
    import keras
    import numpy as np

    import lms_magic

    figures = []
    for name in names:
        keras.utils.set_random_seed(0)
        model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=1000,
                                                  classifier_activation=None)
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        data = (np.zeros((2, size, size, 3), "float32"), np.zeros(2, "int32"))
        found = lms_magic.explain_fit(model, data, batch_size=batch, capacity=capacity)
        print(found, flush=True)
        plain = found.modes[0].largest_batch or 0
        for mode in found.modes:
            if mode.largest_batch is None:
                continue
            times = "" if not mode.magic else f" ({mode.largest_batch / max(plain, 1):.1f}x without)"
            figures.append(Figure(f"largest batch in {capacity}, {name} {size}x{size}, {mode.mode}{times}",
                                  "explain_fit's prediction (TensorFlow)", mode.largest_batch, "batch"))
    return figures


def confirmed_on_the_demo(memory: str) -> list[Figure]:
    import lms_magic

    lms_magic.simulate_accelerator(memory=memory)
    found = lms_magic.explain_fit(_model(), _data(DEMO_BATCH, 1), batch_size=DEMO_BATCH, modes=("without LMS",),
                                  confirm=False)  # the replay alone (closed_loop.py: corrected and confirmed)
    print(found, flush=True)
    predicted = found.modes[0].largest_batch
    largest, _ = confirmed(predicted, found.usable_bytes, memory, lms=False)
    what = f"largest batch without LMS, lms_demo's CNN on a simulated {memory} device"
    return [Figure(what + ", predicted", "explain_fit", predicted, "batch"),
            Figure(what + ", confirmed", "the largest whose fit stays within the usable bytes (fresh processes)",
                   largest, "batch")]


PAIRS, SAMPLES = 3, 2048


def _cell(line: str, batch: int | None, memory: str) -> dict:
    """``%%lms_fit`` ``line`` over one epoch's fit of the CNN (at ``batch`` where given) in a fresh IPython: its
    time, its steps, and the batch and LMS options ``--batch-size max`` chose (from what it printed)."""
    import contextlib
    import io

    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "lms_magic")
    shell.user_ns.update(model_of=_model, data_of=_data)
    assert shell.run_cell(f"import lms_magic\nlms_magic.simulate_accelerator(memory={memory!r})\n"
                          f"model = model_of()\nx, y = data_of({SAMPLES}, 1)").success
    batch_size = "" if batch is None else f", batch_size={batch}"
    printed = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(printed):
        result = shell.run_cell(f"%%lms_fit {line}\nh = model.fit(x, y, epochs=1, verbose=0{batch_size})")
    seconds = time.perf_counter() - started
    assert result.success, result.error_in_exec
    said = re.search(r"--batch-size max: batch (\d+), (with `%%lms_fit(?P<options>[^`]*)`|without LMS)",
                     printed.getvalue())
    chosen = None if not said else (int(said.group(1)), (said.group("options") or "").strip()
                                    if said.group(2).startswith("with") else "--n-tensors 0")
    print(printed.getvalue()[:3000])
    return {"seconds": seconds, "steps": shell.user_ns["h"].params["steps"], "chosen": chosen}


def _cell_child(line: str, memory: str, batch: int | None = None) -> dict:
    done = subprocess.run([sys.executable, __file__, f"--cell={line}", "--memory", memory]
                          + (["--child", str(batch)] if batch else []), capture_output=True, text=True,
                          timeout=900, env=child_env(), cwd=ROOT)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    print(done.stdout[-3000:], flush=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def batch_size_max(memory: str) -> list[Figure]:
    chosen, whole, alone, ratios = [], [], [], []
    for _ in range(PAIRS):  # each pair at the batch its own cell chose (LMS's measured steps differ by process)
        found = _cell_child("--batch-size max", memory)
        chosen.append(found["chosen"])
        fixed = _cell_child(found["chosen"][1], memory, found["chosen"][0])
        assert fixed["steps"] == found["steps"]  # the same fit
        whole.append(found["seconds"])
        alone.append(fixed["seconds"])
        ratios.append(found["seconds"] / fixed["seconds"])
    what = "; ".join(f"batch {batch}, %%lms_fit {options}".rstrip() for batch, options in chosen)
    return [runs_figure(f"%%lms_fit --batch-size max, the whole cell (lms_demo's CNN, {memory})", whole, "s"),
            runs_figure(f"the same fit alone ({what})", alone, "s"),
            ratio_figure("--batch-size max over the fit at its batch alone", ratios, goal="under 2")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["ResNet50", "DenseNet121"])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--capacity", default="16GiB")
    parser.add_argument("--confirm", action="store_true")
    parser.add_argument("--memory", default="64MiB")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--lms", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size-max", action="store_true")
    parser.add_argument("--cell", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell is not None:
        print(json.dumps(_cell(args.cell, args.child, args.memory)))
        return
    if args.batch_size_max:
        sys.path.insert(0, str(CODE))
        report(batch_size_max(args.memory))
        return
    if args.child:
        print(json.dumps(_measure_here(args.child, args.memory, args.lms)))
        return
    sys.path.insert(0, str(CODE))
    report(confirmed_on_the_demo(args.memory) if args.confirm else
           by_prediction(args.models, args.size, args.batch, args.capacity))


if __name__ == "__main__":
    main()
