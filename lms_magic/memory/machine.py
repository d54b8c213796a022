"""The CPU in words: its model and widest vector extension. A CPU kernel's scratch differs by them (Eigen and
oneDNN size their buffers by the CPU), so every figure measured on a CPU names it."""

from __future__ import annotations

import functools
import os
import platform

VECTORS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"))


def describe_cpu(cpuinfo: str, fallback: str = "") -> str:
    """The CPU of a ``/proc/cpuinfo`` text: its model and widest vector extension.

    Example:
        >>> describe_cpu("model name\\t: AMD EPYC 7R13 Processor\\nflags\\t\\t: fpu avx avx2\\n")
        'AMD EPYC 7R13 Processor, AVX2'
        >>> describe_cpu("", fallback="arm64")
        'arm64'
    """
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    model = fields.get("model name") or fallback
    flags = set(fields.get("flags", "").split())
    widest = next((name for flag, name in VECTORS if flag in flags), "")
    return ", ".join(part for part in (model, widest) if part)


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    """This machine's CPU ("AMD EPYC 7R13 Processor, AVX2"); the platform's word for it where Linux's
    ``/proc/cpuinfo`` is not there.

    Example:
        >>> bool(cpu_name())
        True
    """
    fallback = platform.processor() or platform.machine() or "an unknown CPU"
    # oneDNN told to use fewer vector extensions than the CPU has: its kernels are those of such a CPU
    held = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    suffix = f" (oneDNN held to {held})" if held else ""
    try:
        with open("/proc/cpuinfo") as info:
            return describe_cpu(info.read(), fallback) + suffix
    except OSError:
        return fallback + suffix


__all__ = ["cpu_name", "describe_cpu"]
