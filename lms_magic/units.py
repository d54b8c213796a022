"""Memory sizes: the one definition of MiB, reading sizes such as "6GiB", and formatting them.

Sizes are bytes everywhere inside the package (``peak_bytes``); MiB appear
only at the edges, in text for people.
"""

from __future__ import annotations

import re

MIB = 2**20
GIB = 2**30

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: int | float | str) -> int:
    """Reads a memory size: a number of bytes, or a string such as ``"6GiB"`` or ``"500 MB"``.

    Raises:
        ValueError: the value is not a positive size (the message shows the accepted forms).

    Example:
        >>> parse_bytes("6GiB"), parse_bytes("1.5 MB"), parse_bytes(1024)
        (6442450944, 1500000, 1024)
    """
    if isinstance(value, bool):
        raise ValueError(f"not a memory size: {value!r}")
    if isinstance(value, (int, float)):
        n_bytes = int(value)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        if not match or match.group(2).lower() not in _UNITS:
            raise ValueError(f"not a memory size: {value!r}; use bytes or a string such as '6GiB', '512MiB', '8GB'")
        n_bytes = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if n_bytes <= 0:
        raise ValueError(f"a memory size must be positive, got {value!r}")
    return n_bytes


def format_mib(n_bytes: int | float) -> str:
    """A size for people, in MiB with one decimal.

    Example:
        >>> format_mib(3 * 2**20 + 2**19)
        '3.5 MiB'
    """
    return f"{n_bytes / MIB:.1f} MiB"


def format_size(n_bytes: int | float) -> str:
    """A size for people: GiB with two decimals from 1 GiB, MiB with one from 1 MiB, else KiB with one.

    Example:
        >>> format_size(1.43 * 2**30), format_size(540 * 2**20), format_size(1536)
        ('1.43 GiB', '540.0 MiB', '1.5 KiB')
    """
    if n_bytes >= GIB:
        return f"{n_bytes / GIB:.2f} GiB"
    return format_mib(n_bytes) if n_bytes >= MIB else f"{n_bytes / 2**10:.1f} KiB"
