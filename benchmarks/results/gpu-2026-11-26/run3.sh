#!/bin/bash
# GPU session 2026-11-26, third call (run2.sh found that on JAX a fit that runs out of memory returns, and the error
# comes when the weights are read: %%gpumem now waits for the fit's last step): GPT-2 on JAX at a sequence that does
# not fit 16 GiB, explained, then with LMS (issue 38); ResNet-50 on JAX at a batch that does not fit, explained.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
KERAS_BACKEND=jax timeout 165 python3 benchmarks/gpu_explain_check.py --backend jax --model gpt2 --size 2048 \
    --layers 24 --batch 8 --trial-timeout-s 100 > $OUT/3-gpt2-jax.log 2>&1
grep -E "trial|done|GPT|largest|step needs|fills|Error" $OUT/3-gpt2-jax.log | cut -c1-1500
KERAS_BACKEND=jax timeout 95 python3 benchmarks/gpu_explain_check.py --backend jax --batch 384 --oom-only \
    --trial-timeout-s 90 > $OUT/4-resnet50-jax.log 2>&1
grep -E "trial|done|ResNet|largest|step needs|fills|layers holding|Error" $OUT/4-resnet50-jax.log | cut -c1-600
