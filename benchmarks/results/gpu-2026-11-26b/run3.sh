#!/bin/bash
# Third call (99 s of device time left): the plain function compiled with JAX's pool capped at 16 GiB, as the fits were.
[ -d /tmp/site/keras ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3 XLA_PYTHON_CLIENT_MEM_FRACTION=0.1139
KERAS_BACKEND=jax timeout 70 python3 benchmarks/jax_compiled_check.py --plain-only --size 224 242 384 > $OUT/7-compiled-capped.log 2>&1
grep "batch" $OUT/7-compiled-capped.log | cut -c1-300
