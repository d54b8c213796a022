"""What is alive on the GPU at the allocator's peak: ResNet-50 under LMS, one step recorded."""
import collections, os, sys
os.environ["KERAS_BACKEND"] = "torch"
import torch
torch.cuda.set_per_process_memory_fraction(16 * 2**30 / torch.cuda.get_device_properties(0).total_memory)
import keras, numpy as np
from lms_magic import LMS
batch, use_lms = int(sys.argv[1]), sys.argv[2] == "lms"
model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x = np.random.rand(batch, 224, 224, 3).astype("float32"); y = np.random.randint(0, 1000, batch)
cbs = [LMS(verbose=0, min_bytes=0)] if use_lms else []
model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=cbs)
torch.cuda.synchronize(); base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
cbs = [LMS(verbose=0, min_bytes=0)] if use_lms else []
model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=cbs)
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
print(f"batch {batch} lms={use_lms}: allocated before {base/2**30:.2f} GiB, peak {torch.cuda.max_memory_allocated()/2**30:.2f} GiB")
events = snap["device_traces"][0]
live, total, peak, peak_i, peak_live = {}, 0, 0, 0, {}
for i, e in enumerate(events):
    if e["action"] == "alloc":
        live[e["addr"]] = e; total += e["size"]
    elif e["action"] in ("free_completed",) and e["addr"] in live:
        total -= live.pop(e["addr"])["size"]
    if total > peak:
        peak, peak_i = total, i
        peak_live = dict(live) if False else None
# replay again to the peak index to get the live set (cheap)
live = {}
for e in events[: peak_i + 1]:
    if e["action"] == "alloc": live[e["addr"]] = e
    elif e["action"] == "free_completed": live.pop(e["addr"], None)
print(f"events {len(events)}, peak of traced allocations {peak/2**30:.2f} GiB at event {peak_i} ({100*peak_i/len(events):.0f}% of the step), live blocks {len(live)}")
def where(e):
    frames = [f for f in e.get("frames", []) if "site-packages/torch" not in f["filename"] and "/torch/" not in f["filename"]]
    keep = [f"{os.path.basename(f['filename'])}:{f['line']}:{f['name']}" for f in frames[:3]]
    return " < ".join(keep) or "(no python frame: autograd engine)"
groups = collections.defaultdict(lambda: [0, 0])
for e in live.values():
    g = groups[where(e)]; g[0] += e["size"]; g[1] += 1
for key, (size, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:15]:
    print(f"{size/2**30:7.2f} GiB {n:5d} blocks  {key}")
print("last events before peak:")
for e in events[max(0, peak_i - 6): peak_i + 1]:
    print(" ", e["action"], f"{e['size']/2**20:.1f} MiB", where(e))
