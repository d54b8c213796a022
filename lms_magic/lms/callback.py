"""The ``LMS`` Keras callback: Large Model Support for Keras 3 (TensorFlow, and PyTorch via torch_offload)."""

from __future__ import annotations

import contextlib
import importlib
import time

import keras

from .. import compat
from .plan import DEFAULT_MIN_BYTES, BudgetError, Selection, choose_swaps, parse_bytes
from ..units import MIB


class _Lazy:
    """A module imported on first use: LMS on the PyTorch backend never imports TensorFlow."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        return getattr(importlib.import_module(self._name), attribute)


tf = _Lazy("tensorflow")
_predict = _Lazy("lms_magic.lms.predict")
_graph = _Lazy("lms_magic.lms.tensorflow")

_said_no_gpu = False


def _tensorflow_devices() -> list[str]:
    return ["/" + device.name.split("device:")[-1] for device in tf.config.list_logical_devices()]


def check_devices(device: str | None, host_device: str | None = None) -> None:
    """Raises ValueError, naming the devices this process has, when ``device`` or ``host_device`` is not one.

    On the PyTorch backend "/GPU:1", "cuda:1" and "/CPU:0" are understood.

    Example:
        >>> check_devices("/CPU:0", "/cpu:0")
        >>> check_devices("banana")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: LMS: device='banana' is not a device of this process, which has /CPU:0...
    """
    for role, spec in (("device", device), ("host_device", host_device)):
        if spec is None:
            continue
        if keras.backend.backend() == "torch":
            known = _torch_device_names()
            try:
                from .torch_offload import torch_device

                name = str(torch_device(spec))
            except (ValueError, TypeError):
                name = None
        else:
            known = _tensorflow_devices()
            try:
                name = tf.DeviceSpec.from_string(spec).to_string().replace("device:", "")
            except (ValueError, TypeError, AttributeError):
                name = None
        if name not in known:
            raise ValueError(f"LMS: {role}={spec!r} is not a device of this process, which has {', '.join(known)}: "
                             f"pass one of them, e.g. {role}={known[-1 if role == 'device' else 0]!r}")


def _torch_device_names() -> list[str]:
    import torch

    return ["cpu"] + [f"cuda:{index}" for index in range(torch.cuda.device_count())]


class LMS(keras.callbacks.Callback):
    """Trains with Large Model Support: activations wait in host memory.

    The forward tensors that the backward pass reads are copied to host memory
    as soon as they are produced, their device buffers are freed, and each is
    copied back ``lb`` backward ops before the op that reads it. The values are
    only copied, so losses and weights are the same as without LMS.

    Args:
        n_tensors: how many tensors to swap, first produced first: -1 all
            (default), 0 LMS off, N the first N.
        lb: a swap-in starts at least ``lb`` backward ops before its consumer.
            Defaults to 1.
        budget: device memory to stay under, in bytes or as "6GiB": swap the
            fewest tensors whose predicted peak fits. Overrides ``n_tensors``.
            Defaults to None.
        min_bytes: leave smaller tensors on the device. Defaults to 65536.
        include_layers, exclude_layers: layer names to (only / never) swap.
        include_types, exclude_types: layer class names, e.g. ("Conv2D",).
        device: the accelerator, e.g. "/GPU:0". Defaults to the first GPU; with
            no GPU, LMS does nothing and says so.
        host_device: where swapped tensors wait. Defaults to "/CPU:0".
        verbose: 1 prints a line when training starts, 0 nothing. Defaults to 1.
        batch_size_hint: the batch size, for data whose batches TensorFlow
            traces with an unknown size (Python generators); an int or a
            function returning one. Defaults to None.

    After training, ``stats`` holds what was done and predicted.

    Example:
        >>> import keras, numpy as np
        >>> from lms_magic import LMS
        >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(64, activation="relu"),
        ...                           keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> callback = LMS(device="/CPU:0", min_bytes=0, verbose=0)  # on a GPU machine: LMS()
        >>> history = model.fit(np.ones((32, 8)), np.ones(32), verbose=0, callbacks=[callback])
        >>> callback.stats["active"], callback.stats["swapped_tensors"] > 0
        (True, True)
    """

    def __init__(self, n_tensors: int = -1, lb: int = 1, budget=None, min_bytes: int = DEFAULT_MIN_BYTES,
                 include_layers=(), exclude_layers=(), include_types=(), exclude_types=(),
                 device: str | None = None, host_device: str = "/CPU:0", verbose: int = 1, batch_size_hint=None):
        super().__init__()
        if not isinstance(lb, int) or lb < 1:
            raise ValueError(f"lb must be a whole number >= 1, got {lb!r}")
        for role, spec in (("device", device), ("host_device", host_device)):
            if not (isinstance(spec, str) or (spec is None and role == "device")):
                raise ValueError(f"{role} takes a device name such as '/GPU:0' or '/CPU:0', got {spec!r}")
        self.selection = Selection(n_tensors, int(min_bytes), include_layers, exclude_layers,
                                   include_types, exclude_types)
        self.n_tensors, self.lb, self.min_bytes = n_tensors, lb, int(min_bytes)
        self.budget_bytes = None if budget is None else parse_bytes(budget)
        self.device, self.host_device, self.verbose = device, host_device, verbose
        self.batch_size_hint = batch_size_hint
        self.stats = self._empty_stats("not trained yet")
        self._torch = None  # the PyTorch backend's offloader, when training on it
        self._function: _LmsTrainFunction | None = None  # while a fit with this callback runs

    # -- state -----------------------------------------------------------------------------
    def _empty_stats(self, reason: str) -> dict:
        return {"active": False, "reason": reason, "swapped_tensors": 0, "swapped_bytes_per_step": 0,
                "device_peak_bytes": None, "device_peak_bytes_without_lms": None, "plan": [],
                "candidates": 0, "persistent_bytes": None, "prediction_source": None, "peak_source": None,
                "lb_counts": "backward ops", "notes": []}

    def _resolve_device(self) -> str | None:
        global _said_no_gpu
        if self.device is None:
            gpus = [name for name in _tensorflow_devices() if name.startswith("/GPU")]
            if not gpus:
                if not _said_no_gpu and self.verbose:
                    print("LMS: no GPU found, so nothing is swapped (pass device=... to choose one)")
                _said_no_gpu = True
                return None
            return gpus[0]
        check_devices(self.device, self.host_device)
        return self.device

    # -- Keras hooks -------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._restore()
        _LmsTrainFunction.remove_from(self.model)  # left by a fit that ended between a batch begin and its step
        backend = keras.backend.backend()
        if backend not in ("tensorflow", "torch"):
            from .jax_offload import unsupported_message

            raise RuntimeError(unsupported_message(backend))
        compat.check_versions(backend)
        self.stats = self._empty_stats("")
        self.stats["notes"] += self.selection.unknown_names(compat.layer_types(self.model))
        if self.selection.n_tensors == 0 and self.budget_bytes is None:
            self.stats["reason"] = "n_tensors=0: LMS is off"
            return
        if backend == "torch":
            self._begin_torch()
            return
        self._device = self._resolve_device()
        if self._device is None:
            self.stats["reason"] = "no GPU"
            return
        model = self.model
        if model.run_eagerly:
            raise ValueError("LMS rewrites the compiled train step; compile without run_eagerly=True")
        self._traces = {}
        self._layer_of = _graph.layer_resolver(model)
        self._batch_hint = None
        self._budget_checked = False
        self._run_metadata = []
        self._install(self._wrap(model.train_step), "XLA (jit_compile) is off while LMS trains: XLA ignores the "
                      "swap ordering")

    def on_train_batch_begin(self, batch, logs=None):
        if self._function is not None:
            self._function.arm()

    def on_train_batch_end(self, batch, logs=None):
        if self._function is not None and self._summary_due:
            self._summary_due = False
            if self._torch is not None:
                found = self._torch.stats()
                found["notes"] = self.stats["notes"] + found["notes"]
                self.stats.update(found)
            else:
                self._read_executed_graph()
            if self.verbose:
                print(self.summary())

    def on_train_end(self, logs=None):
        self._restore()

    def _begin_torch(self) -> None:
        """PyTorch backend: saved activations go to pinned host memory through autograd's hooks."""
        from .torch_offload import TorchOffloader

        model = self.model
        self._torch = TorchOffloader(self.selection, self.lb, self.budget_bytes, self.device)
        self._device = str(self._torch.device)
        original = model.train_step
        self._install(lambda data: self._torch.run(original, data),
                      "torch.compile (jit_compile) is off while LMS trains: it traces its own graph around "
                      "autograd's saved-tensor hooks")

    def _install(self, train_step, jit_note: str) -> None:
        """Makes the LMS train function; it takes the model's place one step at a time (see _LmsTrainFunction).

        Nothing of the model or of TensorFlow is changed between steps: the
        train step, XLA and Grappler settings and graph collection are set
        for the duration of each LMS step only, so whatever ends the fit
        (an exception in a callback, the data or the step, an interrupt)
        leaves them as they were.
        """
        model = self.model
        if compat.jit_compile_requested(model):
            self.stats["notes"].append(jit_note)
        self._lms_step = train_step
        plain = model.train_function
        try:
            with compat.train_step_replaced(model, train_step):
                model.make_train_function(force=True)
                made = model.train_function
        finally:
            model.train_function = plain
        self._function = _LmsTrainFunction(made, plain, self)
        self._summary_due = True

    @contextlib.contextmanager
    def _step_scope(self):
        """What one LMS step needs set, and nothing after it."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(compat.train_step_replaced(self.model, self._lms_step))
            if self._torch is None:
                stack.enter_context(compat.grappler_options(_graph.GRAPPLER_SETTINGS))
                if not self._run_metadata:  # the first step: TensorFlow instantiates the function
                    stack.enter_context(compat.collected_function_graphs(self._run_metadata))
            yield

    # -- the rewrite -------------------------------------------------------------------------
    def _wrap(self, original):
        replicas = self.model.distribute_strategy.num_replicas_in_sync

        def lms_train_step(data):
            if not compat.in_function_graph():
                return original(data)
            graph = tf.compat.v1.get_default_graph()
            if self.budget_bytes is not None and not self._budget_checked:
                self._check_budget(original, data)
            state = self._traces.setdefault(id(graph), {"start": len(graph.get_operations()), "open": 0, "done": 0})
            state["open"] += 1
            try:
                logs = original(data)
            finally:
                state["open"] -= 1
                state["done"] += 1
            if state["open"] == 0 and state["done"] == replicas:
                self._rewrite(graph, state["start"], data)
            return logs

        return lms_train_step

    def _check_budget(self, original, data) -> None:
        """Plans on a throwaway trace, so an impossible budget is refused before the real
        trace runs the train step (Keras's state does not survive a trace aborted after it)."""
        self._budget_checked = True
        specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype) if isinstance(t, tf.Tensor) else t,
                                      data)
        probe = tf.function(original, autograph=False).get_concrete_function(specs).graph
        try:
            self._plan(probe.get_operations(), data)
        except BudgetError as error:
            raise BudgetError(f"LMS: {error}") from None

    def _plan(self, ops, data):
        """Finds the candidates of a traced step and chooses the ones to swap."""
        first = tf.nest.flatten(data)[0]
        batch = first.shape[0] if first.shape.rank else None
        hint = self.batch_size_hint() if callable(self.batch_size_hint) else self.batch_size_hint
        batch = batch or self._batch_hint or hint
        self._batch_hint = self._batch_hint or batch
        candidates, notes = _graph.find_candidates(ops, self._layer_of, self.lb, batch)
        if batch is None:
            notes.append("the batch size is unknown when TensorFlow traces this data (a generator?), so tensor "
                         "sizes are unknown and nothing is swapped; pass batch_size_hint=...")
        by_tensor = {item.candidate.tensor: item for item in candidates}
        input_bytes = [_graph.static_bytes(t, batch) or 0 for t in tf.nest.flatten(data) if isinstance(t, tf.Tensor)]
        step = _predict.TracedStep(ops, batch, self.host_device, input_bytes)
        persistent = _predict.variables_bytes(self.model)
        chosen = choose_swaps(self.selection, [item.candidate for item in candidates], self.budget_bytes, persistent,
                              lambda cands: step.predicted_transient_peak([by_tensor[c.tensor] for c in cands]))
        return candidates, notes, step, persistent, input_bytes, [by_tensor[c.tensor] for c in chosen]

    def _rewrite(self, graph, start: int, data) -> None:
        started = time.perf_counter()
        ops = graph.get_operations()[start:]
        try:
            candidates, notes, step, persistent, input_bytes, chosen_items = self._plan(ops, data)
        except BudgetError:  # the probe found it feasible; a retrace with other shapes may not be
            budget, self.budget_bytes = self.budget_bytes, None
            try:
                candidates, notes, step, persistent, input_bytes, chosen_items = self._plan(ops, data)
            finally:
                self.budget_bytes = budget
            notes.append("the budget is not reachable for one batch shape: every eligible tensor is swapped there")
        if "records" in self.stats:
            _graph.insert_swaps(graph, chosen_items, self.host_device)  # a retrace: same rule, stats from the first
            return
        batch = step.batch_size
        traced_peaks = (persistent + step.predicted_transient_peak(chosen_items),
                        persistent + step.predicted_transient_peak([]))
        records = _graph.insert_swaps(graph, chosen_items, self.host_device)
        self._step = _predict.TracedStep(graph.get_operations()[start:], batch, self.host_device, input_bytes)
        self.stats.update({
            "active": True, "records": records, "candidates": len(candidates), "persistent_bytes": persistent,
            "swapped_tensors": len(records), "swapped_bytes_per_step": sum(r.candidate.nbytes for r in records),
            "device_peak_bytes": traced_peaks[0], "device_peak_bytes_without_lms": traced_peaks[1],
            "prediction_source": "traced graph", "peak_source": "predicted", "traced_device_peaks": traced_peaks,
            "plan": [{"tensor": r.candidate.tensor, "layer": r.candidate.layer, "layer_type": r.candidate.layer_type,
                      "shape": r.candidate.shape, "bytes": r.candidate.nbytes, "lb": r.hops, "trigger": r.trigger}
                     for r in records],
        })
        self.stats["notes"] += notes
        self.stats["rewrite_s"] = time.perf_counter() - started

    def _read_executed_graph(self) -> None:
        partitions = _predict.train_partitions(self._run_metadata[0]) if self._run_metadata else []
        self._run_metadata = [None]  # read once; the protos are released
        if not partitions or not self.stats.get("active"):
            return
        self.stats["partition_graphs"] = partitions
        try:
            with_lms, without_lms, unknown = _predict.executed_transient_peaks(partitions, self._device, self._step)
        except Exception as error:  # a prediction must never stop training
            self.stats["notes"].append(f"prediction from the traced graph only: the executed graph could not be "
                                       f"replayed ({error})")
            return
        persistent = self.stats["persistent_bytes"]
        self.stats.update({"device_peak_bytes": persistent + with_lms,
                           "device_peak_bytes_without_lms": persistent + without_lms,
                           "prediction_source": "executed partition graphs", "unknown_size_nodes": unknown})

    def summary(self) -> str:
        """One line: what LMS swapped and the predicted device peaks."""
        stats = self.stats
        if not stats["active"]:
            return f"LMS: inactive ({stats['reason']})"
        if stats.get("backend") == "torch":
            return self._torch_summary()
        line = (f"LMS: swapping {stats['swapped_tensors']} of {stats['candidates']} tensors "
                f"({stats['swapped_bytes_per_step'] / MIB:.1f} MiB per step, lb={self.lb}) to {self.host_device}; "
                f"predicted {self._device} peak {stats['device_peak_bytes'] / MIB:.1f} MiB with LMS, "
                f"{stats['device_peak_bytes_without_lms'] / MIB:.1f} MiB without ({stats['prediction_source']})")
        return "\n".join([line] + [f"LMS: {note}" for note in stats["notes"]])

    def _torch_summary(self) -> str:
        stats = self.stats
        peak = stats["device_peak_bytes"]
        line = (f"LMS (PyTorch): offloading {stats['swapped_tensors']} of {stats['candidates']} saved activations "
                f"({stats['swapped_bytes_per_step'] / MIB:.1f} MiB per step, lb={self.lb} layers) to "
                f"{'pinned ' if stats.get('pinned') else ''}host memory; "
                + (f"{self._device} peak {peak / MIB:.1f} MiB ({stats['prediction_source']})" if peak is not None
                   else "no device peak (not a CUDA device)"))
        return "\n".join([line] + [f"LMS: {note}" for note in stats["notes"]])

    # -- restoring the model -----------------------------------------------------------------
    def _restore(self) -> None:
        """Ends this callback's fit: the model's own train function is back, the PyTorch pool released."""
        function, self._function = self._function, None
        if function is not None:
            function.remove_from(self.model)
        if self._torch is not None:
            self._torch.close()
            self._torch = None


