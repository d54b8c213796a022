"""The ``LMS`` Keras callback: Large Model Support for Keras 3, over one backend per framework.

The callback owns the options, the checks and the train function's place in
the model; a backend does the work of one fit: ``TensorFlowBackend``
(tensorflow_backend.py: graph rewrite, executed-graph replay) or
``TorchBackend`` (torch_offload.py: saved-tensor hooks). A backend has
``jit_note``, ``train_step(original)``, ``step_scope()``, ``first_step_done()``,
``summary_line()``, ``close()`` and ``step``; JAX would be a third
(jax_offload.py says why it is not yet).
"""

from __future__ import annotations

import contextlib

import keras

from .. import compat
from ..units import MIB
from .plan import DEFAULT_MIN_BYTES, Selection, parse_bytes
from .stats import LmsStats

_said_no_gpu = False


def _tensorflow_devices() -> list[str]:
    import tensorflow as tf

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
            import tensorflow as tf

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
    only copied: losses and weights are those of training without LMS
    (bit-identical on the models the tests train but two, which differ by
    float rounding; the README says which).

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
        device: the accelerator, e.g. "/GPU:0". Defaults to the first GPU; with
            no GPU, LMS does nothing and says so (after
            ``lms_magic.simulate_accelerator()``, "/CPU:0").
        host_device: where swapped tensors wait. Defaults to "/CPU:0" ("/CPU:1"
            after ``lms_magic.simulate_accelerator()``).
        verbose: 1 prints a line when training starts, 0 nothing. Defaults to 1.
        batch_size_hint: the batch size, for data whose batches TensorFlow
            traces with an unknown size (Python generators); an int or a
            function returning one. Defaults to None.

    After training, ``stats`` (an ``LmsStats``) holds what was done, and the device peak predicted
    (TensorFlow) or measured (PyTorch with CUDA).

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

    def __init__(self, n_tensors: int | None = None, lb: int = 1, budget=None, min_bytes: int = DEFAULT_MIN_BYTES,
                 include_layers=(), exclude_layers=(), include_types=(), exclude_types=(),
                 device: str | None = None, host_device: str | None = None, verbose: int = 1, batch_size_hint=None):
        super().__init__()
        if not isinstance(lb, int) or lb < 1:
            raise ValueError(f"lb must be a whole number >= 1, got {lb!r}")
        for role, spec in (("device", device), ("host_device", host_device)):
            if not (isinstance(spec, str) or spec is None):
                raise ValueError(f"{role} takes a device name such as '/GPU:0' or '/CPU:0', got {spec!r}")
        self.selection = Selection(n_tensors, int(min_bytes), include_layers, exclude_layers,
                                   include_types, exclude_types)
        self.n_tensors, self.lb, self.min_bytes = n_tensors, lb, int(min_bytes)
        self.budget_bytes = None if budget is None else parse_bytes(budget)
        self.device, self.host_device, self.verbose = device, host_device, verbose
        self.batch_size_hint = batch_size_hint
        self.stats = LmsStats(reason="not trained yet")
        self._backend = None  # TensorFlowBackend or TorchBackend, while a fit with this callback runs
        self._function: _LmsTrainFunction | None = None  # while a fit with this callback runs
        self._summary_line = ""
        self._step = None  # the rewritten step (TensorFlow), for inspection

    # -- state -----------------------------------------------------------------------------
    def _resolve_device(self) -> str | None:
        global _said_no_gpu
        from ..devices import default_device

        if self.device is None:
            gpus = [name for name in _tensorflow_devices() if name.startswith("/GPU")]
            if not gpus and default_device() is not None:  # lms_magic.simulate_accelerator()
                return default_device()
            if not gpus:
                if not _said_no_gpu and self.verbose:
                    print("LMS: no GPU found, so nothing is swapped (pass device=... to choose one)")
                _said_no_gpu = True
                return None
            return gpus[0]
        check_devices(self.device, self._host_device())
        return self.device

    def _host_device(self) -> str:
        from ..devices import default_host

        return self.host_device or default_host()

    # -- Keras hooks -------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._restore()
        _LmsTrainFunction.remove_from(self.model)  # left by a fit that ended between a batch begin and its step
        backend = keras.backend.backend()
        if backend not in ("tensorflow", "torch"):
            from .jax_offload import unsupported_message

            raise RuntimeError(unsupported_message(backend))
        compat.check_versions(backend)
        self.stats = LmsStats(backend=backend, budget_bytes=self.budget_bytes)
        self.stats.notes += self.selection.unknown_names(compat.layer_types(self.model))
        if self.selection.n_tensors == 0 and self.budget_bytes is None:
            self.stats.reason = "n_tensors=0: LMS is off"
            return
        if backend == "torch":
            from .torch_offload import TorchBackend

            self._backend = TorchBackend(self.model, self.selection, self.lb, self.budget_bytes, self.device, self.stats)
        else:
            device = self._resolve_device()
            if device is None:
                self.stats.reason = "no GPU"
                return
            from .tensorflow_backend import TensorFlowBackend

            self._backend = TensorFlowBackend(self.model, self.selection, self.lb, self.budget_bytes, device,
                                              self._host_device(), self.batch_size_hint, self.stats)
        self._install(self._backend.train_step(self.model.train_step), self._backend.jit_note)

    def on_train_batch_begin(self, batch, logs=None):
        if self._function is not None:
            self._function.arm()

    def on_train_batch_end(self, batch, logs=None):
        if self._function is not None and self._summary_due:
            self._summary_due = False
            self._backend.first_step_done()
            self._step = self._backend.step
            if self._planned_swaps_raise_the_peak():
                self._drop_swaps()
            if self.stats.active:
                self._summary_line = self._backend.summary_line()
            if self.verbose:
                print(self.summary())

    def _planned_swaps_raise_the_peak(self) -> bool:
        """Whether the default plan, checked on the graphs TensorFlow executed, predicts a higher peak than no LMS.

        The plan is chosen on the traced graph before the first step; Grappler and placement change the graph
        that runs, and its replay (after the first step) is what ``stats`` report.
        """
        stats = self.stats
        return (stats.plan_rule == "lowest predicted peak" and stats.swapped_tensors > 0
                and stats.prediction_source == "executed partition graphs"
                and stats.device_peak_bytes > stats.device_peak_bytes_without_lms)

    def _drop_swaps(self) -> None:
        """The rest of the fit trains with the model's own train function: nothing swapped after the first step."""
        stats = self.stats
        stats.notes.append(f"the graphs TensorFlow executed predict {stats.device_peak_bytes / MIB:.1f} MiB with the "
                           f"planned {stats.swapped_tensors} swaps, above {stats.device_peak_bytes_without_lms / MIB:.1f}"
                           " MiB without: no tensor is swapped after the first step")
        _LmsTrainFunction.remove_from(self.model)
        self._function = None
        stats.update(swapped_tensors=0, swapped_bytes_per_step=0, plan=[],
                     device_peak_bytes=stats.device_peak_bytes_without_lms, peak=stats.peak_without_lms)

    def on_train_end(self, logs=None):
        self._restore()

    def _install(self, train_step, jit_note: str) -> None:
        """Makes the LMS train function; it takes the model's place one step at a time (see _LmsTrainFunction).

        Nothing of the model or of TensorFlow is changed between steps: the
        train step, XLA and graph collection are set for the duration of
        each LMS step only (Grappler's options are never touched), so whatever ends the fit
        (an exception in a callback, the data or the step, an interrupt)
        leaves them as they were.
        """
        model = self.model
        if compat.jit_compile_requested(model):
            self.stats.notes.append(jit_note)
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
        """What one LMS step needs set (the rewritten train step, the backend's settings), and nothing after it."""
        with compat.train_step_replaced(self.model, self._lms_step), self._backend.step_scope():
            yield

    def summary(self) -> str:
        """One line: what LMS swapped and the device peaks (predicted on TensorFlow, measured on PyTorch)."""
        stats = self.stats
        if not stats.active:
            return f"LMS: inactive ({stats.reason})"
        return "\n".join([self._summary_line] + [f"LMS: {note}" for note in stats.notes])

    # -- restoring the model -----------------------------------------------------------------
    def _restore(self) -> None:
        """Ends this callback's fit: the model's own train function is back, the backend's resources released."""
        function, self._function = self._function, None
        if function is not None:
            function.remove_from(self.model)
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()


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
