"""Predictions for any LMS setting from a step's replay (pure Python): what the tuner's sliders show.

A framework's step predictor (TensorFlow's traced graph, JAX's jaxpr) says two things: its eligible
candidates in forward order for an ``lb`` and batch size, and the peak of its own bytes with the first
``count`` of them moved. :class:`PrefixPredictions` makes the rest from them, the same for every
framework: a :class:`Prediction` for any ``n_tensors``, the fewest swaps within a budget, and LMS's
default plan (``plan.plan_swaps``, the one rule every backend plans by).

Example:
    >>> from lms_magic.lms.core.plan import Candidate
    >>> class Toy(PrefixPredictions):
    ...     persistent_bytes = 100
    ...     def eligible(self, lb, batch_size):
    ...         return [Candidate(f"t{i}", f"layer{i}", "Dense", (batch_size,), 10 * batch_size, i) for i in range(3)]
    ...     def transient_peak(self, lb, batch_size, count):
    ...         return 40 * batch_size - 10 * batch_size * count
    >>> toy = Toy()
    >>> toy.predict(-1, batch_size=2).peak_bytes, toy.predict(0, batch_size=2).peak_bytes, toy.fewest_swaps(150, 1, 2)
    (120, 180, 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, runtime_checkable

from .plan import Candidate, Selection, plan_swaps


@dataclass(frozen=True)
class Prediction:
    """The predicted device memory of one train step under one LMS setting (bytes)."""

    batch_size: int
    n_tensors: int  # swapped (after -1 is resolved)
    lb: int
    peak_bytes: int
    peak_bytes_without_lms: int
    swapped_bytes_per_step: int  # copied out, and the same again copied back in
    candidates: int
    persistent_bytes: int
    recomputed_bytes_per_step: int = 0  # with recompute="only": computed again on the device, never copied


@runtime_checkable
class StepPredictor(Protocol):
    """What ``explain_fit`` and ``%lms_tune`` ask of a backend's step predictor, one per way of training
    (``Framework.predictor``): TensorFlow's traced graph, JAX's jaxpr, PyTorch's step run at two batch sizes.
    :class:`PrefixPredictions` gives ``predict``, ``fewest_swaps`` and ``planned`` from two methods, and the
    defaults of the rest.
    """

    persistent_bytes: int  # the weights, optimizer state and metrics' variables, held through the step
    compute_estimate: str  # what estimated_compute_s counts, as the step-time figures say it
    caveat: str  # what the predictions leave out where that matters to an answer ("" where nothing)
    plain_peak_source: str  # where plain_peak_bytes comes from ("" for the replay)

    @property
    def traced_batches(self) -> tuple[int, ...]:
        """The batch sizes the step was traced (or run) at, in order; every other is read off them."""

    def eligible(self, lb: int, batch_size: int) -> list[Candidate]: ...

    def predict(self, n_tensors: int | None = -1, lb: int = 1, batch_size: int = 32) -> Prediction: ...

    def planned(self, lb: int = 1, batch_size: int = 32, capacity_bytes: int | None = None) -> Prediction: ...

    def fewest_swaps(self, budget_bytes: int, lb: int = 1, batch_size: int = 32) -> int: ...

    def plain_peak_bytes(self, batch_size: int) -> int: ...

    def explain(self, n_tensors: int, lb: int = 1, batch_size: int = 32) -> dict: ...

    def estimated_compute_s(self, batch_size: int, device: str | None = None) -> float: ...

    def share(self, made: Mapping[tuple, "StepPredictor"]) -> None:
        """Takes what it can from the predictors of the same model and sample made before it (their traces, the
        rule that sized them), keyed ``(lean_ops, order_backward, recompute)``."""


class PrefixPredictions:
    """``predict``, ``fewest_swaps`` and ``planned`` over a predictor's :meth:`eligible` and :meth:`transient_peak`.

    A subclass sets ``persistent_bytes`` (the weights and optimizer state, held through the step) and
    ``recompute`` (False, or "only": the candidates are recomputed, nothing copied).
    """

    persistent_bytes: int = 0
    recompute = False
    compute_estimate = ""
    caveat = ""

    def share(self, made: Mapping[tuple, StepPredictor]) -> None:
        """Nothing to take: each batch size is traced or run on its own."""

    def eligible(self, lb: int, batch_size: int) -> list[Candidate]:
        """The candidates the filters let through at this ``lb`` and batch size, in forward order."""
        raise NotImplementedError

    def transient_peak(self, lb: int, batch_size: int, count: int) -> int:
        """The step's own peak (persistent bytes apart) with the first ``count`` eligible candidates moved."""
        raise NotImplementedError

    # what plain_peak_bytes reads: "" for the replay; a backend whose compiler has its own figure names it
    plain_peak_source = ""

    def plain_peak_bytes(self, batch_size: int) -> int:
        """The step's peak without LMS at ``batch_size``: the replay's, unless the backend's compiler has its own
        figure (``plain_peak_source`` says which)."""
        return self.predict(0, 1, batch_size).peak_bytes

    def _count(self, n_tensors: int, lb: int, batch_size: int) -> int:
        eligible = self.eligible(lb, batch_size)
        return len(eligible) if n_tensors == -1 else min(max(int(n_tensors), 0), len(eligible))

    def _peak(self, lb: int, batch_size: int, count: int) -> int:
        transient = self.transient_peak(lb, batch_size, count)  # first: a trace may build what persistent_bytes reads
        return self.persistent_bytes + transient

    def predict(self, n_tensors: int | None = -1, lb: int = 1, batch_size: int = 32) -> Prediction:
        """The predicted peak with the first ``n_tensors`` candidates moved (-1: all; None: LMS's default plan)."""
        if n_tensors is None:
            return self.planned(lb, batch_size)
        eligible = self.eligible(lb, batch_size)
        count = self._count(n_tensors, lb, batch_size)
        moved = sum(candidate.nbytes for candidate in eligible[:count])
        recomputed = self.recompute == "only"
        return Prediction(batch_size, count, lb, self._peak(lb, batch_size, count), self._peak(lb, batch_size, 0),
                          0 if recomputed else moved, len(eligible), self.persistent_bytes,
                          moved if recomputed else 0)

    def fewest_swaps(self, budget_bytes: int, lb: int = 1, batch_size: int = 32) -> int:
        """The fewest tensors to move for a predicted peak within ``budget_bytes``.

        Raises:
            BudgetError: even moving every candidate does not fit (the message says what to try).
        """
        plan = plan_swaps(Selection(), self.eligible(lb, batch_size),
                          lambda moved: self.transient_peak(lb, batch_size, len(moved)),
                          self.persistent_bytes, budget_bytes=budget_bytes)
        return len(plan.moved)

    def planned(self, lb: int = 1, batch_size: int = 32, capacity_bytes: int | None = None) -> Prediction:
        """The prediction for LMS's default plan: with a device ``capacity_bytes``, nothing where the step fits,
        else the fewest bytes that fit; without, the lowest predicted peak, then the fewest bytes moved."""
        plan = plan_swaps(Selection(), self.eligible(lb, batch_size),
                          lambda moved: self.transient_peak(lb, batch_size, len(moved)),
                          self.persistent_bytes, capacity_bytes=capacity_bytes)
        return self.predict(len(plan.moved), lb, batch_size)
