"""The ``LMS`` Keras callback: Large Model Support for Keras 3, over one backend per framework.

The callback owns the options (checked once, ``lms/options.py``), the fit's stats and the train
function's place in the model (``train_function.py``); a backend (``backend.py``'s contract) does
the work of one fit: ``TensorFlowBackend`` (graph rewrite, executed-graph replay),
``TorchBackend`` (saved-tensor hooks) or ``JaxBackend`` (``jax.checkpoint`` with an offload policy).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings

import keras

from .. import internals
from ..versions import check_versions
from .backend import Action, Backend, BackendFactory
from .core.stats import LmsStats
from .devices import is_simulated
from .framework import framework as chosen_framework
from .options import LmsOptions
from .train_function import LmsTrainFunction
from ..memory.errors import is_out_of_memory, release_library_frames


class LmsNotice(UserWarning):
    """What LMS tells once per process (shown by Python's warnings, so a repeated fit does not repeat it)."""


class LMS(keras.callbacks.Callback):
    """Trains with Large Model Support: activations wait in host memory.

    The forward tensors that the backward pass reads are copied to host memory
    as soon as they are produced, their device buffers are freed, and each is
    copied back ``lb`` backward ops before the op that reads it. The values are
    only copied: losses and weights are those of training without LMS, to
    the bit (docs/lms.md, "Same math", says how that is checked).

    Args:
        n_tensors: which tensors to swap, first produced first. None (the
            default) plans: the count with the lowest predicted device peak
            and, among counts within 1% of it, the fewest bytes moved; never
            a plan predicted above the peak without LMS (where no swap helps,
            nothing is swapped and ``stats.notes`` says where the peak is).
            -1 swaps all, 0 turns LMS off, N swaps the first N. On PyTorch,
            which measures rather than predicts, None offloads every
            eligible tensor, as -1 does.
        lb: a swap-in starts at least ``lb`` backward ops before its consumer.
            Defaults to 1.
        budget: device memory to stay under, in bytes or as "6GiB": swap the
            fewest bytes whose predicted peak fits (the search does not assume
            that more swaps lower the peak). Overrides ``n_tensors``.
            Defaults to None.
        min_bytes: leave smaller tensors on the device. Defaults to 65536.
        include_layers, exclude_layers: layer names to (only / never) swap.
        include_types, exclude_types: layer class names, e.g. ("Conv2D",).
        device: the accelerator, e.g. "/GPU:0" (or "cuda:0"). Defaults to the first GPU; with
            no GPU, LMS does nothing and says so (after
            ``lms_magic.simulate_accelerator()``, "/CPU:0").
        host_device: where swapped tensors wait. Defaults to "/CPU:0" ("/CPU:1"
            after ``lms_magic.simulate_accelerator()``).
        verbose: 1 prints a line when training starts (where several processes train together, process 0
            does; each keeps its stats), 0 nothing. Defaults to 1.
        batch_size_hint: the batch size, for data whose batches TensorFlow
            traces with an unknown size (Python generators); an int or a
            function returning one. Defaults to None.
        recompute: False (the default) swaps what the plan moves; True
            (the hybrid plan) recomputes those of them that can be at no
            higher predicted peak and swaps the rest; "only" recomputes and
            never swaps (gradient checkpointing through ``fit``: nothing
            crosses the host link). A recomputed tensor, made by cheap
            operations (activations, element-wise arithmetic,
            concatenations) from tensors the backward pass holds anyway (or,
            with True, swaps back in), is dropped after the forward pass and
            computed again, to the bit, just before the backward pass reads
            it. Training is bit-identical on some models and differs at
            float rounding on others (docs/lms_modes.md says which). On PyTorch
            a recomputed layer is a cheap one (a normalization, an
            activation, a dropout) run under ``torch.utils.checkpoint``,
            with its state set back for the second run, chosen where it
            keeps fewer bytes at no higher predicted peak: bit-identical on
            the tested models (docs/pytorch.md).
        lean_ops: True computes each BatchNormalization's gradient in one
            piece (two full-size intermediates instead of Keras's four and
            more) while LMS trains: a lower backward-pass peak, at the price
            of results that differ at float rounding (docs/measurements.md: measured
            differences). Defaults to False. On PyTorch, the normalization
            runs in PyTorch's fused kernel (``torch.nn.functional.batch_norm``),
            which keeps the input and per-channel statistics for the backward
            pass.
        order_backward: True runs the backward pass one layer's gradient
            at a time, a branch finished before its sibling starts, where the
            replay predicts a lower peak so (a residual block's two
            BatchNormalization gradients no longer side by side): control
            edges only, every value bit-identical. Swaps only (with
            ``recompute`` it is left off, and said). Off by default: the
            predicted gains are not yet measured ones (docs/lms_modes.md).
            ``stats.ordered_layers`` counts the layers so ordered.
            TensorFlow only. Defaults to False.
        backend: makes the engine of each fit from ``(model, options, stats)``
            (``lms/backend.py``'s contract); ``lms_magic.testing.backends.FakeBackends`` is a
            scripted one for tests. Defaults to None: Keras's backend's engine.

    Raises:
        lms_magic.lms.options.OptionError: (a ValueError) an option's value is not one it takes.

    After training, ``stats`` (an ``LmsStats``) holds what was done, and the device peak predicted
    (TensorFlow, PyTorch, and JAX from the step's jaxpr: docs/jax.md) or measured (PyTorch with CUDA).

    Its state (18 attributes) is what one fit's callback must carry between Keras's calls: its options, stats and
    backend factory; the fit's backend and the train function it wraps; what it reads of the device around each
    step (the allocator, the step's peak, what the host held before, whether the host shares the allocator); the
    checked step's start and the steps begun (what a probe's decision weighs); and the summary's schedule.

    Example:
        >>> import keras, numpy as np
        >>> from lms_magic import LMS
        >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(64, activation="relu"),
        ...                           keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> callback = LMS(device="/CPU:0", n_tensors=-1, min_bytes=0, verbose=0)  # on a GPU machine: LMS()
        >>> history = model.fit(np.ones((32, 8)), np.ones(32), verbose=0, callbacks=[callback])
        >>> callback.stats["active"], callback.stats["swapped_tensors"] > 0
        (True, True)
    """

    def __init__(self, *args, backend: BackendFactory | None = None, **options):
        super().__init__()
        self.options = LmsOptions.from_api(*args, **options)
        self._make_backend = backend
        self.stats = LmsStats(reason="not trained yet")
        self._backend: Backend | None = None  # while a fit with this callback runs
        self._function: LmsTrainFunction | None = None  # while a fit with this callback runs
        self._summary_line = ""
        # the device's allocator, read around each step whose plan is checked (an AllocatorCounter: a GPU's,
        # found at the fit's start where this is None; tests give a fake)
        self.allocator = None
        # the steps of the fit LMS weighs its first step's swaps against a retrace over (None: this fit's own, as
        # Keras counts them; math.inf: a fit of unknown length); explain_fit's measured steps set the fit they
        # stand for
        self.fit_steps: float | None = None
        self._counter, self._held_before = None, 0
        self._step_peak_bytes = 0  # the counter's peak read as the checked step returned
        self._shares_host = False  # the counter is the simulated device's, which the host shares
        self._checking = False  # a step whose plan is checked has begun, and is not acted on yet
        self._planning_since: float | None = None  # when the first step whose plan is checked began
        self._checked_since = 0.0  # when the step whose plan is checked now began (a retrace's cost: LmsStats)
        self._steps_begun = 0  # this fit's steps so far
        self._process = (0, 1)  # this process's index among those training together, and their count

    @property
    def _prints(self) -> bool:
        """Whether this callback prints: verbose, and the first of the processes training together (every
        process keeps its stats)."""
        return bool(self.verbose) and self._process[0] == 0

    @classmethod
    def from_options(cls, options: LmsOptions, backend: BackendFactory | None = None) -> "LMS":
        """An ``LMS`` with ``options`` as they are (an ``LmsOptions``, checked when it was made): what the magics
        and the tuner hand on.

        Example:
            >>> LMS.from_options(LmsOptions(lb=2, verbose=0)).lb
            2
        """
        callback = cls(backend=backend)
        callback.options = options
        return callback

    # the options, as attributes (TFLMS's callback had them so)
    n_tensors = property(lambda self: self.options.n_tensors)
    lb = property(lambda self: self.options.lb)
    min_bytes = property(lambda self: self.options.min_bytes)
    budget_bytes = property(lambda self: self.options.budget_bytes)
    device = property(lambda self: self.options.device)
    host_device = property(lambda self: self.options.host_device)
    verbose = property(lambda self: self.options.verbose)
    selection = property(lambda self: self.options.selection)

    @property
    def _keras_model(self):
        """The model, as Keras set it: on JAX, Keras's ``model`` property writes the fit's state back into the
        model's variables, and inside a step that write would hand the variables the buffers the jitted step is
        about to donate."""
        return self._model

    # -- Keras hooks -------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._checking, self._planning_since, self._steps_begun = False, None, 0
        self._restore()
        LmsTrainFunction.remove_from(self._keras_model)  # left by a fit that ended between a batch begin and its step
        framework = chosen_framework()
        make = self._make_backend
        self.stats = LmsStats(backend=framework.name if make is None else None, budget_bytes=self.options.budget_bytes)
        batch_size, source = internals.fit_batch_size(internals.calling_frames(depth=12))
        self.stats.update(batch_size=batch_size, batch_size_source=source)
        options = framework.prepare(self.options, self.stats, self._keras_model)
        self._process = framework.process()
        if make is None:
            check_versions(framework.version_modules)
            off = framework.off_reason(options, self._keras_model)
            if off is not None:
                self.stats.reason, notice = off
                if self._prints:
                    warnings.warn(notice, LmsNotice, stacklevel=2)
                return
            make = framework.backend()
        self.stats.notes += _not_honoured(options, framework.unavailable)
        self.stats.notes += options.selection.unknown_names(internals.layer_types(self._keras_model))
        if options.n_tensors == 0 and options.budget_bytes is None:
            self.stats.reason = "n_tensors=0: LMS is off"
            return
        self._backend = make(self._keras_model, options, self.stats)
        self._counter = self.allocator if self.allocator is not None else _step_allocator(options.device)
        self._shares_host = self.allocator is None and is_simulated(options.device)
        self._install(self._backend.train_step(self._keras_model.train_step), self._backend.jit_note)

    # No on_train_batch_end: a callback with one keeps Keras from dispatching batch ends asynchronously (JAX,
    # PyTorch) for the whole fit. A step whose plan is checked is acted on before the next step begins, or at the
    # epoch's or the fit's end.
    def on_train_batch_begin(self, batch, logs=None):
        if self._checking:
            self._step_checked()
        self._steps_begun += 1
        if self._function is not None:
            self._function.arm()
            if self._summary_due:
                self._checking = True
                self._checked_since = time.perf_counter()
                if self._planning_since is None:
                    self._planning_since = self._checked_since
                if self._counter is not None:  # a step whose plan is checked: measured
                    self._counter.reset()
                    self._held_before, self._step_peak_bytes = self._counter.read()[0], 0

    def on_epoch_end(self, epoch, logs=None):
        if self._checking:
            self._step_checked()

    def _step_checked(self) -> None:
        """After a step whose plan was checked: the backend's decision on it (keep, trace again, step out)."""
        self._checking = False
        if self._function is None or not self._summary_due:
            return
        counter = self._counter
        # the simulated device shares its allocator with the host: its reading is the device's where nothing swapped
        unread = counter is None or self._shares_host and self.stats.swapped_tensors
        measured = None if unread else max(0, max(counter.read()[1], self._step_peak_bytes) - self._held_before)
        steps = (self.params or {}).get("steps")
        total = self.fit_steps
        if total is None and steps:
            total = steps * (self.params.get("epochs") or 1)
        known = total is not None and total != math.inf
        self.stats.update(steps_left=max(0, total - self._steps_begun) if known else None,
                          checked_step_s=time.perf_counter() - self._checked_since)
        action = self._backend.first_step_done() if measured is None else self._backend.first_step_done(measured)
        if action is Action.RETRACE:  # the next step traces the backend's new plan, and is checked in turn
            self._install(self._backend.train_step(self._keras_model.train_step), self._backend.jit_note)
            return
        self._summary_due = False
        self._note_first_steps()
        if action is Action.STEP_OUT:
            LmsTrainFunction.remove_from(self._keras_model)
            self._function = None
            self.stats.jit_compile_off = False
        if self.stats.active:
            self._summary_line = self._backend.summary_line()
        if self._prints:
            print(self.summary())

    def _note_first_steps(self) -> None:
        """Says what the steps whose plan was checked took: the traces and the planning are their extra time."""
        if self._planning_since is None:
            return
        took_s, self._planning_since = time.perf_counter() - self._planning_since, None
        traces = getattr(self._backend, "trace_count", None)
        traced = f": the step was traced {traces} time{'s' if traces != 1 else ''} and planned" if traces else ""
        self.stats.notes.append(f"LMS's first step took {took_s:.1f} s{traced}; later steps run as planned")

    def on_train_end(self, logs=None):
        if self._checking:
            self._step_checked()
        if self._function is not None and self._summary_due:  # a fit that ended before its plan was checked
            self._summary_due = False
            if self.stats.active:
                self._summary_line = self._backend.summary_line()
            if self._prints:
                print(self.summary())
        self._restore()

    def _install(self, train_step, jit_note: str) -> None:
        """Makes the LMS train function; it takes the model's place one step at a time (see train_function.py).

        Nothing of the model or of TensorFlow is changed between steps: the
        train step, XLA and graph collection are set for the duration of
        each LMS step only (Grappler's options are never touched), so whatever ends the fit
        (an exception in a callback, the data or the step, an interrupt)
        leaves them as they were.
        """
        model = self._keras_model
        self._jit_off = not getattr(self._backend, "keeps_jit", False)
        if self._jit_off and internals.jit_compile_requested(model) and jit_note not in self.stats.notes:
            self.stats.notes.append(jit_note)
            self.stats.jit_compile_off = True
        self._lms_step = train_step
        plain = model.train_function
        try:
            with internals.train_step_replaced(model, train_step, self._jit_off):
                model.make_train_function(force=True)
                made = model.train_function
        finally:
            model.train_function = plain
        made = getattr(self._backend, "train_function", lambda function: function)(made)
        self._function = LmsTrainFunction(made, plain, model, self._step_scope)
        self._summary_due = True

    @contextlib.contextmanager
    def _step_scope(self):
        """What one LMS step needs set (the rewritten train step, the backend's settings), and nothing after it.

        A step that raises (an interrupt, out of memory) ends this callback's fit there: the backend is
        closed at once. (A fit that another callback or the data ends is closed when the callback next
        trains: Keras tells callbacks nothing then.)
        """
        try:
            with internals.train_step_replaced(self._keras_model, self._lms_step, self._jit_off), self._backend.step_scope():
                self.stats.steps += 1
                yield
            if self._checking and self._counter is not None:  # read at once too: a callback before this one in
                self._step_peak_bytes = self._counter.read()[1]  # the list may reset the peak at the next batch
        except BaseException as error:
            shapes = getattr(self._backend, "batch_shapes", None)
            self._restore()
            if self.verbose and isinstance(error, Exception) and is_out_of_memory(error):
                self._say_out_of_memory(error, shapes)
            raise

    def _say_out_of_memory(self, error: Exception, shapes) -> None:
        """Above an out-of-memory error of an LMS step: what the step needed, what filled it, what would fit
        (``explain/account.py``'s ``out_of_memory_account``, on zeros shaped as the batch); the error is then raised as it was."""
        from ..memory.errors import mark_explained
        from .explain.account import not_explained, out_of_memory_account
        from .samples import zeros_like_batch

        release_library_frames(error)  # the failed step's tensors: the account runs a step on the device too
        try:
            data = zeros_like_batch(shapes) if shapes is not None and self.stats.batch_size else None
        except Exception:  # a batch this cannot rebuild (dicts of inputs): said, never raised
            data = None
        index, count = self._process
        if count > 1:  # on a cluster: which process ran out
            print(f"lms_magic: process {index} of {count} (devices {', '.join(self.stats.devices) or 'its own'}):")
        steps = (self.params or {}).get("steps")
        samples = steps * (self.params.get("epochs") or 1) * self.stats.batch_size if steps and data is not None \
            else None
        fit_steps = None if samples is None else lambda batch: -(-samples // batch)  # the same samples, in batches
        print(out_of_memory_account(self._keras_model, data, self.stats.batch_size, fit_steps) if data is not None
              else not_explained("even with LMS, on a batch this cannot rebuild"))
        mark_explained(error)

    def summary(self) -> str:
        """One line: what LMS swapped and the device peaks (predicted)."""
        stats = self.stats
        if not stats.active:
            return f"LMS: inactive ({stats.reason})"
        return "\n".join([self._summary_line] + [f"LMS: {note}" for note in stats.notes])

    # -- restoring the model -----------------------------------------------------------------
    def _restore(self) -> None:
        """Ends this callback's fit: the model's own train function is back, the backend's resources released."""
        function, self._function = self._function, None
        if function is not None:
            function.remove_from(self._keras_model)
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()


def _step_allocator(device: str | None):
    """The allocator counter of ``device`` where it is a GPU whose framework lets its peak be reset, or the one
    accelerator ``simulate_accelerator`` made (it shares TensorFlow's CPU allocator with the host, so a step that
    swapped is not read from it: ``first_step._measured_here`` takes the host's share out of that step's
    profile); else None."""
    simulated = is_simulated(device) and not is_simulated("/CPU:1")  # several would share one allocator
    if device is None or not (simulated or device.upper().lstrip("/").startswith(("GPU", "CUDA"))):
        return None
    from ..memory.frameworks import resettable_counter

    return resettable_counter(device)


def _not_honoured(options: LmsOptions, unavailable: dict[str, str]) -> list[str]:
    """A note for each option set away from its default that the framework does not honour (``unavailable``: why).

    Example:
        >>> _not_honoured(LmsOptions(lb=2, lean_ops=True), {"lb": "not honoured here", "lean_ops": "not here"})
        ['lb=2 is not honoured here', 'lean_ops is not here']
    """
    defaults = LmsOptions()
    notes = []
    for name, why in unavailable.items():
        value = getattr(options, name)
        if value != getattr(defaults, name):
            notes.append(f"{name}={value!r} is {why}" if name == "lb" else f"{name} is {why}")
    return notes


def _signature():
    """``LMS(...)``'s signature as ``help(LMS)`` and editors show it: every ``LmsOptions`` field, then ``backend``."""
    import inspect

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)] + LmsOptions.api_signature()
    parameters.append(inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None))
    return inspect.Signature(parameters)


LMS.__init__.__signature__ = _signature()
