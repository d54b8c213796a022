#!/bin/bash
# The checks a lent GPU session runs first, in one device call (at most 10 minutes: each step has its own
# limit, and what it printed is under $OUT). Carry .whl (keras, namex, optree, ipython and its dependencies,
# memory-profiler, ipywidgets, plotly, keras-hub, kagglehub, kagglesdk: the versions of `make install`) and run:
#     bash benchmarks/gpu_checks.sh
# 1. the gpu-marked tests; 2. ResNet-50 224x224 in 16 GiB: the out-of-memory account and the largest batch without
# LMS checked by training, PyTorch and JAX (issue 36); 3. KerasHub GPT-2 on JAX, 24 layers at sequence 2048, batch 8:
# a plain fit (out of memory in 16 GiB on the H200), then with LMS: the predicted and the measured peak (issue 38).
OUT=${OUT:-/tmp/gpu_checks}; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  KERAS_BACKEND=jax python3 -c "import torch, jax, keras; print('torch', torch.__version__, '| jax', jax.__version__, '| keras', keras.__version__)"
  date -u; } > $OUT/device.txt 2>&1; cat $OUT/device.txt
KERAS_BACKEND=torch timeout 50 python3 -m pytest -o addopts="" -q -W ignore -p no:cacheprovider -m gpu -rs \
    tests/test_gpu.py tests/lms/torch/test_backend.py > $OUT/1-gpu-tests.log 2>&1
grep -E "^E  |passed|failed" $OUT/1-gpu-tests.log | head -12
KERAS_BACKEND=jax timeout 195 python3 benchmarks/gpu_explain_check.py --backend jax --model gpt2 --size 2048 \
    --layers 24 --batch 8 --plain-fit-only --trial-timeout-s 95 > $OUT/2-gpt2-jax.log 2>&1
grep -E "trial|done|GPT" $OUT/2-gpt2-jax.log | cut -c1-1200
KERAS_BACKEND=jax timeout 250 python3 benchmarks/gpu_explain_check.py --backend jax --batch 384 \
    --account-timeout-s 140 --trial-timeout-s 30 > $OUT/3-resnet50-jax.log 2>&1
grep -E "trial|done|ResNet|largest|step needs|predicted" $OUT/3-resnet50-jax.log | cut -c1-400
KERAS_BACKEND=torch timeout 85 python3 benchmarks/gpu_explain_check.py --backend torch --batch 256 \
    --account-timeout-s 50 --trial-timeout-s 15 > $OUT/4-resnet50-torch.log 2>&1
grep -E "trial|done|ResNet|largest|step needs|predicted" $OUT/4-resnet50-torch.log | cut -c1-400
