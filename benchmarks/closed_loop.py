"""explain_fit's closed loop on models the docs do not use, and on the docs' own when named, against TensorFlow's
allocator (issue 54's numbers).

On ``simulate_accelerator``'s device (oneDNN on, BFC's allocator, which counts every tensor), per model:
- the replay's and the corrected prediction of the peak without LMS over the measured one, at batch sizes other
  than the one the correcting step ran at; measured: the allocator's peak of a plain step over what the device
  held before it, the median of 3 steps in a fresh process, the median of 3 processes;
- the largest plain batch: the replay's, the corrected one, the one confirmed by steps (and the steps it took),
  and the one a bisection of real steps finds (doubling, then halving the gap) with the same meter;
- the corrected prediction over a plain fit's steps in the same process, at the same batch sizes.

On PyTorch (``KERAS_BACKEND=torch``): the prediction without LMS over PyTorch's CPU meter in a real step.

``--orders``: why a measured step can differ between processes: one plain step of the demo CNN profiled in fresh
processes, the tensors alive at its peak (the executor's two orders of the backward pass).

``--lms [MODEL ...]``: one model of the device with LMS: explain_fit's figures with LMS (its default plan, and
``recompute="only"``) at the batches above its steps did not measure, against LMS's own reading of a real fit's
checked step there, after explain_fit in the same process; 3 processes a model. The fit is a user's: LMS_FIT_STEPS
steps (its first step's choice, the plan or the probe's swaps, rests on the steps left), stopped after its third.

``--demo-story``: lms_demo's notebook at ``make demo``'s size in 3 fresh kernels: explain_fit's lines and the
dashboard's headline (the figure without LMS the same in both).

    python benchmarks/closed_loop.py                 # the five models above
    python benchmarks/closed_loop.py unet            # one
    python benchmarks/closed_loop.py resnet50 densenet121 mobilenet_v2 efficientnet_b0   # the docs' models, 128x128
    KERAS_BACKEND=torch python benchmarks/closed_loop.py
    python benchmarks/closed_loop.py --orders
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from common import CODE, Figure, child_env, fit_step_peaks, report, split_tensorflow_cpu

MODELS = {  # name: (device memory, the batch explain_fit is asked, the batches compared with fresh processes)
    "unet": ("96MiB", 32, (8, 12, 24)),
    "convnext": ("96MiB", 48, (8, 16, 32)),
    "mobilenet_v3": ("96MiB", 48, (8, 16, 32)),
    "transformer": ("48MiB", 48, (8, 16, 32)),
    "reference_cnn": ("64MiB", 48, (8, 16, 32)),
}
DEFAULT = tuple(MODELS)  # what a run with no names measures
# the models the docs use (keras.applications, 128x128, SGD with momentum, as the release check's), only when named:
# each device holds a plain batch of about 14
APPLICATIONS = {
    "resnet50": ("ResNet50", "856MiB"),
    "densenet121": ("DenseNet121", "808MiB"),
    "mobilenet_v2": ("MobileNetV2", "375MiB"),
    "efficientnet_b0": ("EfficientNetB0", "551MiB"),
}
MODELS.update({name: (memory, 32, (6, 10, 20)) for name, (_, memory) in APPLICATIONS.items()})
PROCESSES = 3


def build(name: str, n: int):
    from tests import models

    if name in APPLICATIONS:
        from tests.lms.tensorflow.fresh_peak import application

        return application(APPLICATIONS[name][0], 128, n, steps=1)
    if name == "unet":
        return models.encoder_decoder(64), models.pixel_labels(n, 64)
    if name == "convnext":
        return models.convnext_style(64), models.images(n, 64)
    if name == "mobilenet_v3":
        return models.mobilenet_v3_style(64), models.images(n, 64)
    if name == "transformer":
        return models.transformer(), models.token_ids(n)
    return models.reference_cnn((32, 32, 3)), models.images(n, 32)


def measure_here(name: str, batch: int) -> int:
    """The plain step's allocator peak over what the device held before it (median of 3 steps, fresh_peak's)."""
    from tests.lms.tensorflow.fresh_peak import plain_step_peak

    split_tensorflow_cpu()
    model, (x, y) = build(name, 2 * batch)
    return plain_step_peak(model, x, y, batch)


def measured(name: str, batch: int) -> int:
    """The median over PROCESSES fresh processes of ``measure_here``."""
    peaks = []
    for _ in range(PROCESSES):
        done = subprocess.run([sys.executable, __file__, "--measure", name, str(batch)], capture_output=True,
                              text=True, timeout=600, env=child_env(), cwd=CODE)
        if done.returncode:
            raise RuntimeError(done.stderr[-2000:])
        peaks.append(json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"])
    return int(statistics.median(peaks))


def bisection(meter, persistent: int, limit: int) -> tuple[int, int]:
    """The largest batch whose measured plain step (with the persistent bytes) stays within ``limit``, by doubling
    then halving the gap; and the batch sizes it measured."""
    def fits(batch):
        step = meter.measure(batch)
        return not step.out_of_memory and persistent + step.step_bytes <= limit

    low, high, steps = 0, 1, 0
    while fits(high):
        low, high, steps = high, high * 2, steps + 1
    steps += 1
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
        steps += 1
    return low, steps


def run(name: str) -> list[Figure]:
    import lms_magic

    memory, asked, batches = MODELS[name]
    lms_magic.simulate_accelerator(memory=memory)
    from lms_magic.sizing.measured import step_meter

    model, data = build(name, 64)
    others = tuple(batches)
    replay = lms_magic.explain_fit(model, data, batch_size=asked, modes=("without LMS",), confirm=False, min_bytes=0,
                                   batch_sizes=others)
    found = lms_magic.explain_fit(model, data, batch_size=asked, modes=("without LMS",), confirm=True, min_bytes=0,
                                  batch_sizes=others)
    correction, plain = found.correction, found.modes[0]
    print(f"{name}: {correction.words}")
    print(f"{name}: replay's largest {replay.modes[0].largest_batch}, corrected {plain.largest_batch}, "
          f"{plain.confirmed.words} in {len(plain.confirmed.tried)} batch sizes")
    predictor = plain_predictor(model, data)
    persistent = predictor.persistent_bytes
    meter, _ = step_meter(model, data, "/CPU:0")
    bisected, bisect_steps = bisection(meter, persistent, found.plain_usable_bytes)
    print(f"{name}: bisection of real steps: {bisected} in {bisect_steps} batch sizes")
    figures = [Figure(f"{name}: confirmed largest plain batch minus the bisection's", "one run", plain.confirmed.batch_size
                      - bisected, "batches", goal="within 1"),
               Figure(f"{name}: batch sizes measured to confirm (bisection: {bisect_steps})", "one run",
                      len(plain.confirmed.tried), "batch sizes")]
    replay_ratios, corrected_ratios = [], []
    # the figures a user reads: explain_fit's own at each batch (the corrected one holds each kernel's measured
    # scratch at its op, and the line's fixed part), past the weights and optimizer state
    replayed, corrected = (step_bytes(explained, persistent) for explained in (replay, found))
    for batch in (b for b in batches if b != correction.batch_size):
        real = measured(name, batch)
        replay_ratios.append(replayed[batch] / real)
        corrected_ratios.append(corrected[batch] / real)
        print(f"{name} batch {batch}: replay {replayed[batch] / 2**20:.1f} MiB, corrected "
              f"{corrected[batch] / 2**20:.1f} MiB, measured {real / 2**20:.1f} MiB (median of {PROCESSES} processes)")
    for label, ratios in (("replay", replay_ratios), ("corrected", corrected_ratios)):
        figures.append(Figure(f"{name}: {label} over measured peak without LMS, batches {batches}", "each batch",
                              round(statistics.median(ratios), 3), "x", round(min(ratios), 3), round(max(ratios), 3),
                              "min-max over the batches", "0.90-1.10"))
    return figures + [same_process(name, model, data, corrected, correction, batches)]


def step_bytes(explained, persistent: int) -> dict[int, int]:
    """``explained``'s figure without LMS at each frontier batch, past the weights and optimizer state."""
    return {point.batch_size: point.peak_bytes - persistent for point in explained.frontier
            if point.mode == "without LMS"}


