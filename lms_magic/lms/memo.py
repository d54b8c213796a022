"""Plans remembered across fits of one model: a second ``fit`` (or ``%%lms_fit --compare``) does not plan again.

A plan is remembered for a model (weakly: the memo never keeps a model alive) under a key a backend makes from
what the plan depends on: the traced step's candidates and the batch they are sized for, the options, the
device's capacity. It is forgotten when the model's own train function changes (``compile()`` makes a new one):
the backend names that function when it recalls and remembers.
What is kept is plain data: the tensors the plan moves, the stats the checked plan ended with, and whether LMS
stepped out. No framework is imported here.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from dataclasses import dataclass
from typing import Hashable

from .core.stats import LmsStats


@dataclass(frozen=True)
class RememberedPlan:
    """A checked plan: the tensors it moves, the stats it ended with, and whether nothing moved so LMS stepped out
    (then the model trained with its own train function)."""

    moved: tuple[str, ...]
    stats: LmsStats
    stepped_out: bool

    def taken_over(self, stats: LmsStats, note: str, **figures) -> None:
        """Fills a reusing fit's ``stats`` with this plan's (its own ``steps`` kept, ``figures`` over them), and a
        note that says the plan was reused: "the plan an earlier fit of this model checked " + ``note``.

        Example:
            >>> stats = LmsStats(steps=1)
            >>> RememberedPlan((), LmsStats(swapped_tensors=3, steps=9), False).taken_over(stats, "at this batch")
            >>> stats.swapped_tensors, stats.steps, stats.notes
            (3, 1, ['the plan an earlier fit of this model checked at this batch'])
        """
        kept = {name: getattr(self.stats, name) for name in self.stats.to_dict() if name != "steps"}
        stats.update({**kept, **figures}, notes=list(self.stats.notes) + [
            f"the plan an earlier fit of this model checked {note}"])


class PlanMemo:
    """Plans by model and key; a model's plans are forgotten when its own train function changes.

    Example:
        >>> class Model:
        ...     pass
        >>> memo, model, own, recompiled = PlanMemo(), Model(), lambda: None, lambda: None
        >>> plan = RememberedPlan(("conv/Relu:0",), LmsStats(swapped_tensors=1), False)
        >>> memo.remember(model, own, ("conv", 8), plan)
        >>> memo.recall(model, own, ("conv", 8)).moved, memo.recall(model, own, ("conv", 16))
        (('conv/Relu:0',), None)
        >>> memo.recall(model, recompiled, ("conv", 8)) is None  # compiled again: a new train function
        True
    """

    def __init__(self):
        self._plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def recall(self, model, own_function, key: Hashable) -> RememberedPlan | None:
        """The plan remembered for ``model`` under ``key`` while ``own_function`` was its train function, or None."""
        entry = self._plans.get(model)
        if entry is None:
            return None
        function, plans = entry
        if not function.names(own_function):
            del self._plans[model]
            return None
        return plans.get(key)

    def remember(self, model, own_function, key: Hashable, plan: RememberedPlan) -> None:
        """Keeps ``plan`` for ``model`` and its train function ``own_function`` under ``key`` (its stats copied,
        without the graph objects)."""
        entry = self._plans.get(model)
        if entry is None or not entry[0].names(own_function):
            entry = self._plans[model] = (_Identity(own_function), {})
        stats = copy.copy(plan.stats)
        stats.update(partition_graphs=None, records=None, plan=list(stats.plan), notes=list(stats.notes))
        entry[1][key] = RememberedPlan(tuple(plan.moved), stats, plan.stepped_out)


class _Identity:
    """Names one object without keeping it alive (weakly where it can be, else by ``id``)."""

    def __init__(self, thing):
        try:
            self._ref = weakref.ref(thing)
        except TypeError:
            self._ref, self._id = None, id(thing)

    def names(self, thing) -> bool:
        return self._ref() is thing if self._ref is not None else self._id == id(thing)


def options_key(options) -> str:
    """What of the options a plan depends on, as a key: every one but ``verbose``."""
    return repr(dataclasses.replace(options, verbose=0))


PLANS = PlanMemo()  # the process's memo, shared by every LMS callback
