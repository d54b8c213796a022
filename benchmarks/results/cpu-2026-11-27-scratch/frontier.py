"""explain_fit's frontier on lms_demo's CNN (128x128, batch 8, a simulated 64 MiB device): without LMS and LMS."""
import sys
import lms_magic
lms_magic.simulate_accelerator(memory="64MiB")
import numpy as np, keras
size, batch = 128, 8
rng = np.random.default_rng(0)
images = rng.random((batch * 4, size, size, 3), dtype='float32'); labels = rng.integers(0, 10, len(images))
keras.utils.set_random_seed(2)
cnn = keras.Sequential([keras.Input((size, size, 3))] + [keras.layers.Conv2D(16, 3, padding='same', activation='relu') for _ in range(8)] + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
cnn.compile('sgd', keras.losses.SparseCategoricalCrossentropy(from_logits=True))
found = lms_magic.explain_fit(cnn, (images, labels), batch_size=batch, modes=('without LMS', 'LMS'), batch_sizes=(1, 2, 4, 8, 16))
print(found)
persistent = found.peak["by_kind"]["weights"] + found.peak["by_kind"]["optimizer_state"]
print("step MiB by batch", {p.mode: {} for p in found.frontier} and {(p.batch_size, p.mode): round((p.peak_bytes - persistent) / 2**20, 1) for p in found.frontier})
