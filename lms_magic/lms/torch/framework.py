"""What LMS asks of PyTorch around a fit (``lms/framework.py``'s ``Framework``): devices, capacity, the backend.
PyTorch is imported inside the methods."""

from __future__ import annotations

from ..backend import Framework
from ..core.stats import LmsStats
from ..options import LmsOptions


class TorchFramework(Framework):
    """Keras's PyTorch backend: LMS offloads autograd's saved tensors (``backend.py``); ``explain_fit`` predicts
    from two small steps (``predictor.py``); no tuner.

    Example:
        >>> TorchFramework.name, sorted(TorchFramework.unavailable)
        ('torch', ['order_backward'])
    """

    name = "torch"
    version_modules: tuple[str, ...] = ()  # only PyTorch's public saved-tensor hooks are used
    tuner_refusal = ("the tuner predicts on TensorFlow's traced step or JAX's jaxpr, and this Keras runs on 'torch': "
                     "there, LMS(...) and %%lms_fit plan for the fit itself (stats.device_peak_bytes), or run the tuner "
                     "with KERAS_BACKEND=tensorflow or jax")
    unavailable = {"order_backward": "not available on PyTorch: the backward pass runs in autograd's order"}
    predictor_unavailable = {
        "recompute": "not predicted on PyTorch: LMS(recompute=...) chooses its layers during the fit's first step",
        "lean_ops": "not predicted on PyTorch: LMS(lean_ops=True) is measured during the fit"}

    @staticmethod
    def predictor(model, samples, options: LmsOptions, lean_ops: bool, order_backward: bool, recompute):
        """``explain_fit``'s predictor: the step run at two small batch sizes (torch/predictor.py); swaps alone."""
        from .predictor import TorchStepPredictor

        return TorchStepPredictor(model, samples, options.selection)

    @staticmethod
    def devices() -> list[str]:
        import torch

        return ["/CPU:0"] + [f"/GPU:{index}" for index in range(torch.cuda.device_count())]

    @classmethod
    def prepare(cls, options: LmsOptions, stats: LmsStats, model=None) -> LmsOptions:
        """The devices checked (None leaves the choice to the backend: the device the model trains on), and the
        device's capacity in ``stats``."""
        from ..devices import check_known_devices

        _refuse_a_distribution()
        check_known_devices(options.device, options.host_device, cls.devices())
        stats.capacity_bytes = _capacity_bytes(options.device)
        return options

    @staticmethod
    def backend():
        from .backend import TorchBackend

        return TorchBackend

    @staticmethod
    def trial_device() -> tuple[str | None, bool]:
        import torch

        return None, torch.cuda.is_available()

    @staticmethod
    def trial_peak_source(gpu: bool) -> str:
        return "predicted from the first step's saved tensors"


def _refuse_a_distribution() -> None:
    """Raises ValueError, before anything is changed, where a ``keras.distribution`` is set: Keras's PyTorch
    backend (up to 3.15, the newest release) trains on one device whatever it says, so LMS's plan for it would
    be made for a layout the fit does not have."""
    import keras

    distribution = keras.distribution.distribution()
    if distribution is not None:
        raise ValueError(
            f"LMS: keras.distribution is set ({type(distribution).__name__}), and Keras {keras.__version__}'s PyTorch "
            "backend does not distribute: the fit would run on one device, not the mesh LMS would plan for. Train "
            "on several devices with KERAS_BACKEND=jax (keras.distribution, where LMS plans for each device) or "
            "tensorflow (tf.distribute.MirroredStrategy), or call keras.distribution.set_distribution(None) to "
            "train with LMS on one device")


def _capacity_bytes(device: str | None) -> int | None:
    """What ``torch.cuda.mem_get_info`` says is free on the device plus what PyTorch already holds, within a
    ``set_per_process_memory_fraction`` cap; None on a CPU."""
    import torch

    from .offload import torch_device

    place = torch_device(device)
    if place.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(place)
    usable = free + torch.cuda.memory_reserved(place)
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if fraction is not None:
        usable = min(usable, int(total * fraction(place)))
    return usable
