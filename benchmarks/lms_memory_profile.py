"""What TensorFlow's allocator holds at its peak in one plain train step, from TensorFlow's profiler.

Prints the allocator's peak and writes the profiler's memory profile (every allocation live at the peak:
its op, shape, requested and allocated bytes) to /tmp/exp/memprof_<model>.json, beside the raw trace.
The answer to "which bytes does the replay miss" (docs/measurements.md#prediction-against-the-allocator).

    python benchmarks/lms_memory_profile.py ResNet50 128 16
"""
import glob, json, os, pathlib, sys
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.makedirs("/tmp/exp", exist_ok=True)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from tests.conftest import _split_tensorflow_cpu
_split_tensorflow_cpu()
import numpy as np, tensorflow as tf, keras
name, size, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
keras.utils.set_random_seed(5)
model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10, classifier_activation=None)
model.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(0)
x, y = rng.random((batch * 2, size, size, 3), dtype="float32"), rng.integers(0, 10, batch * 2)
model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)
batches = iter(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat())
model.train_function(batches)
tf.config.experimental.reset_memory_stats("CPU:0")
before = tf.config.experimental.get_memory_info("CPU:0")["current"]
logdir = f"/tmp/exp/prof_{name}"
tf.profiler.experimental.start(logdir, options=tf.profiler.experimental.ProfilerOptions(host_tracer_level=3))
model.train_function(batches)
tf.profiler.experimental.stop()
info = tf.config.experimental.get_memory_info("CPU:0")
print("measured step peak MiB", (info["peak"] - before) / 2**20, "before", before / 2**20)
from tensorflow.python.profiler.internal import _pywrap_profiler_plugin as p
path = sorted(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True))[-1]
data, ok = p.xspace_to_tools_data([path], "memory_profile", {})
prof = json.loads(data)
json.dump(prof, open(f"/tmp/exp/memprof_{name}.json", "w"))
for alloc, per in prof["memoryProfilePerAllocator"].items():
    peak = per["profileSummary"]["peakStats"]
    print(alloc, json.dumps(peak)[:400])
