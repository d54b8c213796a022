#!/bin/bash
pip install -q --no-deps --target /tmp/site .whl/*.whl > $OUT/install.log 2>&1
export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=torch
timeout 400 python - > $OUT/1-throughput-pairs.log 2>&1 <<'PY'
import sys, json, argparse; sys.path.insert(0, 'benchmarks'); import lms_gpu_torch as b
a = argparse.Namespace(steps=10, memory_gib=16, device='cuda', trial_timeout_s=90, lms_options='{}')
for model, batch in (("resnet50", 64), ("cnn", 80)):
    for lms in (False, True, False, True):
        r = b.trial(model, batch, lms, a)
        print(model, batch, "lms" if lms else "plain", json.dumps({k: r.get(k) for k in ("ok", "step_s", "samples_per_s", "swapped_bytes", "allocator_peak_mib")}), flush=True)
PY
grep -v trial $OUT/1-throughput-pairs.log
