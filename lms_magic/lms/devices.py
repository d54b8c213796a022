"""The devices LMS uses by default, and a simulated accelerator for machines without a GPU.

On a CPU-only machine (binder, a CPU Colab) there is no device memory to save,
so LMS does nothing there. :func:`simulate_accelerator` splits TensorFlow's CPU
into logical devices: ``/CPU:0`` plays the accelerator (where TensorFlow
places the model's ops by default) and ``/CPU:1`` the host, so that
``%%lms_fit`` and ``%lms_tune`` show the swaps and the predicted accelerator
peaks; with ``accelerators=N``, ``/CPU:0`` .. ``/CPU:N-1`` play N accelerators
(for a ``MirroredStrategy``) and ``/CPU:N`` the host. The memory is the same
RAM, in TensorFlow's one CPU allocator: a plain step's peak can be read from it
(``explain_fit``'s measured steps), a step with LMS's cannot (what moved to the
host counts there too). That allocator is made the one a GPU has (BFC, which
counts every tensor): oneDNN's, TensorFlow's default on a CPU, serves tensors
under 256 KiB from malloc and counts none of them. One accelerator runs one op
at a time, as a GPU's compute stream does (and as the liveness replay models): TensorFlow's CPU otherwise runs
independent ops side by side, and a step's measured peak then holds more, and
moves from step to step (docs/measurements.md).
"""

from __future__ import annotations

from .options import OptionError

BFC_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"  # TensorFlow's switch to the allocator its GPUs use, for its CPU
_simulated = False
_simulated_memory_bytes: int | None = None  # the simulated accelerator's capacity, if one was given
_accelerators = 1  # how many logical CPUs play accelerators (the next one is the host)


def simulate_accelerator(memory=None, accelerators: int = 1) -> bool:
    """Makes TensorFlow's CPU logical devices, ``/CPU:0`` (the accelerator) and ``/CPU:1`` (the host),
    where there is no GPU; LMS's defaults then use them. With ``accelerators=N``: ``/CPU:0`` .. ``/CPU:N-1``
    play N accelerators (a ``tf.distribute.MirroredStrategy`` over them trains a replica on each, as on
    Kaggle's two GPUs) and ``/CPU:N`` the host.

    Call it before TensorFlow runs anything (right after ``%load_ext lms_magic``). With one accelerator,
    TensorFlow runs one op at a time (``inter_op_parallelism_threads`` 1; each op still uses every core).
    It sets ``TF_CPU_ALLOCATOR_USE_BFC=true`` where it is unset: the CPU's allocator then counts every
    tensor, as a GPU's does (oneDNN's counts none under 256 KiB).

    Args:
        memory: the simulated accelerator's capacity, in bytes or as "512MiB": LMS then plans to fit it, as
            on a GPU (nothing moves when the step fits). Defaults to None (no capacity: the lowest peak).
        accelerators: how many accelerators to simulate, each with ``memory``. Defaults to 1.

    Returns:
        True where it split the CPU (or had already), False where a GPU exists (nothing is changed).

    Raises:
        RuntimeError: TensorFlow has already initialised its devices (the message says what to do).
        ValueError: the Keras backend is not TensorFlow, ``memory`` is not a size, or ``accelerators`` is
            not a whole number >= 1.

    Example:
        >>> import lms_magic
        >>> lms_magic.simulate_accelerator()  # doctest: +SKIP
        True
    """
    global _simulated, _simulated_memory_bytes, _accelerators
    import os

    from ..units import parse_bytes

    memory_bytes = None if memory is None else parse_bytes(memory)
    if isinstance(accelerators, bool) or not isinstance(accelerators, int) or accelerators < 1:
        raise ValueError(f"accelerators must be a whole number >= 1, got {accelerators!r}")
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
        raise ValueError("simulate_accelerator() splits TensorFlow's CPU; with KERAS_BACKEND="
                         f"{os.environ['KERAS_BACKEND']!r} use a GPU machine to see LMS at work")
    from ..quiet import start_up_lines_hidden

    with start_up_lines_hidden():  # the first import of TensorFlow in a notebook, usually: no start-up lines
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return False
    os.environ.setdefault(BFC_VARIABLE, "true")  # read when TensorFlow makes its CPU allocator, at device set-up
    if not split_cpu(accelerators + 1, one_op_at_a_time=accelerators == 1):
        raise RuntimeError("simulate_accelerator() must run before TensorFlow initialises its devices, and "
                           "something in this process has already run TensorFlow: restart the kernel and call "
                           "it first, right after %load_ext lms_magic")
    _simulated, _simulated_memory_bytes, _accelerators = True, memory_bytes, accelerators
    return True


