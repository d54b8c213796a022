"""The hybrid plan (``recompute=True``): the plan's tensors recomputed on the device where that costs no
higher peak, the rest swapped; its state through a fit.

Its first step swaps every tensor of the plan (a probe, or the first step of a plan given by a count), and
the recompute chains are planned on that trace before its swaps change it (``recompute.plan_recomputes``,
as if every eligible candidate were swapped, so a chain stands for any plan). On that step's executed graphs
(``executed.ExecutedStep``) a chain is chosen where the step with it predicts no higher peak than swaps
alone: its tensor modelled as brought back at its gate, the swapped tensors its clones read brought back
there too (``recompute.gate_moves``), the device tensors they read held until then
(``recompute.chain_reads``). The step after runs the chosen recomputes; where its own executed graphs
predict a peak more than 0.1% above what swaps alone did, the fit goes back to swaps alone.
"""

from __future__ import annotations

from ...units import format_size
from . import recompute as _recompute

# The hybrid plan's step may be this much above swaps alone, not more: two executed graphs' predictions differ a
# little where TensorFlow gives no size for a node (sized by a guess), and by the small tensors each step's own
# program order keeps longer or shorter (docs/measurements.md has the sizes seen).
PEAK_TOLERANCE = 1e-3
from .graph import swap_name
from .rewrite import insert_swaps


class HybridPlan:
    """One fit's hybrid plan: ``state`` is "swaps first", "on" (its recomputes run) or "off" (swaps alone).

    Args:
        selection: the options' candidate filters (``Selection``).
        host_device: where swapped tensors wait.
    """

    def __init__(self, selection, host_device: str):
        self.selection, self.host_device = selection, host_device
        self.state = "swaps first"
        self.swap_only_peak_bytes: int | None = None  # predicted for the step that swapped the plan's tensors
        self.recomputed: set[str] = set()  # the tensors chosen to be recomputed
        self._chains: dict = {}  # tensor name -> Recompute, on the first trace
        self._ops: list | None = None  # that trace's ops, before its swaps

    def insert(self, graph, ops, items, candidates, probing: bool) -> list:
        """Moves ``items`` off the device in the traced step ``ops`` of ``graph`` (``candidates``: all of its
        candidates): swapped, or, once the recomputes are chosen, those recomputed and the rest swapped."""
        if self._ops is None:  # planned before the swaps change the ops
            self._chains, self._ops = self._recomputable(ops, candidates), list(ops)
        if self.state != "on" or probing:
            return insert_swaps(graph, items, self.host_device)
        chains = {name: chain for name, chain in self._recomputable(ops, candidates).items()
                  if name in self.recomputed}
        return _recompute.insert_hybrid(graph, items, chains, ops, self.host_device)

    def _recomputable(self, ops, candidates) -> dict:
        """The recompute chains, planned as if every eligible candidate were moved (so they stand for any
        plan: a chain may read a swapped tensor, and a kept one is on the device anyway)."""
        by_tensor = {item.candidate.tensor: item for item in candidates}
        eligible = [by_tensor[c.tensor] for c in self.selection.eligible(item.candidate for item in candidates)]
        return _recompute.plan_recomputes(eligible, ops, the_rest="swapped")

    def choose(self, executed, names: list[str], candidates, swap_only_peak_bytes: int) -> str:
        """Chooses the recomputes on the executed graphs (``executed``, an ExecutedStep) of a step that swapped
        the plan's tensors (``names``; ``candidates``: the first trace's); returns the note that says so."""
        chosen = set(names)
        items = [item for item in candidates if item.tensor.name in chosen]
        chains = {name: chain for name, chain in self._chains.items() if name in chosen}

        def transient_peak(trial) -> int:
            moves = _recompute.gate_moves(items, trial, self._ops)
            reads = _recompute.chain_reads(items, trial, self._ops)
            return executed.transient_peak(
                items, {swap_name(name): swap_name(item.tensor.name) for name, item in moves.items()},
                {name: swap_name(item.tensor.name) for name, item in reads.items()})

        self.recomputed = set(_recompute.hybrid_chains(chains, transient_peak))
        self.state, self.swap_only_peak_bytes = ("on" if self.recomputed else "off"), swap_only_peak_bytes
        return (f"the hybrid plan: {len(self.recomputed)} of the {len(items)} tensors moved are recomputed "
                f"({len(chains)} could be), the others swapped")

    def after_step(self, executed, names: list[str], candidates, peak_bytes: int,
                   recomputed_tensors: int) -> tuple[list[str], str | None]:
        """After a step whose executed graphs (``executed``: a function making their ExecutedStep) predict
        ``peak_bytes``: after one that swapped the plan's tensors (``names``), its recomputes chosen on them, to run
        from the next step; after one that ran them, swaps alone from the next step where they raised the predicted
        peak. Returns the notes to add, and the note of a retrace (None: none)."""
        if self.state == "swaps first":
            note = self.choose(executed(), names, candidates, peak_bytes)
            return [note], ("the hybrid plan's recomputes run from the next step" if self.state == "on" else None)
        if self.raised_the_peak(peak_bytes, recomputed_tensors):
            return [], (f"the executed graphs predict {format_size(peak_bytes)} with the hybrid plan's "
                        f"{recomputed_tensors} recomputes, above the {format_size(self.swap_only_peak_bytes)} of "
                        "swaps alone: swaps alone from the next step")
        return [], None

    def raised_the_peak(self, peak_bytes: int, recomputed_tensors: int) -> bool:
        """After a step that ran the recomputes: whether its executed graphs predict a peak more than
        ``PEAK_TOLERANCE`` above what swaps alone did (then the plan turns to swaps alone)."""
        if self.state != "on" or not recomputed_tensors or \
                peak_bytes <= self.swap_only_peak_bytes * (1 + PEAK_TOLERANCE):
            return False
        self.state = "off"
        return True
