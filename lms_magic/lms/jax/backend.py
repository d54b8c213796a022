"""The JAX backend of the ``LMS`` callback: the values the backward pass keeps, offloaded to pinned host memory by XLA.

Keras's JAX trainer differentiates ``compute_loss_and_updates`` with ``jax.value_and_grad`` inside its
jitted ``train_step``. While LMS's train step is traced (once per batch shape, as Keras's own), the
model's ``compute_loss_and_updates`` is traced anew with every floating-point value it makes named
(``residuals.named_residuals``: each equation of its jaxpr, named by its Keras layer path, primitive and
position) and wrapped in ``jax.checkpoint`` with a policy (``residuals.residual_policy``) that offloads the
planned values (``Offloadable(src="device", dst="pinned_host")``; with ``recompute="only"``, ``Recompute``),
saves the other named values, and computes anything else the backward pass reads (the inside of one
operation's derivative) again from them; the model's own again once the trace is done, whatever ends it. So every
value the backward pass keeps is a candidate: a layer's output, and inside a Transformer block the attention
scores and probabilities and the feed-forward's wide intermediate. Where the device has no host memory
kind to offload to, the plan recomputes instead (said). The plan is made in that trace, before the step
runs: the jaxpr of the step with nothing moved is replayed (``traced.JaxStep``) for the peak of any
set offloaded, and the one rule of ``core.plan.plan_swaps`` chooses (candidates in forward order). The
values are copied, never changed, and a recomputed value is computed by the same operations again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

from ... import internals
from ..backend import Action
from ..core.plan import BudgetError, Plan, Rule, plan_swaps, usable_bytes
from ..core.stats import LmsStats
from ..core.summary import Words, summary_line
from ..persistent import persistent_bytes
from ..options import LmsOptions
from ..samples import batch_shapes
from ...units import format_mib
from .distribution import mesh_layout, shard_shape

PREDICTION_SOURCE = ("the jaxpr of the loss's value and gradient, replayed in program order (every equation's "
                     "output held to its last reader; XLA fuses and schedules its own way)")
COMPILED_SOURCE = ("XLA's compiled train step (memory_analysis: arguments, outputs, temporaries; on a GPU pool that "
                   "grows, the region its temporaries take)")
COMPILED_FITS = ("the replay of the step's operations does not fit the device, but XLA's compiled step does: nothing "
                 "moves")
HOLDS_MORE = ("XLA's step with the plan's {count} values {verb} holds {moved} on the device, the model's own step "
              "{own}: nothing moves (LMS never raises the peak it exists to lower)")


def memory_kinds() -> set[str]:
    """The memory kinds of JAX's default device ("device", "pinned_host", "unpinned_host" on CPUs and GPUs)."""
    import jax

    try:
        return {memory.kind for memory in jax.devices()[0].addressable_memories()}
    except Exception:  # a platform without memory kinds
        return {"device"}


def host_memory_kind() -> str | None:
    """The host memory kind LMS offloads to on JAX's default device: pinned where it has one, else unpinned, else
    None (nothing to offload to)."""
    kinds = memory_kinds()
    return "pinned_host" if "pinned_host" in kinds else "unpinned_host" if "unpinned_host" in kinds else None


