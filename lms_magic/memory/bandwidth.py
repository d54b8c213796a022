"""The host link's bandwidth: a one-off pinned copy to and from the GPU, or a stated default.

LMS's step time cannot beat ``bytes moved / bandwidth``; the tuner draws that
bound, so it needs the bandwidth of *this* machine's link. PyTorch (pinned
host tensors, ``non_blocking`` copies) measures it where it is imported and
sees a GPU; otherwise TensorFlow copies to its first GPU; with no GPU the
default below is used and the tuner says so.
"""

from __future__ import annotations

import functools
import sys
import time
from dataclasses import dataclass
from typing import Callable

DEFAULT_BYTES_PER_S = 12e9  # a PCIe 3.0 x16 link, as measured with pinned copies (Colab's T4, V100 machines)
COPY_BYTES = 256 * 2**20


@dataclass(frozen=True)
class LinkBandwidth:
    """Host-to-device and device-to-host copy bandwidth (bytes/s), and where the figures come from."""

    host_to_device: float
    device_to_host: float
    source: str

    @property
    def slowest(self) -> float:
        return min(self.host_to_device, self.device_to_host)


def time_copies(copy: Callable[[], None], sync: Callable[[], None], nbytes: int, repeats: int = 5,
                clock: Callable[[], float] = time.perf_counter) -> float:
    """Bytes per second of ``copy`` (after one warm-up), the median of ``repeats`` timed copies.

    Example:
        >>> ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.5])
        >>> time_copies(lambda: None, lambda: None, 100, repeats=3, clock=lambda: next(ticks))
        200.0
    """
    copy()
    sync()
    rates = []
    for _ in range(repeats):
        started = clock()
        copy()
        sync()
        rates.append(nbytes / max(clock() - started, 1e-9))
    return sorted(rates)[len(rates) // 2]


def _torch_bandwidth() -> LinkBandwidth | None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    host = torch.empty(COPY_BYTES, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    sync = torch.cuda.synchronize
    up = time_copies(lambda: device.copy_(host, non_blocking=True), sync, COPY_BYTES)
    down = time_copies(lambda: host.copy_(device, non_blocking=True), sync, COPY_BYTES)
    return LinkBandwidth(up, down, f"measured: pinned copies with PyTorch on {torch.cuda.get_device_name()}")


def _tensorflow_bandwidth() -> LinkBandwidth | None:
    tf = sys.modules.get("tensorflow")
    if tf is None or not tf.config.list_logical_devices("GPU"):
        return None
    import numpy as np

    with tf.device("/CPU:0"):
        host = tf.constant(np.ones(COPY_BYTES // 4, "float32"))  # made once: the timed upload is the copy only
    holder = {}

    def up():
        with tf.device("/GPU:0"):
            holder["device"] = tf.identity(host)

    def uploaded():  # waits for the upload by reading one element computed on the GPU, not the whole tensor
        with tf.device("/GPU:0"):
            tf.reduce_sum(holder["device"][:1]).numpy()

    def down():
        holder["host"] = holder["device"].numpy()

    rate_up = time_copies(up, uploaded, COPY_BYTES)
    rate_down = time_copies(down, lambda: None, COPY_BYTES)
    return LinkBandwidth(rate_up, rate_down, "measured: copies with TensorFlow to /GPU:0 (its own staging)")


MEASURES = (_torch_bandwidth, _tensorflow_bandwidth)  # tried in turn; the first that answers is used


@functools.cache
def host_link_bandwidth() -> LinkBandwidth:
    """This machine's host link bandwidth, measured once per process (or the stated default).

    Example:
        >>> host_link_bandwidth().slowest > 0
        True
    """
    for measure in MEASURES:
        try:
            found = measure()
        except Exception:  # a figure for a bound must never break the tuner
            found = None
        if found is not None:
            return found
    return LinkBandwidth(DEFAULT_BYTES_PER_S, DEFAULT_BYTES_PER_S,
                         f"no GPU: a stated default of {DEFAULT_BYTES_PER_S / 1e9:.0f} GB/s (PCIe 3.0 x16)")
