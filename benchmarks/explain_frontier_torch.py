"""``explain_fit`` on PyTorch: its time for a frontier over many batch sizes (nothing trained).

keras.applications' ResNet50 at 224x224 (no weights downloaded), SGD with momentum, against a 16 GiB device: the
step run at batch sizes 2 and 3, the explanation at ``--batch``, the largest batch without LMS and with it, and the
frontier at every ``--step`` from ``--step`` to ``--largest``.

    KERAS_BACKEND=torch python benchmarks/explain_frontier_torch.py --batch 64 --step 64 --largest 1024
"""

import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "torch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step", type=int, default=64)
    parser.add_argument("--largest", type=int, default=1024)
    parser.add_argument("--capacity", default="16GiB")
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    import keras
    import numpy as np
    import torch

    import lms_magic

    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(args.size, args.size, 3))
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
    data = (np.zeros((2, args.size, args.size, 3), "float32"), np.zeros(2, "int32"))
    sizes = list(range(args.step, args.largest + 1, args.step))
    started = time.perf_counter()
    found = lms_magic.explain_fit(model, data, batch_size=args.batch, capacity=args.capacity, batch_sizes=sizes,
                                  modes=("without LMS", "LMS"))
    wall_s = time.perf_counter() - started
    print(f"PyTorch {torch.__version__}, Keras {keras.__version__}, ResNet50 {args.size}x{args.size}, batch {args.batch}, "
          f"capacity {args.capacity}, frontier at {len(sizes)} batch sizes {sizes[0]}..{sizes[-1]} x 2 ways "
          f"({'CUDA' if torch.cuda.is_available() else 'CPU'})")
    print(f"explain_fit: {wall_s:.1f} s")
    print(found)


if __name__ == "__main__":
    main()
