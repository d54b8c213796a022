"""The CPU named in a CPU's figures (memory/machine.py)."""

from lms_magic.memory.machine import describe_cpu

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu vme avx avx2 avx512f avx512bw amx_tile
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8488C
"""


def test_a_cpu_is_named_by_its_model_and_widest_vectors():
    assert describe_cpu(INTEL) == "Intel(R) Xeon(R) Platinum 8488C, AVX-512"
    assert describe_cpu("model name\t: AMD EPYC 7B12\nflags\t: fpu avx avx2\n") == "AMD EPYC 7B12, AVX2"
    assert describe_cpu("processor\t: 0\nBogoMIPS\t: 50.00\n", fallback="aarch64") == "aarch64"


def test_a_cpu_whose_onednn_is_held_to_fewer_vectors_says_so(monkeypatch):
    """ONEDNN_MAX_CPU_ISA makes oneDNN run the kernels of a smaller CPU: a figure measured so says it."""
    from lms_magic.memory.machine import cpu_name

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    read = cpu_name.__wrapped__  # read once a process (oneDNN reads the variable once too)
    plain = read()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert read() == f"{plain} (oneDNN held to AVX2)"
