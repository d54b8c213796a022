#!/bin/bash
# The checks a lent GPU session runs first, in one device call (at most 10 minutes: each step has its own
# limit, and what it printed is under $OUT). Carry .whl (keras, namex, optree, ipython and its dependencies,
# memory-profiler, ipywidgets, plotly, keras-hub, kagglehub, kagglesdk, and grain with array-record, dm-tree,
# more-itertools, portpicker: KerasHub's fit batches arrays with grain where TensorFlow is absent) and run:
#     bash benchmarks/gpu_checks.sh
# 1. the gpu-marked tests; 2. KerasHub's Gemma-style causal LM with LoRA, (x, y, sample_weight), fp32 and
# mixed_bfloat16, batches 8 and 16, on PyTorch: every candidate moved against a plain fit (losses), and LMS's
# predicted peaks against the allocator's (issue 60); 3. the same model's plain fit on JAX: where the process's
# peak is reached (after the build, each step), with and without XLA's algorithm search's buffers, against XLA's figures
# (LMS's, and Keras's whole train step), the pool growing or taken whole (issue 60); 4. the demo CNN on PyTorch:
# explain_fit's plain peak against the allocator's at batches 4, 16, 64 (issue 61); 5. the same on JAX, one
# process per batch, on a 4 GiB device (its search for the largest batch compiles each size it asks); 6. the
# Gemma-style model on JAX with LMS(n_tensors=-1) and plainly, batch 8: LMS's figures against the allocator's.
OUT=${OUT:-/tmp/gpu_checks}; mkdir -p $OUT
cp "$0" $OUT/command.sh  # the raw output keeps the command it ran beside it
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > /tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }  # $OUT brings back 8 files at most
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  KERAS_BACKEND=jax python3 -c "import torch, jax, keras, keras_hub; print('torch', torch.__version__, '| jax', jax.__version__, '| keras', keras.__version__, '| keras-hub', keras_hub.__version__)"
  git log -1 --format='code: %h %s' 2>/dev/null; date -u; } > $OUT/device.txt 2>&1; cat $OUT/device.txt
# JAX (3, 5, 6) and PyTorch (1, 2, 4) side by side: each peak is its own process's allocator's; fit times
# are not compared across logs. JAX_ONLY=1 leaves PyTorch's out.
{ timeout 150 python3 benchmarks/gpu/jax_peak_check.py --batch 8 16 --parallel 4 --trial-timeout-s 60 \
      > $OUT/3-gemma-jax-peaks.log 2>&1 &
  for batch in 4 16 64; do
      timeout 150 python3 benchmarks/gpu/hub_lora_check.py --backend jax --model cnn --batch $batch \
          --trial-timeout-s 140 > /tmp/5-cnn-jax-$batch.log 2>&1 &
  done
  timeout 150 python3 benchmarks/gpu/hub_lora_check.py --backend jax --batch 8 --trial-timeout-s 70 \
      > $OUT/6-gemma-lora-jax.log 2>&1 &
  wait; cat /tmp/5-cnn-jax-*.log > $OUT/5-cnn-jax.log; } &
[ -n "$JAX_ONLY" ] || { KERAS_BACKEND=torch timeout 60 python3 -m pytest -o addopts="" -q -W ignore -p no:cacheprovider -m gpu -rs \
      tests/test_gpu.py tests/lms/torch/test_backend.py > $OUT/1-gpu-tests.log 2>&1
  timeout 200 python3 benchmarks/gpu/hub_lora_check.py --backend torch --trial-timeout-s 60 > $OUT/2-gemma-lora-torch.log 2>&1
  timeout 120 python3 benchmarks/gpu/hub_lora_check.py --backend torch --model cnn --batch 4 16 64 --trial-timeout-s 40 \
      > $OUT/4-cnn-torch.log 2>&1; } &
wait
grep -E "^E  |passed|failed" $OUT/1-gpu-tests.log | head -12
for f in $OUT/[2-6]-*.log; do echo "== $f"; cut -c1-700 $f; done
