"""What LMS asks of TensorFlow around a fit (``lms/framework.py``'s ``Framework``): devices, capacity, the backend,
the tuner's predictor and where trials train. TensorFlow is imported inside the methods."""

from __future__ import annotations

from ..backend import Framework
from ..core.stats import LmsStats
from ..options import LmsOptions
from . import internals as tf_internals


class TensorFlowFramework(Framework):
    """Keras's TensorFlow backend: LMS rewrites the traced train step (``backend.py``).

    Example:
        >>> TensorFlowFramework.name, TensorFlowFramework.unavailable
        ('tensorflow', {})
    """

    name = "tensorflow"
    version_modules = ("tensorflow",)
    trials_measure_peak = True  # on a GPU, TensorFlow's allocator peak is reset between trials
    plans_by_device_model = True  # the planner reads explain_fit's measured steps (planner.use_device_model)
    keeps_free_probe = True  # first_step.py: the probe's swaps stand where their extra copies cost less than a retrace
    unavailable: dict[str, str] = {}

    @staticmethod
    def devices() -> list[str]:
        import tensorflow as tf

        from ..options import device_name

        return [device_name(device.name) for device in tf.config.list_logical_devices()]

    @staticmethod
    def kernel_scratch_recorded(recorded, device=None):
        """Each op's scratch in the block, from TensorFlow's profiler (``executed.kernel_scratch_recorded``)."""
        from .executed import kernel_scratch_recorded

        return kernel_scratch_recorded(recorded, device)

    @classmethod
    def prepare(cls, options: LmsOptions, stats: LmsStats, model=None) -> LmsOptions:
        """The device LMS relieves (given; else the first GPU, or the simulated accelerator; else None: no GPU),
        the host (given, or the default), and the device's capacity in ``stats``. Under a distribution strategy
        (``model.distribute_strategy``), every replica's device (``stats.devices``), planned on the first's
        graph against the smallest capacity of theirs (a ``device`` given must be one of them)."""
        from .. import devices
        from ..devices import check_known_devices
        from ..options import OptionError

        _refuse_several_workers(model)
        known = cls.devices()
        check_known_devices(options.device, options.host_device, known)
        host = options.host_device or devices.default_host()
        replicas = _replica_devices(model)
        device = options.device
        if replicas and device is None and options.host_device is None and \
                not all(name.startswith("/GPU") or devices.is_simulated(name) for name in replicas):
            stats.devices, stats.capacity_bytes = [], None  # a strategy over CPUs alone: nothing to relieve
            return options.replace(device=None)
        if replicas:
            if host in replicas:
                raise OptionError("host_device", host, f"is a device the distribution strategy trains on "
                                  f"({', '.join(replicas)}): swapping there relieves nothing; pass a device "
                                  "outside the strategy, such as the host CPU")
            if device is not None and device not in replicas:
                raise OptionError("device", device, f"is not one of the distribution strategy's devices "
                                  f"({', '.join(replicas)}): LMS relieves each of them; leave device out, or "
                                  f"pass one of them, such as {replicas[0]!r}")
            if device is not None or all(name.startswith("/GPU") or devices.is_simulated(name) for name in replicas):
                device = replicas[0]  # the first replica's graph is the one planned on (backend.py)
        elif device is None:
            gpus = [name for name in known if name.startswith("/GPU")]
            device = gpus[0] if gpus else devices.default_device()
        relieved = (replicas or [device]) if device is not None else []
        stats.devices = list(relieved)
        capacities = [capacity for capacity in map(_capacity_bytes, relieved) if capacity is not None]
        stats.capacity_bytes = min(capacities) if capacities else None
        return options.replace(device=device, host_device=host)

    @staticmethod
    def off_reason(options: LmsOptions, model=None) -> tuple[str, str] | None:
        if model is not None and model.run_eagerly:
            return ("the model runs eagerly", "LMS: the model was compiled with run_eagerly=True, so there is no "
                    "traced train step to rewrite: this fit trains without LMS (compile without run_eagerly=True "
                    "for LMS)")
        if options.device is None:
            return ("no GPU", "LMS: no GPU found, so nothing is swapped (pass device=..., or --device in %%lms_fit, "
                    "to choose one, or call lms_magic.simulate_accelerator() to see LMS on a CPU)")
        return None

    @staticmethod
    def backend():
        from .backend import TensorFlowBackend

        return TensorFlowBackend

    @staticmethod
    def predictor(model, samples, options: LmsOptions, lean_ops: bool, order_backward: bool, recompute):
        from .. import devices
        from .predictor import TensorFlowStepPredictor

        return TensorFlowStepPredictor(model, samples, options.selection, options.host_device or devices.default_host(),
                             order_backward=order_backward, lean_ops=lean_ops, recompute=recompute,
                             rescale_batches=True)

    @staticmethod
    def trial_device() -> tuple[str | None, bool]:
        import tensorflow as tf

        gpus = ["/" + d.name.split("device:")[-1] for d in tf.config.list_logical_devices("GPU")]
        return (gpus[0], True) if gpus else ("/CPU:0", False)

    @staticmethod
    def trial_peak_source(gpu: bool) -> str:
        return "measured (TensorFlow allocator)" if gpu else "predicted from the executed graph (no GPU)"


def _refuse_several_workers(model) -> None:
    """Raises ValueError, before anything is changed, where the model trains under TensorFlow's multi-worker
    strategy: Keras 3's fit under it fails before training across machines, so LMS has no plan tested there."""
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None and type(strategy).__name__ in ("MultiWorkerMirroredStrategy", "CollectiveAllReduceStrategy"):
        raise ValueError(
            "LMS: tf.distribute.MultiWorkerMirroredStrategy is not supported: Keras 3's fit under it fails before "
            "training across machines (keras-team/keras#20585, open since TensorFlow 2.16), so LMS has no plan "
            "tested there. For several machines use KERAS_BACKEND=jax with keras.distribution.initialize(...) "
            "(docs/devices.md, \"Several machines\"); on one machine, tf.distribute.MirroredStrategy")


def _replica_devices(model) -> list[str]:
    """The devices of the model's distribution strategy, in LMS's spelling ("/GPU:0"), where it has one (a
    ``MirroredStrategy``, ``OneDeviceStrategy``, ``MultiWorkerMirroredStrategy``: this worker's); else []."""
    from ..options import device_name

    strategy = getattr(model, "distribute_strategy", None)
    try:
        names = strategy.extended.worker_devices if strategy is not None else ()
    except (RuntimeError, AttributeError, NotImplementedError):  # the default strategy has none
        return []
    return [device_name(name) for name in names]


def _capacity_bytes(device: str | None) -> int | None:
    """The memory of LMS's ``device`` as TensorFlow may use it, or None where it is not known: the simulated
    accelerator's ``memory``; a GPU's logical-device memory limit where one was set, else its total memory
    (NVML); a CPU's: None (host memory is not what LMS relieves)."""
    from .. import devices

    if device is None:
        return None
    if device.startswith("/CPU"):
        return devices.simulated_memory_bytes() if devices.is_simulated(device) else None
    index = int(device.rsplit(":", 1)[1])
    limit = tf_internals.tensorflow_memory_limit(index)
    return limit if limit is not None else devices.nvml_total_bytes(index)
