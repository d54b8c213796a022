"""The pure core of LMS: which tensors to move (plan), the device memory a graph needs (simulate),
what fills the peak (peak), the tuner's search (search) and what a fit did (stats). No framework is
imported here and no op type is named: the adapters in ``tensorflow/`` and ``torch/`` translate."""
