"""The one place that chooses a framework (``lms/backend.py``'s ``Framework``) by Keras's backend name, and the
checks every framework's answers go through.

A framework (``tensorflow/framework.py``, ``torch/framework.py``, ``jax/framework.py``) answers the same
questions, so the callback, the magics and the tuner ask and never compare a backend's name. Pure: no
framework is imported here.
"""

from __future__ import annotations

from .backend import Framework
from .options import LmsOptions, OptionError


NAMES = ("tensorflow", "torch", "jax")


def unsupported_message(backend: str) -> str:
    """The error LMS raises on a Keras backend it cannot offload on.

    Example:
        >>> "KERAS_BACKEND=jax" in unsupported_message("numpy")
        True
    """
    return (f"LMS runs on Keras's TensorFlow, PyTorch and JAX backends; this Keras uses {backend!r}: set "
            "KERAS_BACKEND=jax, torch or tensorflow before importing keras")


def framework(name: str | None = None) -> type[Framework]:
    """The framework of Keras's backend ``name`` (Keras's own by default).

    Raises:
        RuntimeError: a Keras backend LMS does not run on (the message says which it does).

    Example:
        >>> framework("tensorflow").name
        'tensorflow'
    """
    if name is None:
        import keras

        name = keras.backend.backend()
    if name == "tensorflow":
        from .tensorflow.framework import TensorFlowFramework as chosen
    elif name == "torch":
        from .torch.framework import TorchFramework as chosen
    elif name == "jax":
        from .jax.framework import JaxFramework as chosen
    else:
        raise RuntimeError(unsupported_message(name))
    return chosen


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
    from .devices import check_known_devices

    check_known_devices(device, host_device, framework(backend).devices())


def refuse_unavailable(options: LmsOptions, unavailable: dict[str, str],
                       names=("lean_ops", "order_backward", "device", "host_device")) -> None:
    """Raises OptionError for an option set that a framework does not take (``unavailable``'s).

    Example:
        >>> refuse_unavailable(LmsOptions(lean_ops=True), {"lean_ops": "not here"})
        Traceback (most recent call last):
        ...
        lms_magic.lms.options.OptionError: lean_ops=True: not here
    """
    for name in names:
        value = getattr(options, name)
        if name in unavailable and value not in (None, False):
            raise OptionError(name, value, unavailable[name])