def same_process(name, model, data, corrected, correction, batches) -> Figure:
    """The corrected figure over a plain ``model.fit`` in the same process (a train function of its own, the
    steps after the first): what a user's next fit there holds. TensorFlow's executor sets a process's order of
    independent ops, and with it the peak (the U-Net holds about 1.4x in some processes), so the correction is
    held to the process it was measured in."""
    import numpy as np

    ratios = []
    for batch in (b for b in batches if b != correction.batch_size):
        x, y = (np.resize(part, (4 * batch, *part.shape[1:])) for part in data)  # the samples repeated
        step = corrected[batch]
        held = fit_step_peaks(model, x, y, batch)["step_peak_bytes"]
        ratios.append(step / held)
        print(f"{name} batch {batch}: corrected {step / 2**20:.1f} MiB, a fit in this process {held / 2**20:.1f} MiB")
    return Figure(f"{name}: corrected over a fit in the same process, batches {batches}", "each batch",
                  round(statistics.median(ratios), 3), "x", round(min(ratios), 3), round(max(ratios), 3),
                  "min-max over the batches", "0.90-1.10")


def plain_predictor(model, data):
    """The step's predictor without LMS, as explain_fit's (every tensor size eligible)."""
    from lms_magic.lms.explain.predictors import StepPredictors
    from lms_magic.lms.options import LmsOptions

    return StepPredictors(model, data, LmsOptions(min_bytes=0), tuner=False).get()


