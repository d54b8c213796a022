"""What a BFC allocator that grows on demand counts in use for one large request (pure Python).

TensorFlow's GPUs and JAX's GPUs allocate through the BFC allocator (``tsl/framework/bfc_allocator.cc``). Where it
grows on demand (JAX with ``XLA_PYTHON_CLIENT_PREALLOCATE=false``, TensorFlow with memory growth), a request no free
chunk serves takes a new region from the device, each region twice the last (from 2 MiB) and at least the
request. The region's chunk is split only where it is at least twice the request or leaves 128 MiB or more;
otherwise the whole chunk is in use, and counted in the allocator's peak. XLA takes a step's temporaries as one
allocation, so on a growing pool a step of 163 MiB of temporaries holds a chunk of 256 MiB (an H200, JAX 0.11:
docs/measurements_gpu.md). Where the pool was taken whole at the start (JAX's default), a request splits from it
and holds its own size.

Example:
    >>> MIB = 1 << 20
    >>> [chunk_bytes(n * MIB) // MIB for n in (97, 150, 254, 310)]
    [128, 256, 256, 310]
"""

from __future__ import annotations

FIRST_REGION_BYTES = 2 << 20  # the first region a growing pool takes (tsl: 2 MiB where growth is allowed)
MAX_INTERNAL_FRAGMENTATION_BYTES = 128 << 20  # a chunk leaving this much or more is split (tsl: kMax...)
GRANULE_BYTES = 256  # every request is rounded up to this


def region_bytes(request_bytes: int) -> int:
    """The region a growing pool takes for a request no free chunk serves: the first size of 2 MiB doubled
    that holds it (regions taken before may have doubled past it: this is the smallest it can be)."""
    region = FIRST_REGION_BYTES
    while region < request_bytes:
        region *= 2
    return region


def chunk_bytes(request_bytes: int) -> int:
    """What the allocator counts in use for ``request_bytes`` served from a region of :func:`region_bytes`: the
    whole region where splitting it would leave less than the request and less than 128 MiB, else the request
    (rounded to 256 bytes)."""
    rounded = -(-request_bytes // GRANULE_BYTES) * GRANULE_BYTES
    region = region_bytes(rounded)
    if region >= 2 * rounded or region - rounded >= MAX_INTERNAL_FRAGMENTATION_BYTES:
        return rounded
    return region
