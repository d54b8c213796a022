#!/bin/bash
# GPU session 2026-11-26, one call: the gpu-marked tests; an out-of-memory explained and the predicted largest
# batch checked (ResNet-50 224x224 in 16 GiB, PyTorch and JAX; issue 36); KerasHub GPT-2 on JAX at a sequence
# that does not fit 16 GiB, with LMS (issue 38). Keras and this package's dependencies carried as wheels (.whl).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, jax, keras; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| jax', jax.__version__, jax.devices(), '| keras', keras.__version__)"
  free -g | head -2; date -u; } > $OUT/device.txt 2>&1
cat $OUT/device.txt
KERAS_BACKEND=torch timeout 90 python3 -m pytest -o addopts="" -q -W ignore -p no:cacheprovider -m gpu -rs \
    tests/test_gpu.py tests/lms/torch/test_backend.py > $OUT/1-gpu-tests.log 2>&1
tail -4 $OUT/1-gpu-tests.log
KERAS_BACKEND=torch timeout 120 python3 benchmarks/gpu_explain_check.py --backend torch --batch 256 \
    --trial-timeout-s 55 > $OUT/2-resnet50-torch.log 2>&1
grep -E "trial|done|ResNet|largest|step needs|fills|layers holding" $OUT/2-resnet50-torch.log | cut -c1-500
KERAS_BACKEND=jax timeout 190 python3 benchmarks/gpu_explain_check.py --backend jax --model gpt2 --size 2048 \
    --layers 12 --batch 8 --trial-timeout-s 92 > $OUT/3-gpt2-jax.log 2>&1
grep -E "trial|done|GPT|largest|step needs|fills" $OUT/3-gpt2-jax.log | cut -c1-900
KERAS_BACKEND=jax timeout 160 python3 benchmarks/gpu_explain_check.py --backend jax --batch 256 \
    --trial-timeout-s 75 > $OUT/4-resnet50-jax.log 2>&1
grep -E "trial|done|ResNet|largest|step needs|fills|layers holding" $OUT/4-resnet50-jax.log | cut -c1-500
