"""The tuner's batch slider on TensorFlow: the first prediction at each new batch size (ResNet50 224x224, SGD with
momentum). The first two batch sizes are traced; the others are read off those two traces.

    python benchmarks/tune_batch_sizes.py
"""

import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import keras, numpy as np
from lms_magic.lms.tensorflow.predictor import TensorFlowStepPredictor
from lms_magic.lms.core.plan import Selection
keras.utils.set_random_seed(0)
m = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3))
m.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
p = TensorFlowStepPredictor(m, (np.zeros((2, 224, 224, 3), "float32"), np.zeros(2, "int32")), Selection())
p.rescale_batches = True
for b in (64, 96, 128, 160, 32):
    t = time.perf_counter(); pred = p.predict(100, 1, b); dt = time.perf_counter() - t
    t = time.perf_counter(); p.predict(150, 1, b); dt2 = time.perf_counter() - t
    print(f"batch {b}: first prediction {dt:.2f} s ({'traced' if b in p._traced else 'read off two traces'}), next {dt2*1e3:.0f} ms, peak {pred.peak_bytes/2**30:.2f} GiB")
