"""The BFC allocator's chunk for one large request on a pool that grows (``lms/core/bfc.py``), held to an H200."""

from lms_magic.lms.core.bfc import chunk_bytes, region_bytes

MIB = 1 << 20

# JAX 0.11.2 on an H200 with XLA_PYTHON_CLIENT_PREALLOCATE=false (benchmarks/results/h200-2026-11-28b): a Gemma-style
# LoRA fit's train step, XLA's temporaries, and the process's peak less the 9.8 MiB of its arguments. Left out: the
# two autotuned fits (fp32 8, bf16 8) whose peak the autotuner's own buffers made, at compile time
H200_STEPS = [  # (dtype and batch, autotuned or not, temporaries MiB, peak less arguments MiB)
    ("fp32 8", "none", 131.3, 256.1), ("fp32 16", "none", 253.5, 256.2), ("fp32 16", "autotuned", 309.5, 309.7),
    ("bf16 8", "none", 72.9, 128.1), ("bf16 16", "none", 141.2, 256.2), ("bf16 16", "autotuned", 149.2, 256.2),
]


def test_the_chunk_is_what_the_h200s_allocator_held_for_each_step():
    for name, autotuned, temporaries_mib, held_mib in H200_STEPS:
        chunk = chunk_bytes(int(temporaries_mib * MIB)) / MIB
        assert abs(chunk - held_mib) < 0.5, (name, autotuned, chunk, held_mib)


def test_a_region_is_split_where_it_would_waste_128_mib_or_half():
    assert region_bytes(300 * MIB) == 512 * MIB and chunk_bytes(300 * MIB) == 300 * MIB  # leaves 212 MiB: split
    assert chunk_bytes(600 * MIB) == 600 * MIB  # a 1 GiB region would leave 424 MiB: split
    assert chunk_bytes(1000 * MIB) == 1024 * MIB  # leaves 24 MiB: held whole
    assert chunk_bytes(1 * MIB) == 1 * MIB  # a 2 MiB region is twice the request: split
    assert chunk_bytes(1000) == 1024  # rounded to 256 bytes
