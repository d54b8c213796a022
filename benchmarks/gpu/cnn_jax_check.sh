#!/bin/bash
# The demo CNN on JAX on a GPU (issue 61): explain_fit's plain peak against the allocator's at batches 4, 16, 64,
# each batch twice, in fresh processes: once with XLA's algorithm search run (its buffers in the process's peak),
# once with the search's results read from the first run (the peak is the step's). Carry .whl (gpu_checks.sh).
OUT=${OUT:-/tmp/gpu_checks}; mkdir -p $OUT; cp "$0" $OUT/command.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > /tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } > $OUT/device.txt 2>&1
for batch in 4 16 64; do
    timeout 200 python3 benchmarks/gpu/hub_lora_check.py --backend jax --model cnn --batch $batch --search-cached \
        --trial-timeout-s 95 > /tmp/cnn-jax-$batch.log 2>&1 &
done; wait; cat /tmp/cnn-jax-*.log > $OUT/cnn-jax.log; cut -c1-400 $OUT/cnn-jax.log
