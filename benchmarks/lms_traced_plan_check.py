"""Would planning on the traced graph spare the probe? The plan the lowest-peak rule makes on the traced step,
replayed on the graphs the probe executed, against the plan made on those graphs (keras.applications models at
64x64, batch 8, SGD with momentum, every tensor size eligible, the CPU split in two).

    python benchmarks/lms_traced_plan_check.py DenseNet121
"""
import os
import sys
import time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import numpy as np
from lms_magic import LMS
from lms_magic.lms.tensorflow import backend as be
name = sys.argv[1]
seen = {}
orig = be.TensorFlowBackend._traced_plan
def traced_plan(self, ops, data, graph=None, budget_fallback=False):
    out = orig(self, ops, data, graph, budget_fallback)
    candidates, notes, step, input_bytes, plan, plain = out
    if "traced" not in seen and graph is not None:
        t = time.perf_counter()
        seen["traced"] = self._search(candidates, step.predicted_transient_peak)
        seen["traced_s"] = time.perf_counter() - t
        seen["order"] = [c.candidate.tensor for c in candidates]
    return out
be.TensorFlowBackend._traced_plan = traced_plan
orig_exec = be.TensorFlowBackend._plan_on_executed
def plan_on_executed(self, partitions, plain_peak_bytes):
    action = orig_exec(self, partitions, plain_peak_bytes)
    if self.executed is not None and "exec" not in seen:
        seen["exec"] = self._plan
        traced = seen["traced"]
        by = {i.candidate.tensor: i for i in self.candidates}
        held = [by[c.tensor] for c in traced.moved if c.tensor in by and self.executed.holds(by[c.tensor])]
        seen["traced_on_exec"] = self._persistent_bytes() + self.executed.transient_peak(held)
        sub = self._search(held, self.executed.transient_peak)
        seen["sub"] = sub
    return action
be.TensorFlowBackend._plan_on_executed = plan_on_executed
rng = np.random.default_rng(0)
x = rng.random((16, 64, 64, 3), dtype="float32"); y = rng.integers(0, 10, 16)
keras.utils.set_random_seed(5)
m = getattr(keras.applications, name)(weights=None, input_shape=(64, 64, 3), classes=10, classifier_activation=None)
m.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
cb = LMS(device="/CPU:0", host_device="/CPU:1", min_bytes=0, verbose=0)
m.fit(x, y, batch_size=8, verbose=0, shuffle=False, callbacks=[cb])
t, e, s = seen["traced"], seen["exec"], seen["sub"]
MiB = 2**20
print(name, f"traced plan: {len(t.moved)} moved, traced peak {t.peak_bytes/MiB:.1f} (without {t.peak_bytes_without_lms/MiB:.1f}), search {seen['traced_s']:.1f} s")
print(name, f"  its peak on the probe's executed graphs: {seen['traced_on_exec']/MiB:.1f}")
print(name, f"executed plan (probe): {len(e.moved)} moved, peak {e.peak_bytes/MiB:.1f} (without {e.peak_bytes_without_lms/MiB:.1f})")
print(name, f"executed search within the traced plan: {len(s.moved)} moved, peak {s.peak_bytes/MiB:.1f}")
print(name, "traced moved == executed moved:", [c.tensor for c in t.moved] == [c.tensor for c in e.moved], "prefix?", [c.tensor for c in e.moved] == [c.tensor for c in t.moved][:len(e.moved)])
