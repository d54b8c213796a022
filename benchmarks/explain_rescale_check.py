import os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, "/work/main")
import numpy as np, keras, tensorflow as tf
from lms_magic.lms.tensorflow.predictor import TensorFlowStepPredictor
from lms_magic.lms.core.plan import Selection

def models():
    def app(name, size=64):
        def build():
            keras.utils.set_random_seed(1)
            m = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10, classifier_activation=None)
            m.compile(keras.optimizers.SGD(0.01, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            return m, (np.zeros((2, size, size, 3), "float32"), np.zeros((2,), "int32"))
        return build
    def attention():
        keras.utils.set_random_seed(1)
        x = keras.Input((32, 64)); h = keras.layers.MultiHeadAttention(4, 16)(x, x); h = keras.layers.LayerNormalization()(h + x)
        h = keras.layers.Dense(256, activation="gelu")(h); h = keras.layers.Dense(64)(h); o = keras.layers.Dense(5)(keras.layers.GlobalAveragePooling1D()(h))
        m = keras.Model(x, o); m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m, (np.zeros((2, 32, 64), "float32"), np.zeros((2,), "int32"))
    def lstm():
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((20, 16)), keras.layers.LSTM(32, return_sequences=True), keras.layers.Dense(8), keras.layers.Flatten(), keras.layers.Dense(3)])
        m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m, (np.zeros((2, 20, 16), "float32"), np.zeros((2,), "int32"))
    return {"attention": attention, "lstm": lstm, "ResNet50": app("ResNet50"), "DenseNet121": app("DenseNet121"), "MobileNetV2": app("MobileNetV2")}

names = sys.argv[1:] or list(models())
for name in names:
    build = models()[name]
    model, sample = build()
    exact = TensorFlowStepPredictor(model, sample, Selection(min_bytes=0))
    scaled = TensorFlowStepPredictor(model, sample, Selection(min_bytes=0))
    worst = 0
    t = time.perf_counter(); scaled.trace(8); print(name, f"first trace {time.perf_counter()-t:.1f}s"); scaled.rescale_batches = True
    for b in (16, 24, 40, 5):
        e0, s0 = exact.predict(0, 1, b), scaled.predict(0, 1, b)
        e1, s1 = exact.predict(-1, 1, b), scaled.predict(-1, 1, b)
        ep, sp = exact.planned(1, b, capacity_bytes=int(e0.peak_bytes * 0.9)), scaled.planned(1, b, capacity_bytes=int(e0.peak_bytes * 0.9))
        ec, sc = exact.estimated_compute_s(b, "/CPU:0"), scaled.estimated_compute_s(b, "/CPU:0")
        row = [(e0.peak_bytes, s0.peak_bytes), (e1.peak_bytes, s1.peak_bytes), (ep.peak_bytes, sp.peak_bytes), (len(exact.eligible(1,b)), len(scaled.eligible(1,b))), (ec, sc)]
        rel = max(abs(a - c) / max(a, 1e-12) for a, c in row)
        worst = max(worst, rel)
        print(f"  b={b}: " + "; ".join(f"{a:.4g}/{c:.4g}" for a, c in row) + f"  max rel {rel:.2e}")
    print(f"  {name}: worst {worst:.2e}, scaled traced {scaled._traced}", flush=True)