def torch_meter(name: str) -> list[Figure]:
    """On PyTorch (``KERAS_BACKEND=torch``): ``explain_fit``'s step bytes without LMS (the step run at two small
    batch sizes, every other read off them) over what PyTorch's CPU meter (``lms/torch/meter.StorageMeter``) counts
    in a real train step at the same batch (after one that warms up)."""
    from lms_magic.lms.torch.meter import StorageMeter

    _, _, batches = MODELS[name]
    model, data = build(name, 2 * max(batches))
    predictor = plain_predictor(model, data)
    persistent = predictor.persistent_bytes
    ratios = []
    for batch in batches:
        x, y = data[0][:batch], data[1][:batch]
        model.train_on_batch(x, y)
        with StorageMeter() as meter:
            model.train_on_batch(x, y)
        predicted = predictor.plain_peak_bytes(batch) - persistent
        ratios.append(predicted / meter.peak_bytes)
        print(f"{name} batch {batch} (PyTorch): predicted {predicted / 2**20:.1f} MiB, its CPU meter "
              f"{meter.peak_bytes / 2**20:.1f} MiB")
    return [Figure(f"{name}: PyTorch's prediction over its CPU meter without LMS, batches {batches}", "each batch",
                   round(statistics.median(ratios), 3), "x", round(min(ratios), 3), round(max(ratios), 3),
                   "min-max over the batches", "0.90-1.10")]


def orders_probe() -> None:
    """One plain step of the demo CNN (64x64, batch 8) profiled after explain_fit's measured steps, in this process:
    explain_fit's "measured:" line, the step's peak over what the device held before it, what BFC's chunks held over
    what was asked, and the tensors alive at the peak by the op that made them."""
    import glob
    import tempfile

    import lms_magic
    lms_magic.simulate_accelerator()
    import numpy as np, keras, tensorflow as tf
    rng = np.random.default_rng(0)
    images = rng.random((32, 64, 64, 3), dtype="float32"); labels = rng.integers(0, 10, 32)
    keras.utils.set_random_seed(2)
    cnn = keras.Sequential([keras.Input((64, 64, 3))] + [keras.layers.Conv2D(16, 3, padding="same", activation="relu") for _ in range(8)]
                           + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    cnn.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # the steps explain_fit measures come first, as in the demo notebook
    sized = lms_magic.explain_fit(cnn, (images, labels), batch_size=8, capacity="1MiB", modes=("without LMS", "LMS"))
    print([line for line in str(sized).splitlines() if line.startswith("measured")][0][60:200])
    cnn.fit(images[:16], labels[:16], batch_size=8, epochs=1, verbose=0)
    logdir = tempfile.mkdtemp()
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    tf.profiler.experimental.start(logdir, options=tf.profiler.experimental.ProfilerOptions(host_tracer_level=2))
    cnn.fit(images[:8], labels[:8], batch_size=8, epochs=1, verbose=0)
    tf.profiler.experimental.stop()
    print("peak over before MiB", (tf.config.experimental.get_memory_info("CPU:0")["peak"] - before) / 2**20)
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    path = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0]
    space = xplane_pb2.XSpace(); space.ParseFromString(open(path, "rb").read())
    best = None
    rows = []
    timeline = []
    for plane in space.planes:
        kinds = {k: v.name for k, v in plane.event_metadata.items() if v.name in ("MemoryAllocation", "MemoryDeallocation")}
        names = {v.name: k for k, v in plane.stat_metadata.items()}
        want = {names.get(n): n for n in ("requested_bytes", "allocation_bytes", "bytes_allocated", "allocator_name", "fragmentation", "peak_bytes_in_use", "tf_op", "addr")}
        for line in plane.lines:
            for e in line.events:
                if e.metadata_id not in kinds: continue
                r = {}
                for s in e.stats:
                    n = want.get(s.metadata_id)
                    if n:
                        kind = s.WhichOneof("value"); v = getattr(s, kind)
                        r[n] = plane.stat_metadata[v].name if kind == "ref_value" else v
                if "cpu" not in str(r.get("allocator_name", "")).lower() and "bfc" not in str(r.get("allocator_name", "")).lower(): pass
                timeline.append((line.timestamp_ns * 1000 + e.offset_ps, kinds[e.metadata_id] == "MemoryDeallocation", r))
                if kinds[e.metadata_id] != "MemoryAllocation": continue
                req, alloc = r.get("requested_bytes", 0), r.get("allocation_bytes", 0)
                rows.append((alloc - req, req, alloc, r.get("bytes_allocated", 0), str(r.get("tf_op", ""))[:50], r.get("allocator_name", "")))

    rows.sort(reverse=True)
    print("events", len(rows), "sum held-requested MiB", sum(r[0] for r in rows) / 2**20, "max in use", max(r[3] for r in rows) / 2**20)
    for r in rows[:6]:
        print(f"  {r[4]:50s} requested {r[1]/2**20:7.2f} held {r[2]/2**20:7.2f} in use {r[3]/2**20:6.1f} {r[5]}")

    live, best, best_live = {}, 0, {}
    for t, freed, r in sorted(timeline, key=lambda x: x[0]):
        if "bfc" not in str(r.get("allocator_name", "")) and not freed: continue
        if freed:
            live.pop(r.get("addr"), None)
        else:
            live[r.get("addr")] = (r.get("allocation_bytes", 0), str(r.get("tf_op", "")))
        total = sum(v[0] for v in live.values())
        if total > best:
            best, best_live = total, dict(live)
    print("live at the peak MiB", round(best / 2**20, 1))
    for size, op in sorted(best_live.values(), reverse=True)[:14]:
        print(f"    {size/2**20:6.2f} {op[-90:]}")