def split_cpu(devices: int, one_op_at_a_time: bool = True, intra_op_threads: int | None = None) -> bool:
    """TensorFlow's CPU as ``devices`` logical devices (what :func:`simulate_accelerator` makes, without making
    them LMS's defaults: the tests and benchmarks name the devices). ``one_op_at_a_time``: one inter-op thread, as
    a GPU's compute stream runs. ``intra_op_threads``: the threads one op may use (a share of the cores, where
    several processes run side by side). Returns whether the CPU is split so: False where TensorFlow had started
    with fewer devices (its devices are fixed when its runtime starts).

    Example:
        >>> split_cpu(2)  # doctest: +SKIP
        True
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * devices)
        if one_op_at_a_time:
            tf.config.threading.set_inter_op_parallelism_threads(1)
        if intra_op_threads is not None:
            tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
    except RuntimeError:  # initialised: fine if already split so (a second call)
        return len(tf.config.list_logical_devices("CPU")) >= devices
    return True


def default_device() -> str | None:
    """LMS's accelerator when none is given: None (the first GPU, found by the backend), or ``/CPU:0`` when
    the accelerator is simulated."""
    return "/CPU:0" if _simulated else None


def default_host() -> str:
    """Where swapped tensors wait when no host device is given: the CPU after the simulated accelerators
    (``/CPU:1`` for one), else ``/CPU:0``."""
    return f"/CPU:{_accelerators}" if _simulated else "/CPU:0"


def is_simulated(device: str | None) -> bool:
    """Whether ``device`` ("/CPU:1") is one of the simulated accelerators.

    Example:
        >>> is_simulated("/GPU:0")
        False
    """
    if not _simulated or device is None or not device.startswith("/CPU:"):
        return False
    return int(device.rsplit(":", 1)[1]) < _accelerators


def simulated_memory_bytes() -> int | None:
    """The simulated accelerator's capacity (``simulate_accelerator(memory=...)``), or None."""
    return _simulated_memory_bytes if _simulated else None


def check_known_devices(device: str | None, host_device: str | None, known: list[str]) -> None:
    """Raises OptionError, naming the devices this process has (``known``), where ``device`` or ``host_device``
    (spelt as ``LmsOptions`` spells them) is not one of them.

    Example:
        >>> check_known_devices("/CPU:0", None, ["/CPU:0"])
        >>> check_known_devices("banana", None, ["/CPU:0"])
        Traceback (most recent call last):
        ...
        lms_magic.lms.options.OptionError: device='banana': is not a device of this process, which has /CPU:0: pass one of them, such as '/CPU:0'
    """
    for role, spec in (("device", device), ("host_device", host_device)):
        if spec is not None and spec not in known:
            example = known[-1] if role == "device" else known[0]
            raise OptionError(role, spec, f"is not a device of this process, which has {', '.join(known)}: pass one "
                                          f"of them, such as {example!r}")


def nvml_total_bytes(cuda_index: int) -> int | None:
    """The total memory of the ``cuda_index``-th GPU CUDA programs see, or None where NVML cannot say."""
    from ..memory.nvml import NvmlSource, visible_indices

    source = NvmlSource()
    try:
        source.open()
        indices = visible_indices(source)
        return source.total_bytes(indices[cuda_index]) if cuda_index < len(indices) else None
    except Exception:  # no NVML: no capacity, and LMS plans for the lowest peak
        return None
