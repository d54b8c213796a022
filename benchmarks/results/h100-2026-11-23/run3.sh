#!/bin/bash
pip install -q --no-deps --target /tmp/site .whl/*.whl > $OUT/install.log 2>&1
export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=torch
timeout 80 python benchmarks/lms_gpu_torch.py --memory-gib 16 --steps 5 --models resnet50 --batches 64 --lms-options '{}' --trial-timeout-s 75 > $OUT/1-resnet50-default-64.log 2>&1
cut -c1-700 $OUT/1-resnet50-default-64.log
timeout 420 python benchmarks/lms_gpu_torch.py --memory-gib 16 --steps 5 --models resnet50 --batches 384,448 --trial-timeout-s 200 > $OUT/2-resnet50-lms.log 2>&1
cut -c1-700 $OUT/2-resnet50-lms.log
free -g | head -2