def orders(processes: int = 6) -> list[Figure]:
    """:func:`orders_probe` in fresh processes: the executor's two orders of the backward pass
    (docs/lms_internals.md#each-kernels-scratch), as the peaks' spread and the processes whose step held several
    convolutions' input gradients at once."""
    import re

    peaks, held = [], 0
    for index in range(processes):
        done = subprocess.run([sys.executable, __file__, "--orders-probe"], capture_output=True, text=True,
                              env=child_env(), cwd=CODE)
        print(f"== process {index + 1}\n{done.stdout}", flush=True)
        found = re.search(r"peak over before MiB ([0-9.]+)", done.stdout)
        if found is None:
            raise SystemExit(f"the probe failed: {done.stderr[-2000:]}")
        peaks.append(float(found.group(1)))
        alive = done.stdout.split("live at the peak", 1)[-1].count("Conv2DBackpropInput")
        held += alive >= 3  # input gradients of three or more layers alive at once: the other order
    return [Figure("the demo CNN 64x64 at batch 8: a plain step's allocator peak", f"median of {len(peaks)} fresh "
                   "processes", statistics.median(peaks), "MiB", min(peaks), max(peaks), "min-max"),
            Figure("processes whose step held 3 or more convolutions' input gradients at once", f"of {len(peaks)}",
                   held, "")]

LMS_WAYS = {"LMS": {}, "LMS, recompute": {"recompute": "only"}}
LMS_FIT_STEPS = 500  # the steps of the fit LMS plans for in --lms (a user's fit): it is stopped after its third


