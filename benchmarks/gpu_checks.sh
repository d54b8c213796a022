#!/bin/bash
# The checks a lent GPU session runs first, in one device call (at most 10 minutes: each step has its own
# limit, and what it printed is under $OUT). Carry .whl (keras, namex, optree, ipython and its dependencies,
# memory-profiler, ipywidgets, plotly, keras-hub, kagglehub, kagglesdk, and grain with array-record, dm-tree,
# more-itertools, portpicker: KerasHub's fit batches arrays with grain where TensorFlow is absent) and run:
#     bash benchmarks/gpu_checks.sh
# 1. the gpu-marked tests; 2-3. KerasHub's Gemma-style causal LM with LoRA, (x, y, sample_weight), fp32 and
# mixed_bfloat16, batches 8 and 16, on PyTorch and JAX: every candidate moved against a plain fit (losses), and
# LMS's predicted peaks against the allocator's (issue 60); 4. the demo CNN on PyTorch: explain_fit's plain peak
# against the allocator's at batches 4, 16, 64, where cuDNN's workspaces are what the graph does not show (issue 61);
# 5. the same on JAX, where explain_fit reads XLA's compiled step; 6. JAX's offloads: LMS as shipped, and with
# only the matrix products named, against a plain fit (benchmarks/gpu/jax_offload_check.py, issue 60).
OUT=${OUT:-/tmp/gpu_checks}; mkdir -p $OUT
cp "$0" $OUT/command.sh  # the raw output keeps the command it ran beside it
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  KERAS_BACKEND=jax python3 -c "import torch, jax, keras, keras_hub; print('torch', torch.__version__, '| jax', jax.__version__, '| keras', keras.__version__, '| keras-hub', keras_hub.__version__)"
  date -u; } > $OUT/device.txt 2>&1; cat $OUT/device.txt
timeout 300 python3 benchmarks/gpu/jax_offload_check.py --batch 8 --parallel 8 --trial-timeout-s 260 \
    > $OUT/6-jax-offload.log 2>&1 &
KERAS_BACKEND=torch timeout 60 python3 -m pytest -o addopts="" -q -W ignore -p no:cacheprovider -m gpu -rs \
    tests/test_gpu.py tests/lms/torch/test_backend.py > $OUT/1-gpu-tests.log 2>&1
grep -E "^E  |passed|failed" $OUT/1-gpu-tests.log | head -12
# PyTorch (2, 4) and JAX (3, 5) run side by side: each trial's peak is its own process's allocator's; the
# fit times of one run share the GPU with the other.
{ timeout 280 python3 benchmarks/gpu/hub_lora_check.py --backend torch --trial-timeout-s 60 > $OUT/2-gemma-lora-torch.log 2>&1
  timeout 120 python3 benchmarks/gpu/hub_lora_check.py --backend torch --model cnn --batch 4 16 64 --trial-timeout-s 40 \
      > $OUT/4-cnn-torch.log 2>&1; } &
{ timeout 240 python3 benchmarks/gpu/hub_lora_check.py --backend jax --batch 16 --trial-timeout-s 80 > $OUT/3-gemma-lora-jax.log 2>&1
  timeout 150 python3 benchmarks/gpu/hub_lora_check.py --backend jax --model cnn --batch 4 16 --trial-timeout-s 70 \
      > $OUT/5-cnn-jax.log 2>&1; } &
wait
for f in $OUT/[2-6]-*.log; do echo "== $f"; cut -c1-900 $f; done
