#!/bin/bash
pip install -q --no-deps --target /tmp/site .whl/*.whl > $OUT/install.log 2>&1
export PYTHONPATH=/tmp/site:$PWD KERAS_BACKEND=torch
timeout 150 python -m pytest -o addopts="" -q -W ignore -p no:cacheprovider tests/test_gpu.py tests/torch_backend > $OUT/1-tests.log 2>&1
tail -3 $OUT/1-tests.log
timeout 120 python .whl/diag.py 128 lms > $OUT/2-diag-resnet50-128-lms.log 2>&1
cat $OUT/2-diag-resnet50-128-lms.log | grep -v Warn | tail -28
timeout 300 python benchmarks/lms_gpu_torch.py --memory-gib 16 --steps 5 --models resnet50 --batches 192,256,320,384 --trial-timeout-s 100 > $OUT/3-resnet50-lms.log 2>&1
cut -c1-700 $OUT/3-resnet50-lms.log
timeout 100 python benchmarks/lms_gpu_torch.py --memory-gib 16 --steps 5 --models cnn --batches 400 --trial-timeout-s 95 > $OUT/4-cnn-400.log 2>&1
cut -c1-700 $OUT/4-cnn-400.log
