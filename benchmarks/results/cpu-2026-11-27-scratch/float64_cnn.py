import sys
import lms_magic
lms_magic.simulate_accelerator(memory="256MiB")
import numpy as np, keras
L = keras.layers
def cnn64(size=48):
    keras.utils.set_random_seed(3)
    m = keras.Sequential([keras.Input((size, size, 3))] + [L.Conv2D(16, 3, padding="same", activation="relu", dtype="float64") for _ in range(3)] + [L.GlobalAveragePooling2D(dtype="float64"), L.Dense(10, dtype="float64")])
    m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m
m = cnn64()
rng = np.random.default_rng(0)
x = rng.random((64, 48, 48, 3)); y = rng.integers(0, 10, 64)
found = lms_magic.explain_fit(m, (x, y), batch_size=int(sys.argv[1]), modes=("without LMS", "LMS"), batch_sizes=(2, 4, 8, 16), min_bytes=0)
print(found)
c = found.correction
print(c)
lms = lms_magic.LMS(verbose=1, min_bytes=0)
m.fit(x[:16], y[:16], batch_size=8, epochs=1, verbose=0, callbacks=[lms])
print(lms.stats.peak_without_lms["by_kind"], [r for r in lms.stats.peak_without_lms["top"] if r["kind"] == "kernel_scratch"])
