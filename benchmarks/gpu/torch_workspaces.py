"""On a GPU with PyTorch: what the process holds after a Keras fit of the demo CNN beyond its tensors, which
allocations and from where (PyTorch's allocator history), and what releasing cuBLAS's cached workspaces frees
(issue 61: the fixed part explain_fit's peak without LMS missed).

    python benchmarks/gpu/torch_workspaces.py
"""
import os

os.environ["KERAS_BACKEND"] = "torch"
import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

print("CUBLAS_WORKSPACE_CONFIG", os.environ.get("CUBLAS_WORKSPACE_CONFIG"), "cudnn.benchmark", torch.backends.cudnn.benchmark,
      "arch", torch.cuda.get_device_capability())
torch.cuda.memory._record_memory_history(max_entries=200000, context="alloc", stacks="all")
keras.utils.set_random_seed(1)
layers = [keras.Input((128, 128, 3))] + [keras.layers.Conv2D(16, 3, padding="same", activation="relu") for _ in range(8)]
model = keras.Sequential(layers + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
rng = np.random.default_rng(0)
x = rng.random((16, 128, 128, 3), dtype="float32"); y = rng.integers(0, 10, 16)
a0 = torch.cuda.memory_allocated()
model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
torch.cuda.synchronize()
a1 = torch.cuda.memory_allocated()
variables = sum(v.value.nbytes for v in model.variables) + sum(v.value.nbytes for v in model.optimizer.variables)
print("allocated before fit", a0, "after", a1, "variables+optimizer", variables)
snap = torch.cuda.memory._snapshot()
blocks = []
for seg in snap["segments"]:
    for blk in seg["blocks"]:
        if blk["state"] == "active_allocated":
            frames = [f.get("name", "") for f in blk.get("frames", [])]
            interesting = [f for f in frames if any(k in f.lower() for k in ("cublas", "cudnn", "workspace", "blas", "conv", "empty", "lt"))][:4]
            blocks.append((blk["size"], interesting or frames[:3]))
blocks.sort(key=lambda b: -b[0])
print("live blocks", len(blocks), "total", sum(b[0] for b in blocks))
for size, frames in blocks[:12]:
    print(round(size / 2**20, 3), "MiB", frames)
try:
    before = torch.cuda.memory_allocated(); torch._C._cuda_clearCublasWorkspaces(); after = torch.cuda.memory_allocated()
    print("clearCublasWorkspaces freed", before - after)
except Exception as error:
    print("clearCublasWorkspaces:", error)
