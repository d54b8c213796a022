"""Allocator counters: read only for frameworks already imported and started (memory/frameworks.py)."""

import subprocess
import sys
import textwrap

from lms_magic.memory.frameworks import discover_counters


def run_python(code: str, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          env={"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "1", "PATH": "/usr/bin:/bin",
                               **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_no_framework_imported_no_counter():
    assert discover_counters({}) == ([], [])


def test_tensorflow_imported_but_not_started_is_not_started_by_asking():
    out = run_python("""
        import tensorflow as tf
        from lms_magic.memory.frameworks import discover_counters
        counters, notes = discover_counters()
        from tensorflow.python.eager import context
        print(len(counters), notes, context.context()._initialized)
    """)
    assert out == "0 [] False"


def test_tensorflow_started_gives_its_cpu_allocator_exactly():
    out = run_python("""
        import tensorflow as tf
        warm = tf.ones((4,))
        from lms_magic.memory.frameworks import discover_counters
        (counter,), notes = discover_counters()
        counter.reset()
        before = counter.read()[0]
        block = tf.ones((1024, 1024))  # 4 MiB
        del block
        current, peak = counter.read()
        print(counter.framework, counter.device, counter.gpu_index, peak - before == 4 * 2**20, current == before)
    """)
    assert out == "TensorFlow CPU:0 None True True"


def test_oneDNNs_cpu_allocator_that_misses_small_tensors_is_told_apart():
    """oneDNN's CPU allocator serves tensors under 256 KiB from malloc and counts none; with
    TF_CPU_ALLOCATOR_USE_BFC=true TensorFlow's CPU gets a GPU's allocator, which counts them all."""
    code = """
        import tensorflow as tf
        warm = tf.ones((4,))
        from lms_magic.memory.frameworks import discover_counters
        (counter,), notes = discover_counters()
        before = counter.read()[0]
        small = tf.ones((25000,))  # 100 kB
        print(counter.counts_every_tensor(), counter.read()[0] - before >= 100000)
    """
    assert run_python(code) == "False False"
    assert run_python(code, TF_CPU_ALLOCATOR_USE_BFC="true") == "True True"


class Broken:
    """A framework whose allocator query fails."""

    class config:  # noqa: N801 (tensorflow.config's name)
        @staticmethod
        def list_logical_devices():
            raise RuntimeError("driver gone")


def test_a_framework_that_fails_to_answer_is_a_note_not_an_error():
    class Context:
        _initialized = True

    started = type(sys)("tensorflow.python.eager.context")
    started.context = Context
    counters, notes = discover_counters({"tensorflow": Broken, "tensorflow.python.eager.context": started})
    assert counters == [] and notes == ["tensorflow allocator not read: driver gone"]
