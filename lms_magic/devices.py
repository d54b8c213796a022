"""The devices LMS uses by default, and a simulated accelerator for machines without a GPU.

On a CPU-only machine (binder, a CPU Colab) there is no device memory to save,
so LMS does nothing there. :func:`simulate_accelerator` splits TensorFlow's CPU
into two logical devices: ``/CPU:0`` plays the accelerator (where TensorFlow
places the model's ops by default) and ``/CPU:1`` the host, so that
``%%lms_fit`` and ``%lms_tune`` show the swaps and the predicted accelerator
peaks. The memory is the same RAM: the figures are the liveness replay's
predictions, not a GPU's measurements.
"""

from __future__ import annotations

_simulated = False


def simulate_accelerator() -> bool:
    """Makes TensorFlow's CPU two logical devices, ``/CPU:0`` (the accelerator) and ``/CPU:1`` (the host),
    where there is no GPU; LMS's defaults then use them.

    Call it before TensorFlow runs anything (right after ``%load_ext lms_magic``).

    Returns:
        True where it split the CPU (or had already), False where a GPU exists (nothing is changed).

    Raises:
        RuntimeError: TensorFlow has already initialised its devices (the message says what to do).
        ValueError: the Keras backend is not TensorFlow.

    Example:
        >>> import lms_magic
        >>> lms_magic.simulate_accelerator()  # doctest: +SKIP
        True
    """
    global _simulated
    import os

    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
        raise ValueError("simulate_accelerator() splits TensorFlow's CPU; with KERAS_BACKEND="
                         f"{os.environ['KERAS_BACKEND']!r} use a GPU machine to see LMS at work")
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return False
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    except RuntimeError:  # initialised: fine if already split (a second call)
        if len(tf.config.list_logical_devices("CPU")) >= 2:
            _simulated = True
            return True
        raise RuntimeError("simulate_accelerator() must run before TensorFlow initialises its devices, and "
                           "something in this process has already run TensorFlow: restart the kernel and call "
                           "it first, right after %load_ext lms_magic") from None
    _simulated = True
    return True


def default_device() -> str | None:
    """LMS's accelerator when none is given: None (the first GPU, found by the backend), or ``/CPU:0`` when
    the accelerator is simulated."""
    return "/CPU:0" if _simulated else None


def default_host() -> str:
    """Where swapped tensors wait when no host device is given: ``/CPU:1`` when the accelerator is simulated,
    else ``/CPU:0``."""
    return "/CPU:1" if _simulated else "/CPU:0"
