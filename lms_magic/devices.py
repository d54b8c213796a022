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


def framework_devices(backend: str) -> list[str]:
    """The devices of this process, as LMS spells them ("/CPU:0", "/GPU:0"), for Keras's ``backend``."""
    from .lms.options import device_name

    if backend == "torch":
        import torch

        return ["/CPU:0"] + [f"/GPU:{index}" for index in range(torch.cuda.device_count())]
    import tensorflow as tf

    return [device_name(device.name) for device in tf.config.list_logical_devices()]


def check_devices(device: str | None, host_device: str | None, backend: str | None = None) -> None:
    """Raises OptionError, naming the devices this process has, where ``device`` or ``host_device``
    (spelt as ``LmsOptions`` spells them) is not one of them (``backend``: Keras's by default).

    Example:
        >>> check_devices("/CPU:0", None, "tensorflow")
        >>> check_devices("banana", None, "tensorflow")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lms_magic.lms.options.OptionError: device='banana': is not a device of this process, which has /CPU:0...
    """
    from .lms.options import OptionError

    if backend is None:
        import keras

        backend = keras.backend.backend()
    known = framework_devices(backend)
    for role, spec in (("device", device), ("host_device", host_device)):
        if spec is not None and spec not in known:
            example = known[-1] if role == "device" else known[0]
            raise OptionError(role, spec, f"is not a device of this process, which has {', '.join(known)}: pass one "
                                          f"of them, such as {example!r}")


def accelerator(device: str | None, backend: str) -> str | None:
    """The device LMS relieves: ``device`` if given; else the first GPU, the simulated accelerator
    (:func:`simulate_accelerator`), or None (no GPU: nothing to relieve). On PyTorch, None leaves the
    choice to the backend (the device the model trains on)."""
    if device is not None or backend == "torch":
        return device
    gpus = [name for name in framework_devices(backend) if name.startswith("/GPU")]
    return gpus[0] if gpus else default_device()
