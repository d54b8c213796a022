"""Where a plain TensorFlow step's allocator peak goes, by the allocator's own events: the demo CNN (8 Conv2D of 16
filters, 64x64) at batch 8 on ``simulate_accelerator``'s device, one step profiled (TensorFlow's profiler) after
``explain_fit`` measured its steps. Each probe (``--probe``) prints explain_fit's "measured:" line, the step's
peak over what the device held before it, what BFC's chunks held over what was asked, and the tensors alive at
the peak by the op that made them. The suite runs the probe in fresh processes: the executor's order differs
between them (docs/lms_internals.md#each-kernels-scratch), and the figures are the peaks' spread and how many
processes held several input gradients at once.

    python benchmarks/step_orders.py [--processes 6]
"""

import glob
import sys
import tempfile


def probe() -> None:
    """One step profiled after explain_fit's measured steps, in this process; its lines printed."""
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


def main() -> None:
    import argparse
    import re
    import statistics
    import subprocess

    from common import Figure, child_env, report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--probe", action="store_true", help="one probe, in this process")
    options = parser.parse_args()
    if options.probe:
        probe()
        return
    peaks, held = [], 0
    for index in range(options.processes):
        done = subprocess.run([sys.executable, __file__, "--probe"], capture_output=True, text=True, env=child_env())
        print(f"== process {index + 1}\n{done.stdout}", flush=True)
        found = re.search(r"peak over before MiB ([0-9.]+)", done.stdout)
        if found is None:
            raise SystemExit(f"the probe failed: {done.stderr[-2000:]}")
        peaks.append(float(found.group(1)))
        alive = done.stdout.split("live at the peak", 1)[-1].count("Conv2DBackpropInput")
        held += alive >= 3  # input gradients of three or more layers alive at once: the other order
    report([Figure("the demo CNN 64x64 at batch 8: a plain step's allocator peak", f"median of {len(peaks)} fresh "
                   "processes", statistics.median(peaks), "MiB", min(peaks), max(peaks), "min-max"),
            Figure("processes whose step held 3 or more convolutions' input gradients at once", f"of {len(peaks)}",
                   held, "")])


if __name__ == "__main__":
    main()
