"""What LMS asks of a deep-learning framework before and around a fit, and the one place that chooses it.

A framework (``tensorflow/framework.py``, ``torch/framework.py``, ``jax/framework.py``) answers the
same questions, so the callback, the magics and the tuner ask and never compare a backend's name:
the devices of this process, the device LMS relieves and its capacity, why LMS stays off, which
options it does not honour (and why), the backend that does one fit's work, the tuner's predictor
and where trials train. :func:`framework` is the only code that compares Keras's backend name.
Pure: no framework is imported here.
"""

from __future__ import annotations

from typing import Any, Protocol

from .core.stats import LmsStats
from .options import LmsOptions, OptionError


class Framework(Protocol):
    """One framework's answers (each class in ``<framework>/framework.py``; every member a class attribute or a
    static / class method: no instance is made)."""

    name: str  # Keras's name for the backend: "tensorflow", "torch", "jax"
    version_modules: tuple[str, ...]  # the framework modules whose versions LMS checks, besides Keras
    tuner_refusal: str | None  # why %lms_tune does not run on this framework, or None where it does
    trials_measure_peak: bool  # whether a measured trial on a GPU reads the allocator's peak (else the prediction)
    unavailable: dict[str, str]  # option -> why this framework does not honour it (said in the stats, refused by the tuner)

    @staticmethod
    def devices() -> list[str]:
        """The devices of this process, spelt as LMS spells them ("/CPU:0", "/GPU:0")."""

    @classmethod
    def prepare(cls, options: LmsOptions, stats: LmsStats) -> LmsOptions:
        """The options with the devices checked and filled in; the device's capacity in ``stats``."""

    @staticmethod
    def off_reason(options: LmsOptions) -> tuple[str, str] | None:
        """Why LMS stays off with these (prepared) options (the stats' reason, and the notice for the user), or
        None."""

    @staticmethod
    def backend() -> Any:
        """The class that does one fit's work (``lms/backend.py``'s ``Backend``)."""

    @staticmethod
    def predictor(model, samples, options: LmsOptions, lean_ops: bool, order_backward: bool, recompute) -> Any:
        """The tuner's predictor for ``options`` (raises ValueError where the tuner does not run)."""

    @staticmethod
    def trial_device() -> tuple[str | None, bool]:
        """The device measured trials train on (None: the framework's own choice), and whether it is a GPU."""

    @staticmethod
    def trial_peak_source(gpu: bool) -> str:
        """Where a trial's device peak comes from (measured or predicted, and how)."""


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
