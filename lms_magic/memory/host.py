"""Host (CPU) memory of this process: current RSS and the exact peak.

On Linux the kernel keeps the resident-set high-water mark (``VmHWM`` in
``/proc/self/status``) and lets a process reset it by writing ``5`` to
``/proc/self/clear_refs``. That gives an *exact* peak for a window of time,
one that a sampler cannot miss however short the spike. Elsewhere (or where a
sandbox forbids the reset) the caller falls back to the sampled maximum.

Windows can nest (``%%gpumem`` inside a cell profiled by ``profile_memory``).
A reset by the inner window would hide the outer window's earlier peak, so
before every reset the current high-water mark is handed to every open window
(:class:`PeakWindow` keeps the maximum it has been told about).
"""

from __future__ import annotations

import os
import sys
import threading

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STATUS_PATH = "/proc/self/status"
_STATM_PATH = "/proc/self/statm"
_CLEAR_REFS_PATH = "/proc/self/clear_refs"


def rss_bytes() -> int:
    """Returns the resident set size of this process, in bytes.

    Reads ``/proc/self/statm`` on Linux (a few microseconds) and asks psutil
    elsewhere.

    Example:
        >>> rss_bytes() > 0
        True
    """
    if sys.platform.startswith("linux"):
        with open(_STATM_PATH, "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    import psutil

    return int(psutil.Process().memory_info().rss)


def high_water_mark_bytes() -> int | None:
    """Returns the kernel's resident high-water mark (``VmHWM``), or None."""
    try:
        with open(_STATUS_PATH, "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_high_water_mark() -> bool:
    """Resets ``VmHWM`` to the current RSS. Returns False where not allowed."""
    try:
        with open(_CLEAR_REFS_PATH, "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


class PeakWindow:
    """The exact host peak of this process between :meth:`open` and :meth:`close`.

    Args:
        enabled: try the kernel's high-water mark. Defaults to True; with False
            (or off Linux) :attr:`exact` is False and the caller uses samples.

    Example:
        >>> window = PeakWindow().open()
        >>> block = bytearray(64 * 2**20)
        >>> del block
        >>> peak = window.close()
        >>> peak is None or peak >= 64 * 2**20
        True
    """

    _lock = threading.Lock()
    _open_windows: list["PeakWindow"] = []

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.exact = False
        self._seen_peak_bytes = 0

    def open(self) -> "PeakWindow":
        if not (self.enabled and sys.platform.startswith("linux")):
            return self
        with PeakWindow._lock:
            _hand_over_high_water_mark()
            self.exact = _reset_high_water_mark()
            if self.exact:
                PeakWindow._open_windows.append(self)
        return self

    def close(self) -> int | None:
        """Ends the window; returns its exact peak in bytes, or None."""
        if not self.exact:
            return None
        with PeakWindow._lock:
            hwm = high_water_mark_bytes()
            if self in PeakWindow._open_windows:
                PeakWindow._open_windows.remove(self)
        if hwm is None:
            self.exact = False
            return None
        return max(hwm, self._seen_peak_bytes)


def _hand_over_high_water_mark() -> None:
    """Tells every open window the current ``VmHWM`` before it is reset."""
    if not PeakWindow._open_windows:
        return
    hwm = high_water_mark_bytes() or 0
    for window in PeakWindow._open_windows:
        window._seen_peak_bytes = max(window._seen_peak_bytes, hwm)
