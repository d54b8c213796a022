#!/bin/bash
# GPU session 2026-11-23, call 1: tests, then ResNet-50 and cnn with LMS at chosen batches
set -x
pip install -q --no-deps --target /tmp/site .whl/*.whl > $OUT/install.log 2>&1
export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=torch
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/device.txt 2>&1
python -c "import torch; print('torch', torch.__version__, torch.version.cuda)" >> $OUT/device.txt 2>&1
timeout 150 python -m pytest -o addopts="" -q -p no:cacheprovider tests/test_gpu.py tests/torch_backend > $OUT/1-tests.log 2>&1
tail -3 $OUT/1-tests.log
timeout 330 python benchmarks/lms_gpu_torch.py --memory-gib 16 --steps 5 --models resnet50 --batches 128,256,320,384 --trial-timeout-s 120 > $OUT/2-resnet50-lms.log 2>&1
cat $OUT/2-resnet50-lms.log | cut -c1-400
timeout 90 python benchmarks/lms_gpu_torch.py --memory-gib 16 --steps 5 --models resnet50 --batches 64 --lms-options '{}' > $OUT/3-resnet50-default-64.log 2>&1
cat $OUT/3-resnet50-default-64.log | cut -c1-600