class _LmsTrainFunction:
    """The LMS train function, in ``model.train_function`` from LMS's batch begin to that batch's step.

    ``LMS.on_train_batch_begin`` puts it there and arms it for the ``fit``
    that called the callback; its call puts the model's own train function
    back first, then runs the LMS step inside the callback's step scope.
    Where a fit ends between the two (an exception in a later callback's
    batch begin), it stays behind inert: a call from any other fit puts the
    model's own function back and trains plainly, and the next LMS ``fit``
    removes it before it starts.
    """

    def __init__(self, function, plain, callback: LMS):
        self._function = function
        self.plain = plain
        self._callback = callback
        self._armed_by: tuple = ()  # the frames of the fit that armed it, until its call

    def arm(self) -> None:
        self._armed_by = compat.calling_frames()
        self._callback.model.train_function = self

    @staticmethod
    def remove_from(model) -> None:
        current = getattr(model, "train_function", None)
        if isinstance(current, _LmsTrainFunction):
            current._armed_by = ()
            model.train_function = current.plain

    def __call__(self, *args, **kwargs):
        callback = self._callback
        callback.model.train_function = self.plain
        armed, self._armed_by = compat.called_from(self._armed_by), ()
        if not armed:
            return self.plain(*args, **kwargs)
        with callback._step_scope():
            return self._function(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._function, name)
