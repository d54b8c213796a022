import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"]="3"
import keras, numpy as np, tensorflow as tf
from lms_magic import internals
way = sys.argv[1]
times = []
for _ in range(3):
    m = keras.applications.ResNet50(weights=None)
    m.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy", metrics=["accuracy"])
    specs = (tf.TensorSpec((67, 224, 224, 3), tf.float32), tf.TensorSpec((67,), tf.int32))
    t = time.perf_counter()
    if way == "keras": m._symbolic_build(data_batch=specs)
    else: assert internals._built_from_outputs(m, specs)
    times.append(time.perf_counter() - t)
print(way, " ".join(f"{x:.2f}" for x in times))
