import sys
import lms_magic
lms_magic.simulate_accelerator(memory="256MiB")
import numpy as np, keras
from lms_magic.memory.frameworks import resettable_counter
from lms_magic.sizing.measured import StepPeaks
L = keras.layers
kind, batch = sys.argv[1], int(sys.argv[2])
keras.utils.set_random_seed(3)
if kind == "f64":
    m = keras.Sequential([keras.Input((48, 48, 3))] + [L.Conv2D(16, 3, padding="same", activation="relu", dtype="float64") for _ in range(3)] + [L.GlobalAveragePooling2D(dtype="float64"), L.Dense(10, dtype="float64")])
    x = np.random.rand(batch * 4, 48, 48, 3)
else:
    m = keras.Sequential([keras.Input((128, 128, 3))] + [L.Conv2D(16, 3, padding='same', activation='relu') for _ in range(8)] + [L.GlobalAveragePooling2D(), L.Dense(10)])
    x = np.random.rand(batch * 4, 128, 128, 3).astype("float32")
m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
y = np.random.randint(0, 10, len(x))
p = StepPeaks(resettable_counter("/CPU:0"), skip=1)
m.fit(x, y, batch_size=batch, verbose=0, callbacks=[p])
print(kind, batch, [round(b / 2**20, 1) for b in p.step_bytes])
