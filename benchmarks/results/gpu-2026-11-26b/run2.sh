#!/bin/bash
# GPU session 2026-11-26 (third), second call. The first (benchmarks/gpu_checks.sh) found XLA's compiled figure for
# ResNet-50 on the GPU equal to the replay's (47.59 against 47.56 GiB at batch 384; XLA asked for 20.71 GiB): the
# compiled function was the replay's, every residual saved under jax.checkpoint. This call compiles both at the
# batches the first call trained (120 and 242 train), and runs GPT-2 (16 layers, sequence 2048, batch 12) with LMS.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > $OUT/install.log 2>&1 || { tail -5 $OUT/install.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
KERAS_BACKEND=jax timeout 80 python3 benchmarks/jax_compiled_check.py --size 224 120 242 384 > $OUT/5-compiled.log 2>&1
grep -v "^WARNING\|^I0000" $OUT/5-compiled.log | tail -8 | cut -c1-300
KERAS_BACKEND=jax timeout 160 python3 benchmarks/gpu_explain_check.py --backend jax --model gpt2 --size 2048 \
    --layers 16 --batch 12 --lms-only --trial-timeout-s 150 > $OUT/6-gpt2-jax-lms.log 2>&1
grep -E "trial|done|GPT" $OUT/6-gpt2-jax-lms.log | cut -c1-3000
