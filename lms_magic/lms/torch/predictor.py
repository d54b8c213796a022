"""Predictions for any batch size on PyTorch, without training: ``explain_fit``'s predictor there.

PyTorch has no graph to trace, so the step is run: forward, loss and backward, no optimizer update, at two
small batch sizes (``PROBE_BATCHES``), with the offloader's saved-tensor hooks watching (nothing is copied).
What autograd saved, in forward order, and the backward pass's reads of it make a
:class:`~lms_magic.lms.torch.traced.SavedTensorStep`; each saved activation's size and shape at any other
batch are read off the two runs (linear in the batch), as LMS's offload plan sees them. The model's weights,
normalisation statistics and seed states are put back after each run.

The peak with LMS is the one ``LMS()`` predicts in the fit's first step on a CPU: the eligible saved activations
(the replay) with the weights and the optimizer's state held through the step. Gradients, temporaries and
workspaces are left out (on a GPU, LMS's first step adds what the allocator's peak shows beyond them). The peak
without LMS counts every tensor the step makes; on a GPU, each operator's workspace too (cuDNN's, cuBLAS's: what
the allocator held while it ran beyond what it held after), each a line in the batch through the two runs, and
what the libraries keep from their first step on (cuBLAS's workspaces: made again in a run of their own).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import time

import numpy as np
import torch

from ..core.batch_lines import TwoBatches
from ..core.peak import LiveTensor, explain_peak
from ..core.plan import Candidate, Selection
from ..core.prediction import PrefixPredictions
from ..core.simulate import replay, with_swaps
from ..options import compiled_model, whole_number
from ..persistent import persistent_tensors
from ..samples import tile_batch
from .meter import StorageMeter
from .offload import TorchOffloader
from .traced import SavedTensorStep

PROBE_BATCHES = (2, 3)  # the batch sizes the step runs at; every other is read off them
PROBES = TwoBatches(*PROBE_BATCHES)


class TorchStepPredictor(PrefixPredictions):
    """Predicts a model's step peak on PyTorch for any batch size and prefix of its saved activations offloaded.

    Args:
        model: a compiled Keras model (PyTorch backend).
        sample: one batch ``(x, y)`` or ``(x, y, sample_weight)`` of any size (it gives the shapes and dtypes).
        selection: the static filters (``min_bytes``, layers); its ``n_tensors`` is ignored. Defaults to all.

    Raises:
        ValueError: the model is not compiled, or its saved activations differ between the two runs.

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((64,))] + [keras.layers.Dense(256, activation="relu")
        ...                           for _ in range(6)] + [keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> predictor = TorchStepPredictor(model, (np.ones((2, 64), "float32"), np.ones((2, 1), "float32")))
        >>> few, many = predictor.predict(0, batch_size=1024), predictor.predict(-1, batch_size=1024)
        >>> many.peak_bytes < few.peak_bytes == few.peak_bytes_without_lms
        True
    """

    compute_estimate = "the step's matrix FLOPs (torch.utils.flop_counter) at the device's matrix-product rate"
    caveat = ("PyTorch: without LMS, the peak counts every tensor the step makes (measured at two small batch "
              "sizes); with LMS, the saved activations, weights and optimizer state, not the gradients and "
              "temporaries, which grow with the batch: the largest batches with LMS are upper bounds, far above what "
              "fits (docs/explain.md#where-it-runs)")
    plain_peak_source = "every tensor the step makes, counted at two small batch sizes"

    def __init__(self, model, sample, selection: Selection | None = None, counter=None):
        compiled_model(model)
        self.model, self.sample, self.selection = model, tuple(sample), selection or Selection()
        # the device allocator's counter, read around each operator of the runs: a GPU's, or one given (tests)
        self.counter = counter if counter is not None else _device_counter()
        self._allocated: dict[int, list[int]] = {}  # batch size -> the bytes after each operator, its workspace in
        if self.counter is not None:
            self.plain_peak_source = ("every tensor the step makes, each operator's workspace and the libraries' "
                                      "lasting ones (the device allocator's), counted at two small batch sizes")
        self._persistent = persistent_tensors(model)
        self.persistent_bytes = sum(tensor.nbytes for tensor in self._persistent)
        self._measured: dict[int, int] = {}  # batch size -> the bytes of the tensors its run made, at their most
        self._timelines: dict[int, list[int]] = {}  # batch size -> those bytes after each operator of its run
        self._plain: dict[int, int] = {}
        self.lasting_workspace_bytes = 0  # what the libraries keep from a step on (cuBLAS's workspaces), where read
        if self.counter is not None:  # the libraries' handles and lasting workspaces made in a run of their own
            from .internals import cublas_workspaces_released

            cublas_workspaces_released()  # a fit before this held them already: made again in this run
            held = self.counter.read()[0]
            self._run(PROBE_BATCHES[0])
            self.lasting_workspace_bytes = max(0, self.counter.read()[0] - held)
        self._runs = [self._run(batch) for batch in PROBE_BATCHES]
        (first, _, _), (second, _, _) = self._runs
        if [(c.layer, len(c.shape)) for c in first] != [(c.layer, len(c.shape)) for c in second]:
            raise ValueError("explain_fit: the model saved different activations at batch sizes "
                             f"{PROBE_BATCHES[0]} and {PROBE_BATCHES[1]}, so no other batch size can be read off them")
        self._steps: dict[tuple[int, int], tuple[list[Candidate], SavedTensorStep]] = {}

    traced_batches = PROBE_BATCHES  # the batch sizes the step runs at

    def _run(self, batch_size: int):
        """The step's saved activations (forward order), the backward pass's reads of them (as positions) and
        its matrix FLOPs, at ``batch_size``; the model's variables as they were after."""
        from torch.utils.flop_counter import FlopCounterMode

        x, y, sample_weight = (tile_batch(self.sample, batch_size) + (None, None))[:3]
        model = self.model
        # the step updates BatchNormalization's statistics, and the metrics a compute_loss of the user's updates
        variables = list({id(v): v for v in [*model.non_trainable_variables, *model.metrics_variables]}.values())
        kept = [(v, v.value.detach().clone()) for v in variables]
        # an unseeded Dropout draws from PyTorch's global generator: put back after, so later steps draw as before
        random_state = torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
        reads: list[Candidate] = []
        offloader = TorchOffloader(Selection(min_bytes=0), observer=lambda event: event.kind == "read" and
                                   reads.append(event.candidate))
        offloader.n_tensors, offloader.watch_all = 0, True  # watched, nothing copied

        def step(_):  # Keras's train step less the optimizer's update and the metrics
            y_pred = model(x, training=True)
            model.zero_grad()
            compute = getattr(model, "_compute_loss", None)  # Keras 3.5's is compute_loss, without `training`
            loss = compute(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True) if compute else \
                model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
            loss.backward()

        collecting = gc.isenabled()
        gc.collect()  # the garbage of earlier code freed now, and none collected during the run: each run counts alike
        gc.disable()
        try:
            with FlopCounterMode(display=False) as flops, StorageMeter(self.counter) as meter:
                offloader.run(step, None)
        finally:
            if collecting:
                gc.enable()
            model.zero_grad()
            with torch.no_grad():
                for variable, value in kept:
                    variable.value.copy_(value)
            torch.set_rng_state(random_state[0])
            if random_state[1] is not None:
                torch.cuda.set_rng_state_all(random_state[1])
            offloader.close()
        self._measured[batch_size] = meter.peak_bytes
        self._timelines[batch_size] = meter.timeline
        self._allocated[batch_size] = meter.timeline_with_workspaces
        position = {c.tensor: index for index, c in enumerate(offloader.candidates)}
        return offloader.candidates, [position[c.tensor] for c in reads if c.tensor in position], \
            flops.get_total_flops()

    def measured_run(self, batch_size: int) -> tuple[list[Candidate], list[int], int]:
        """A run of the step at ``batch_size`` itself, never read off the two runs: its saved activations (forward
        order), the backward pass's reads of them (as positions), and the bytes of every tensor it made, at their
        most. What :meth:`plain_peak_bytes` and the step read off the two runs are held to."""
        candidates, reads, _ = self._run(batch_size)
        return candidates, reads, self._measured[batch_size]

    def plain_peak_bytes(self, batch_size: int) -> int:
        """The step's peak without LMS at ``batch_size``: the weights and optimizer state, and every tensor the step
        makes (activations, their gradients, the weights' gradients, temporaries), counted after each operator of
        the two runs (``meter.StorageMeter``; with the device allocator's counter, each operator's workspace
        added, and what the libraries keep from the first run on: ``lasting_workspace_bytes``). Each such count is
        a line in the batch size through the two runs; the peak is the highest of those lines at ``batch_size``
        (where the weights' gradients are the most at a small batch, the activations may be at a large one). Where
        the runs made different operators, the line through their two peaks.

        Example:
            >>> import keras, numpy as np
            >>> model = keras.Sequential([keras.Input((64,))] + [keras.layers.Dense(256, activation="relu")
            ...                           for _ in range(6)] + [keras.layers.Dense(1)])
            >>> model.compile("sgd", "mse")
            >>> predictor = TorchStepPredictor(model, (np.ones((2, 64), "float32"), np.ones((2, 1), "float32")))
            >>> predictor.plain_peak_bytes(1024) > predictor.predict(0, batch_size=1024).peak_bytes
            True
        """
        whole_number("batch_size", batch_size, 1)
        if batch_size not in self._plain:
            low, high = PROBE_BATCHES
            first, second = self._timelines[low], self._timelines[high]
            if self._allocated.get(low) and len(self._allocated[low]) == len(self._allocated[high]):
                first, second = self._allocated[low], self._allocated[high]  # each operator's workspace in
            pairs = zip(first, second) if len(first) == len(second) else [(self._measured[low], self._measured[high])]
            step = max(PROBES.at(one, two, batch_size) for one, two in pairs)
            self._plain[batch_size] = self.persistent_bytes + self.lasting_workspace_bytes + max(0, step)
        return self._plain[batch_size]

    def _step(self, batch_size: int, lb: int = 1) -> tuple[list[Candidate], SavedTensorStep]:
        """The eligible saved activations at ``batch_size`` and their step at ``lb``, read off the two runs."""
        whole_number("batch_size", batch_size, 1)
        whole_number("lb", lb, 1)
        if (batch_size, lb) not in self._steps:
            (first, reads, _), (second, _, _) = self._runs
            candidates = [dataclasses.replace(c, shape=tuple(PROBES.at(a, b, batch_size) for a, b in zip(c.shape,
                                                                                                     other.shape)),
                                              nbytes=PROBES.at(c.nbytes, other.nbytes, batch_size))
                          for c, other in zip(first, second)]
            eligible = self.selection.eligible(candidates)  # as LMS's probe records them (min_bytes at this batch)
            self._steps[batch_size, lb] = eligible, SavedTensorStep(eligible, [candidates[i] for i in reads], lb)
        return self._steps[batch_size, lb]

    def eligible(self, lb: int, batch_size: int) -> list[Candidate]:
        return self._step(batch_size, lb)[0]

    def transient_peak(self, lb: int, batch_size: int, count: int) -> int:
        eligible, step = self._step(batch_size, lb)
        return step.transient_peak(eligible[:count])

    def explain(self, n_tensors: int, lb: int = 1, batch_size: int = 32) -> dict:
        """``stats["peak"]`` (core/peak.py) with the first ``n_tensors`` eligible saved activations offloaded
        (-1: all): the peak's phase, its bytes by kind, the largest tensors and the layers holding the most."""
        count = self._count(n_tensors, lb, batch_size)
        eligible, step = self._step(batch_size, lb)
        swaps = [swap for swap in (step._swap(c) for c in eligible[:count]) if swap is not None]
        result = replay(with_swaps(step.nodes, swaps), explain=True)
        by_node = {f"f{index}": c for index, c in enumerate(eligible)}

        def describe(tensor) -> LiveTensor:
            candidate = by_node.get(tensor[0].split(":", 1)[0])  # "f3", or a swap's "f3:0/device_copy"
            if candidate is None:
                return LiveTensor(tensor[0], "", None, 0, "other")
            kind = "activations_swapped_in" if tensor[0].endswith("/device_copy") else "activations_kept"
            return LiveTensor(candidate.tensor, candidate.path or candidate.layer, candidate.shape, 0, kind)

        phase = "backward" if (result.peak_after or "").startswith("b") else "forward"
        return explain_peak(result, describe, self._persistent, phase, result.peak_after or "")

    def estimated_compute_s(self, batch_size: int, device: str | None = None) -> float:
        """The step's matrix FLOPs at ``batch_size`` (read off the two runs' counts) at the device's measured
        matrix-product rate: a lower bound on the step's compute time."""
        (_, _, low_flops), (_, _, high_flops) = self._runs
        return max(0.0, float(PROBES.at(low_flops, high_flops, batch_size))) / device_flops_per_s()


def _device_counter():
    """The allocator counter of PyTorch's current CUDA device, whose peak can be reset; None without a GPU."""
    if not torch.cuda.is_available():
        return None
    from ...memory.frameworks import resettable_counter

    return resettable_counter(f"cuda:{torch.cuda.current_device()}")


@functools.cache
def device_flops_per_s(size: int = 1024, repeats: int = 3) -> float:
    """PyTorch's float32 matrix-product rate on the default device (FLOP/s), timed once per process: the median of
    ``repeats`` products of two ``size`` x ``size`` matrices, after one warm-up."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    numbers = torch.Generator(device=device).manual_seed(0)  # its own: the global generator (data shuffling) untouched
    a, b = (torch.rand(size, size, device=device, generator=numbers) for _ in range(2))
    (a @ b).sum().item()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        (a @ b)[0, 0].item()
        times.append(time.perf_counter() - started)
    return 2 * size**3 / sorted(times)[len(times) // 2]
