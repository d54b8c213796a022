"""What LMS asks of JAX around a fit (``lms/framework.py``'s ``Framework``): capacity, what XLA decides, the backend
and the tuner's predictor. JAX is imported inside the methods."""

from __future__ import annotations

from ..backend import Framework
from ..core.stats import LmsStats
from ..options import LmsOptions


class JaxFramework(Framework):
    """Keras's JAX backend: LMS offloads with a ``jax.checkpoint`` policy in the jitted step (``backend.py``).

    Example:
        >>> sorted(JaxFramework.unavailable)
        ['device', 'host_device', 'lb', 'lean_ops', 'order_backward']
    """

    name = "jax"
    unavailable = {
        "lean_ops": "not available on JAX: XLA computes the step",
        "order_backward": "not available on JAX: XLA orders the step",
        "lb": "not honoured on JAX: XLA schedules the copies back",
        "device": "not used on JAX: LMS relieves JAX's default device",
        "host_device": "not used on JAX: XLA offloads to the device's host memory kind",
    }

    @staticmethod
    def wait_for_the_device(model) -> None:
        """JAX runs steps asynchronously: a step that runs out of memory says so when its result is first read
        (the next cell's ``model.get_weights()``, seen on an H200), after ``fit`` has returned. So: until the
        model's variables are ready."""
        import jax

        jax.block_until_ready([variable.value for variable in model.variables])

    @staticmethod
    def devices() -> list[str]:
        import jax

        return [f"/{'CPU' if d.platform == 'cpu' else 'GPU'}:{d.id}" for d in jax.devices()]

    @classmethod
    def prepare(cls, options: LmsOptions, stats: LmsStats, model=None) -> LmsOptions:
        """The options as given (JAX's default device is relieved, or each device of a ``keras.distribution``
        mesh: ``stats.devices``); its capacity in ``stats``."""
        from .distribution import mesh_layout

        layout = mesh_layout()
        stats.devices = list(layout.devices) if layout is not None else []
        stats.capacity_bytes = _capacity_bytes()
        return options

    @staticmethod
    def process() -> tuple[int, int]:
        """JAX's process index and count (``keras.distribution.initialize`` over several processes)."""
        import jax

        return jax.process_index(), jax.process_count()

    @staticmethod
    def backend():
        from .backend import JaxBackend

        return JaxBackend

    @staticmethod
    def predictor(model, samples, options: LmsOptions, lean_ops, order_backward, recompute):
        from .predictor import JaxStepPredictor

        return JaxStepPredictor(model, samples, options.selection, recompute=recompute)

    @staticmethod
    def trial_device() -> tuple[str | None, bool]:
        import jax

        return None, jax.default_backend() != "cpu"

    @staticmethod
    def trial_peak_source(gpu: bool) -> str:
        return "predicted from the step's jaxpr (JAX's device peak cannot be reset between trials)"


def _capacity_bytes() -> int | None:
    """The memory JAX's default device may use (a GPU's or TPU's ``bytes_limit``); None where it says nothing (a CPU)."""
    import jax

    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # a platform without memory statistics
        return None
    return stats.get("bytes_limit")