def lms_one_process(name: str) -> None:
    """``--lms``'s one process: explain_fit with its frontier, told the fit's length, then a 3-step fit with LMS at
    each frontier batch its steps did not measure; a JSON line of (way, batch, predicted, LMS's reading, tensors moved)."""
    import lms_magic

    memory, asked, batches = MODELS[name]
    lms_magic.simulate_accelerator(memory=memory)
    import keras
    import tensorflow as tf

    from lms_magic import LMS

    class StopAfterThree(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.model.stop_training = self.model.stop_training or batch >= 2

    model, (x, y) = build(name, 64)
    found = lms_magic.explain_fit(model, (x, y), batch_size=asked, modes=("without LMS", *LMS_WAYS),
                                  batch_sizes=batches, min_bytes=0, epochs=1, steps_per_epoch=LMS_FIT_STEPS)
    rows = []
    for mode in found.modes[1:]:
        tried = {step.batch_size for step in (mode.confirmed.tried if mode.confirmed else ())}
        budget = mode.magic.partition("--budget ")[2] or None
        for point in (p for p in found.frontier if p.mode == mode.mode and p.batch_size not in tried):
            lms = LMS(verbose=0, min_bytes=0, **LMS_WAYS[mode.mode], **({"budget": budget} if budget else {}))
            count = 3 * point.batch_size
            repeated = tf.data.Dataset.from_tensor_slices((x[:count], y[:count])).batch(
                point.batch_size, drop_remainder=True).repeat()
            model.fit(repeated, steps_per_epoch=LMS_FIT_STEPS, epochs=1, verbose=0, callbacks=[lms, StopAfterThree()])
            rows.append([mode.mode, point.batch_size, point.peak_bytes, lms.stats.measured_step_peak_bytes,
                         lms.stats.swapped_tensors + lms.stats.recomputed_tensors])
    print(json.dumps({"correction": found.correction.words if found.correction else None, "rows": rows}))


def lms_frontier(names: list[str]) -> None:
    """``--lms``: :func:`lms_one_process` in PROCESSES fresh processes a model, each figure printed."""
    for name in names:
        ratios: dict = {}
        for _ in range(PROCESSES):
            done = subprocess.run([sys.executable, __file__, "--lms-one", name], capture_output=True, text=True,
                                  timeout=900, env=child_env(), cwd=CODE)
            if done.returncode:
                raise SystemExit(f"{name}: {done.stderr[-2000:]}")
            found = json.loads(done.stdout.strip().splitlines()[-1])
            print(name, found["correction"], flush=True)
            for mode, batch, predicted, held, moved in found["rows"]:
                print(f"  {mode} batch {batch}: predicted {predicted / 2**20:.1f} MiB, held "
                      f"{held / 2**20 if held else float('nan'):.1f} MiB "
                      f"({predicted / held if held else float('nan'):.3f}; moved {moved})", flush=True)
                if held:
                    ratios.setdefault((mode, moved > 0), []).append(predicted / held)
        for (mode, moved), values in ratios.items():
            print(f"{name} {mode}, {'tensors moved' if moved else 'nothing moved'}: predicted over held, median "
                  f"{statistics.median(values):.3f}, {min(values):.3f}-{max(values):.3f} ({len(values)})", flush=True)


def demo_story(processes: int = 3) -> None:
    """``--demo-story``: lms_demo's notebook at ``make demo``'s size in fresh kernels: explain_fit's lines (without
    LMS, LMS, the line to use) and the dashboard's headline."""
    import pathlib
    import re
    import tempfile

    sys.path.insert(0, str(CODE / "notebooks"))
    import run_demo

    for index in range(processes):
        notebook = run_demo.run(CODE / "notebooks" / "lms_demo.ipynb", pathlib.Path(tempfile.mkdtemp()),
                                {"N_ROWS": "800", "IMAGE_SIZE": "64"}, timeout_s=300)
        print(f"== kernel {index + 1}", flush=True)
        for cell in notebook.cells:
            if cell.cell_type != "code" or not ("explain_fit(cnn" in cell.source or "lms_fit --compare {" in cell.source):
                continue
            for output in cell.get("outputs", []):
                text = output.get("text", "") + output.get("data", {}).get("text/plain", "")
                for line in text.splitlines():
                    if re.match(r"\s*(without LMS:|LMS:|to train|measured:)", line):
                        print(line.strip()[:600], flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # every tensor counted (simulate_accelerator's setting)
    sys.path.insert(0, str(CODE))
    if os.environ.get("KERAS_BACKEND") == "torch":
        report([figure for name in (sys.argv[1:] or DEFAULT) for figure in torch_meter(name)])
    elif sys.argv[1:2] == ["--orders"]:
        report(orders())
    elif sys.argv[1:2] == ["--orders-probe"]:
        orders_probe()
    elif sys.argv[1:2] == ["--lms"]:
        lms_frontier(sys.argv[2:] or list(DEFAULT))
    elif sys.argv[1:2] == ["--lms-one"]:
        lms_one_process(sys.argv[2])
    elif sys.argv[1:2] == ["--demo-story"]:
        demo_story()
    elif sys.argv[1:2] == ["--measure"]:
        print(json.dumps({"peak_bytes": measure_here(sys.argv[2], int(sys.argv[3]))}))
    else:
        names = sys.argv[1:] or list(DEFAULT)
        if len(names) > 1:  # simulate_accelerator's memory is fixed per process: one model a process
            for model_name in names:
                subprocess.run([sys.executable, __file__, model_name], check=True, env=child_env(), cwd=CODE)
        else:
            report(run(names[0]))
