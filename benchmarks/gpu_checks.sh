#!/bin/bash
# The checks a lent GPU session runs first, in one device call (at most 10 minutes: each step has its own
# limit, and what it printed is under $OUT). Carry .whl (keras, namex, optree, ipython and its dependencies,
# memory-profiler, ipywidgets, plotly, keras-hub, kagglehub, kagglesdk: the versions of `make install`) and run:
#     bash benchmarks/gpu_checks.sh
# 1. the gpu-marked tests; 2. KerasHub GPT-2 on JAX (16 layers, sequence 2048, batch 12) with LMS: whether it
# trains in 16 GiB, LMS's predicted peak against the measured one (issue 38), then the same fit without LMS
# (out of memory, or not); 3. ResNet-50 224x224 on JAX in 16 GiB: the out-of-memory account at batch 384, its
# largest batch without LMS (XLA's figure, compiled under the cap) checked by training there and one above
# (issue 36); 4. LMS's JAX step with nothing moved against the plain step, as XLA compiles them under the cap.
# PyTorch's largest batch was checked on 2026-11-26 (gpu-2026-11-26b).
OUT=${OUT:-/tmp/gpu_checks}; mkdir -p $OUT
cp "$0" $OUT/command.sh  # the raw output keeps the command it ran beside it
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  KERAS_BACKEND=jax python3 -c "import torch, jax, keras; print('torch', torch.__version__, '| jax', jax.__version__, '| keras', keras.__version__)"
  date -u; } > $OUT/device.txt 2>&1; cat $OUT/device.txt
KERAS_BACKEND=torch timeout 50 python3 -m pytest -o addopts="" -q -W ignore -p no:cacheprovider -m gpu -rs \
    tests/test_gpu.py tests/lms/torch/test_backend.py > $OUT/1-gpu-tests.log 2>&1
grep -E "^E  |passed|failed" $OUT/1-gpu-tests.log | head -12
GPT2="--backend jax --model gpt2 --size 2048 --layers 16 --batch 12"
KERAS_BACKEND=jax timeout 210 python3 benchmarks/gpu/explain_check.py $GPT2 --lms-only --trial-timeout-s 200 \
    > $OUT/2-gpt2-jax-lms.log 2>&1
grep -E "trial|done|GPT" $OUT/2-gpt2-jax-lms.log | cut -c1-3000
KERAS_BACKEND=jax timeout 70 python3 benchmarks/gpu/explain_check.py $GPT2 --plain-only --trial-timeout-s 65 \
    > $OUT/3-gpt2-jax-plain.log 2>&1
grep -E "trial|done|GPT" $OUT/3-gpt2-jax-plain.log | cut -c1-1000
KERAS_BACKEND=jax timeout 190 python3 benchmarks/gpu/explain_check.py --backend jax --batch 384 \
    --account-timeout-s 130 --trial-timeout-s 30 > $OUT/4-resnet50-jax.log 2>&1
grep -E "trial|done|ResNet|largest|step needs|predicted" $OUT/4-resnet50-jax.log | cut -c1-400
# LMS's step with nothing moved (every name saved, the rest computed again) against the plain step, compiled under
# the same cap: what LMS's checkpoint costs on a GPU
XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "import pynvml as n; n.nvmlInit(); print(f'{16 * 2**30 / n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0)).total:.4f}')") \
    KERAS_BACKEND=jax timeout 45 python3 benchmarks/gpu/jax_compiled_check.py --size 224 242 > $OUT/5-compiled.log 2>&1
grep batch $OUT/5-compiled.log | cut -c1-300
