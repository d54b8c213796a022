"""The PyTorch backend of the ``LMS`` callback: one fit's offloading (offload.py) and what it reports."""

from __future__ import annotations

from ... import compat
from ...units import MIB
from ..backend import Action
from ..core.stats import LmsStats
from ..options import LmsOptions
from .offload import TorchOffloader


class TorchBackend:
    """One fit's LMS on the PyTorch backend, for the ``LMS`` callback (the TensorFlowBackend's counterpart).

    Args:
        model: the model being trained.
        options: the LMS options (``device`` None: the device the model trains on).
        stats: the fit's stats, filled in after the first step.
        observer: handed to the :class:`TorchOffloader` (its events, for watching). Defaults to None.
    """

    jit_note = ("torch.compile (jit_compile) is off while LMS trains: it traces its own graph around autograd's "
                "saved-tensor hooks")

    def __init__(self, model, options: LmsOptions, stats: LmsStats, observer=None):
        self.offloader = TorchOffloader(options.selection, options.lb, options.budget_bytes, options.device,
                                        observer)
        self.device, self.lb, self.stats = str(self.offloader.device), options.lb, stats
        self.step = None
        self._release_plan = compat.graph_release_plan(model)

    def train_step(self, original):
        return lambda data: self.offloader.run(original, data)

    def step_scope(self):
        """The model's graph lets go of each activation once its last reader has run, so an offloaded one's
        device memory is free before the forward pass ends (Keras would hold all of them to its end)."""
        return compat.graph_intermediates_released(self._release_plan)

    def first_step_done(self) -> Action:
        found = self.offloader.stats()
        found["notes"] = self.stats.notes + found["notes"]
        self.stats.update(found)
        return Action.KEEP

    def summary_line(self) -> str:
        stats = self.stats
        peak = stats.device_peak_bytes
        return (f"LMS (PyTorch): offloading {stats.swapped_tensors} of {stats.candidates} saved activations "
                f"({stats.swapped_bytes_per_step / MIB:.1f} MiB per step, lb={self.lb} layers) to "
                f"{'pinned ' if stats.pinned else ''}host memory; "
                + (f"{self.device} peak {peak / MIB:.1f} MiB ({stats.prediction_source})" if peak is not None
                   else "no device peak (not a CUDA device)"))

    def close(self) -> None:
        self.offloader.close()