class JaxBackend:
    """One fit's LMS on the JAX backend, for the ``LMS`` callback (see the module's docstring).

    Args:
        model: the model being trained.
        options: the LMS options.
        stats: the fit's stats, filled in when the step is traced.
    """

    jit_note = ""
    keeps_jit = True  # the offload is XLA's, in the jitted step: the model's jit_compile stands

    def __init__(self, model, options: LmsOptions, stats: LmsStats):
        self.model, self.options, self.stats = model, options, stats
        self.recompute = options.recompute
        self.offloaded: dict[tuple, frozenset] = {}  # the step's input shapes -> the names of the values planned
        self.traces = 0
        self.batch_shapes = None  # the batch's (shape, dtype) leaves, as the first trace saw them (callback.py)
        self._layer_types = {layer.name: type(layer).__name__ for layer in internals.layers_of(model)}
        if options.recompute is True:
            stats.notes.append("recompute=True is not built on JAX: the plan offloads (recompute='only' recomputes)")
            self.recompute = False
        stats.update(active=True, backend="jax", lb_counts="XLA's schedule")
        self._kinds = kinds = memory_kinds()
        self.host_kind = host_memory_kind()
        if self.recompute is False and self.host_kind is None:
            stats.notes.append(f"the device has no host memory to offload to (its memory kinds: {sorted(kinds)}): "
                               "the planned values are recomputed instead")
            self.recompute = "only"
        elif self.host_kind == "unpinned_host" and self.recompute is False:
            stats.notes.append("the device has no pinned host memory: outputs are offloaded to unpinned host memory")
        stats.pinned = self.host_kind == "pinned_host" and self.recompute is False
        # under keras.distribution: planned for one device (its share of the batch, its shards of the variables)
        self._layout = mesh_layout()
        self._persistent_bytes = persistent_bytes(model, shard_shape if self._layout is not None else None)
        self._splits = self._variable_splits()  # read here: inside the step the variables are being traced
        self._costed = None  # (the loss and gradient, its argument shapes, batch shards) of the first plan, to cost
        self._first_step_waited = False

    # -- the trace --------------------------------------------------------------------------------
    def train_step(self, original):
        def step(state, data):
            if self.batch_shapes is None:
                self.batch_shapes = batch_shapes(data)
            with self._traced():
                return original(state, data)

        return step

    @contextlib.contextmanager
    def _traced(self):
        """While the step is traced: the model's compute_loss_and_updates, its values named, under
        jax.checkpoint; the model's own again after it."""
        model = self.model
        checkpointed = self._checkpointed(model.compute_loss_and_updates)
        with internals.instance_attribute_replaced(model, "compute_loss_and_updates", checkpointed):
            yield

    def _checkpointed(self, original):
        import jax

        from .residuals import named_residuals

        def compute(trainable, non_trainable, metrics, x, y, sample_weight, training=False, optimizer_variables=None):
            def inner(trainable, non_trainable, metrics, x, y, sample_weight, optimizer_variables):
                return original(trainable, non_trainable, metrics, x, y, sample_weight, training=training,
                                optimizer_variables=optimizer_variables)

            args = (trainable, non_trainable, metrics, x, y, sample_weight, optimizer_variables)
            if not training:
                return inner(*args)
            inner = named_residuals(inner)  # every value the backward pass may keep, named: the candidates
            chosen = self._plan(inner, args)
            if not chosen:  # nothing moves: the step is the model's own, with no checkpoint policy around it
                return inner(*args)
            return jax.checkpoint(inner, policy=self._policy(chosen))(*args)

        return compute

    def _policy(self, chosen: frozenset):
        from .residuals import moved_policy

        return moved_policy(chosen, self.recompute, self.host_kind)

    # -- the plan --------------------------------------------------------------------------------
    def _variable_splits(self) -> list | None:
        """Under ``ModelParallel``: each variable's splits over the mesh, in the order the step takes them
        (trainable, non-trainable, metrics'); None where no layout splits one."""
        if self._layout is None:
            return None
        from .sharded import variable_splits

        model = self.model
        splits = variable_splits(list(model.trainable_variables) + list(model.non_trainable_variables)
                                 + list(model.metrics_variables))
        return splits if any(max(split, default=1) > 1 for split in splits) else None

    def _plan(self, inner, args) -> frozenset:
        from .traced import tree_arrays
        from .residuals import differentiated, trace_step

        key = tuple((tuple(a.shape), str(a.dtype)) for a in tree_arrays(args[3:6]))
        if key in self.offloaded:
            return self.offloaded[key]
        self.traces += 1
        shards = self._layout.batch_shards if self._layout is not None else 1
        step = trace_step(inner, args, self._layer_types, shards, self._splits)
        if self._costed is None:  # the step-time estimate is made after the step, outside this trace
            self._costed = (*differentiated(inner, args), shards)
        eligible = self.options.selection.eligible(step.candidates)
        persistent = self._persistent_bytes
        selection, budget = self.options.selection, self.options.budget_bytes
        try:
            plan = plan_swaps(selection, eligible, step.transient_peak, persistent, budget, self.stats.capacity_bytes)
        except BudgetError as error:
            self.stats.notes.append(f"the budget: {error}; every eligible value is offloaded")
            plan = plan_swaps(dataclasses.replace(selection, n_tensors=-1), eligible, step.transient_peak, persistent)
        from . import compiled as xla

        own = functools.cache(lambda: xla.step_bytes(self.model, inner, args))
        plan = self._nothing_moved_where_xla_fits(plan, own)
        plan, compiled = self._held_to_xla(plan, inner, args, own)
        chosen = frozenset(c.tensor for c in plan.moved)
        self.offloaded[key] = chosen
        moved = list(plan.moved)
        action = "recompute" if self.recompute == "only" else "swap"
        self.stats.update(candidates=len(step.candidates), persistent_bytes=persistent, device_peak_bytes=plan.peak_bytes,
                          device_peak_bytes_without_lms=plan.peak_bytes_without_lms, peak_source="predicted",
                          prediction_source=COMPILED_SOURCE if compiled or plan.note == COMPILED_FITS
                          else PREDICTION_SOURCE)
        if plan.note and plan.note not in self.stats.notes:
            self.stats.notes.append(plan.note)
        self.stats.record_plan(plan, [(action, c) for c in moved])
        if action == "recompute":
            self.stats.update(recomputed_tensors=len(moved), recomputed_bytes_per_step=plan.moved_bytes,
                              swapped_tensors=0, swapped_bytes_per_step=0)
        else:
            self.stats.update(swapped_tensors=len(moved), swapped_bytes_per_step=plan.moved_bytes)
        loop_note = ("the step has loops or conditionals (scan, while, cond): outputs inside them are not offloaded "
                     "(XLA has skipped offloads under scan with remat: jax#23869)")
        if step.flat.loops and loop_note not in self.stats.notes:
            self.stats.notes.append(loop_note)
        return chosen

    def _nothing_moved_where_xla_fits(self, plan: Plan, own) -> Plan:
        """``plan``, or nothing moved where the replay's plain step does not fit the device but XLA's compiled one
        (``own()``) does: XLA fuses much of what the replay keeps, on a GPU most (docs/jax.md), and a step that
        fits should pay nothing. Asked only where the plan would move something to fit the device's capacity, on
        one device; one compile of the loss and gradient."""
        if not plan.moved or plan.rule is not Rule.FITS_DEVICE or self._layout is not None:
            return plan
        compiled = own()
        if compiled is None or compiled > usable_bytes(self.stats.capacity_bytes):
            return plan
        return Plan((), Rule.FITS_DEVICE, peak_bytes=compiled, peak_bytes_without_lms=compiled,
                    budget_bytes=plan.budget_bytes, fits=True, plans_tried=plan.plans_tried + 1, note=COMPILED_FITS)

    def _held_to_xla(self, plan: Plan, inner, args, own) -> tuple[Plan, bool]:
        """``(plan, whether its figures are XLA's)``: on a GPU or TPU, the plan as XLA compiles it, against the
        model's own step (``own()``). XLA schedules the copies and the recomputation its own way, and may hold
        more with the offloads than without (docs/measurements_gpu.md). Where the plan's
        compiled step holds less on the device, its figures are XLA's; where it holds as much or more, nothing
        moves, said in a note. On one device; on a CPU (one memory) the replay's figures stand."""
        from . import compiled as xla

        if not plan.moved or self._layout is not None or not xla.places_apart():
            return plan, False
        moved = xla.step_bytes(self.model, inner, args, self._policy(frozenset(c.tensor for c in plan.moved)))
        if moved is None or own() is None:
            return plan, False
        budget = plan.budget_bytes
        if moved < own():
            return dataclasses.replace(plan, peak_bytes=moved, peak_bytes_without_lms=own(),
                                       fits=None if budget is None else moved <= budget,
                                       plans_tried=plan.plans_tried + 1), True
        verb = "recomputed" if self.recompute == "only" else "offloaded"
        note = HOLDS_MORE.format(count=len(plan.moved), verb=verb, moved=format_mib(moved), own=format_mib(own()))
        return Plan((), plan.rule, peak_bytes=own(), peak_bytes_without_lms=own(), budget_bytes=budget,
                    fits=None if budget is None else own() <= budget, plans_tried=plan.plans_tried + 1,
                    note=note), True

    # -- the callback's contract --------------------------------------------------------------------
    def train_function(self, function):
        """``function`` (Keras's train function over the LMS step) called with the state committed to JAX's
        default device. A step with offloads returns its state committed (its shardings name memory kinds),
        while the variables Keras reads at a fit's or an epoch's start are not: uncommitted arguments would
        compile the step a second and a third time. Committing an array on its own device copies nothing."""
        import jax

        kind = "device" if "device" in self._kinds else None
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind=kind)

        def commit(leaf):
            return jax.device_put(leaf, device) if isinstance(leaf, jax.Array) and not leaf.committed else leaf

        def call(state, *rest, **kwargs):
            result = function(jax.tree_util.tree_map(commit, state), *rest, **kwargs)
            if not self._first_step_waited:
                # JAX runs steps asynchronously: a first step that runs out of memory says so here, inside the LMS
                # step, where the callback explains it, not when Keras reads the loss (seen on an H200)
                self._first_step_waited = True
                jax.block_until_ready(result)
            return result

        return call

    def step_scope(self):
        return contextlib.nullcontext()

    def first_step_done(self, measured_step_bytes: int | None = None) -> Action:
        """After the first step: the plan's predicted step time (``predicted_step_ratio``), from XLA's FLOP count
        of the step and the host link (``compute.step_cost``)."""
        if self._costed is not None and self.recompute is False:
            from .compute import step_cost

            try:
                cost = step_cost(*self._costed)
            except Exception as error:  # a prediction must never stop training
                self.stats.notes.append(f"no step-time prediction ({type(error).__name__}: {error})")
                cost = None
            if cost is not None:
                self.stats.update(predicted_step_ratio=cost.ratio(self.stats.swapped_bytes_per_step),
                                  compute_s=cost.compute_s, compute_source=cost.source)
        self._costed = None
        return Action.KEEP

    def summary_line(self) -> str:
        return summary_line(self.stats, Words("LMS (JAX)", "saved values", "offloading",
                                              f"{(self.host_kind or 'host').replace('_', ' ')} memory", "device"))

    def close(self) -> None:
        pass


