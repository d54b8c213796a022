"""Exact allocator counters of the frameworks the user has already imported.

NVML sees what a framework *reserved* from the driver (TensorFlow reserves
almost all of a GPU by default); the framework's own allocator knows what the
model *needs*. This module reads those counters for TensorFlow, PyTorch and
JAX, but only for a framework that is already in ``sys.modules`` and already
initialised: it never imports a framework, creates a CUDA context or
initialises TensorFlow's runtime (which would make ``set_memory_growth`` fail).
"""

from __future__ import annotations

import sys
from .. import internals



# What a counter that misses small tensors is told, and what to set (oneDNN's CPU allocator, TensorFlow's default)
MISSES_SMALL_TENSORS = "counts no tensor under 256 KiB"
BFC_ADVICE = "set TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts"


class AllocatorCounter:
    """One framework allocator on one device.

    Args:
        framework: display name ("TensorFlow", "PyTorch", "JAX").
        device: the framework's device name ("GPU:0", "CPU:0", "cuda:0").
        gpu_index: CUDA-visible GPU index, or None for host memory.
        resettable: whether the peak can be reset; if not, the peak of a
            window is exact only when the window set a new high.
    """

    def __init__(self, framework: str, device: str, gpu_index: int | None, resettable: bool = True):
        self.framework = framework
        self.device = device
        self.gpu_index = gpu_index
        self.resettable = resettable

    @property
    def key(self) -> tuple[str, str]:
        return self.framework, self.device

    def reset(self) -> None:
        """Resets the peak to the current use."""

    def read(self) -> tuple[int, int]:
        """Returns (current bytes, peak bytes)."""
        raise NotImplementedError

    def reserved_peak(self) -> int | None:
        """Peak bytes reserved from the driver, where the framework tells it."""
        return None

    def counts_every_tensor(self) -> bool:
        """Whether a small tensor made on the device shows in :meth:`read` (it runs one op where it asks)."""
        return True


class _TensorFlowCounter(AllocatorCounter):
    _every_tensor: dict[str, bool] = {}  # device -> counts_every_tensor(): fixed once TensorFlow made its allocator

    def __init__(self, tf_config, device: str, gpu_index: int | None):
        super().__init__("TensorFlow", device, gpu_index)
        self._experimental = tf_config.experimental

    def reset(self) -> None:
        self._experimental.reset_memory_stats(self.device)

    def read(self) -> tuple[int, int]:
        info = self._experimental.get_memory_info(self.device)
        return int(info["current"]), int(info["peak"])

    def counts_every_tensor(self) -> bool:
        """False for oneDNN's CPU allocator (TensorFlow's default on a CPU, unless ``TF_CPU_ALLOCATOR_USE_BFC=true``
        gave it a GPU's): it serves tensors under 256 KiB from malloc and counts none of them."""
        if self.gpu_index is not None:
            return True
        if self.device not in self._every_tensor:
            import tensorflow as tf

            before = self.read()[0]
            with tf.device(self.device):
                probe = tf.zeros([16384])  # 64 KiB
            self._every_tensor[self.device] = self.read()[0] - before >= 4 * int(probe.shape[0])
        return self._every_tensor[self.device]


class _TorchCounter(AllocatorCounter):
    def __init__(self, cuda, index: int):
        super().__init__("PyTorch", f"cuda:{index}", index)
        self._cuda = cuda
        self._index = index

    def reset(self) -> None:
        self._cuda.reset_peak_memory_stats(self._index)

    def read(self) -> tuple[int, int]:
        return int(self._cuda.memory_allocated(self._index)), int(self._cuda.max_memory_allocated(self._index))

    def reserved_peak(self) -> int | None:
        return int(self._cuda.max_memory_reserved(self._index))


class _JaxCounter(AllocatorCounter):
    def __init__(self, device, gpu_index: int | None):
        super().__init__("JAX", f"{device.platform}:{device.id}", gpu_index, resettable=False)
        self._device = device

    def read(self) -> tuple[int, int]:
        stats = self._device.memory_stats() or {}
        current = int(stats.get("bytes_in_use", 0))
        return current, int(stats.get("peak_bytes_in_use", current))


def _tensorflow_counters(modules) -> list[AllocatorCounter]:
    tf = modules.get("tensorflow")
    if tf is None or not internals.tensorflow_started(modules):
        return []  # reading would initialise TensorFlow and lock its GPU settings
    counters: list[AllocatorCounter] = []
    gpu_position = 0
    for device in tf.config.list_logical_devices():
        name = device.name.split("device:")[-1]
        if device.device_type == "GPU":
            counters.append(_TensorFlowCounter(tf.config, name, gpu_position))
            gpu_position += 1
        elif device.device_type == "CPU" and name == "CPU:0":
            counters.append(_TensorFlowCounter(tf.config, name, None))
    return counters


def _torch_counters(modules) -> list[AllocatorCounter]:
    torch = modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return []  # asking would create a CUDA context
    return [_TorchCounter(cuda, index) for index in range(cuda.device_count())]


def _jax_counters(modules) -> list[AllocatorCounter]:
    jax = modules.get("jax")
    if jax is None or not internals.jax_started(modules):
        return []  # asking would initialise JAX's backends and grab GPU memory
    counters: list[AllocatorCounter] = []
    for device in jax.local_devices():
        if device.memory_stats() is None:
            continue  # JAX's CPU client keeps no statistics
        gpu_index = device.id if device.platform in ("gpu", "cuda", "rocm") else None
        counters.append(_JaxCounter(device, gpu_index))
    return counters


def resettable_counter(device: str) -> AllocatorCounter | None:
    """The counter of ``device`` ("/GPU:0", "GPU:0", "cuda:0", "/CPU:0") among :func:`discover_counters`'s whose
    peak can be reset, or None. A GPU is matched under TensorFlow's and PyTorch's spellings alike.

    Example:
        >>> resettable_counter("/GPU:0") is None  # no framework imported in this doctest's process, or no GPU
        True
    """
    wanted = device.strip("/").lower()
    names = {wanted, wanted.replace("gpu:", "cuda:"), wanted.replace("cuda:", "gpu:")}
    return next((counter for counter in discover_counters()[0]
                 if counter.resettable and counter.device.lower() in names), None)


def discover_counters(modules=None) -> tuple[list[AllocatorCounter], list[str]]:
    """Finds the allocator counters that can be read without side effects.

    Args:
        modules: the module table to look in. Defaults to ``sys.modules``.

    Returns:
        The counters, and notes about frameworks that could not be read.

    Example:
        >>> counters, notes = discover_counters({})
        >>> counters, notes
        ([], [])
    """
    modules = sys.modules if modules is None else modules
    counters: list[AllocatorCounter] = []
    notes: list[str] = []
    for finder in (_tensorflow_counters, _torch_counters, _jax_counters):
        try:
            counters.extend(finder(modules))
        except Exception as error:  # a framework's own failure must not fail the cell
            notes.append(f"{finder.__name__[1:-9]} allocator not read: {error}")
    return counters, notes

