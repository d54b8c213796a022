"""The IPython layer: parse magic options, call the library, show the results."""

from __future__ import annotations

import math

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, needs_local_scope
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .cell import CompiledCell
from .compat import output_can_be_silenced
from .lms.core.plan import DEFAULT_MIN_BYTES
from .memory.profile import DEFAULT_INTERVAL_S, MemoryProfiler, UnknownDeviceError, profiling
from .options import asks_for_help, print_help, split_options
from .tune_magic import LmsTuneMagics


def _parse_devices(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        devices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        devices = []
    if not devices or any(d < 0 for d in devices):
        raise UsageError(f"-d/--devices takes GPU indices separated by commas, such as -d 0,1; got {text!r}")
    return devices


MAGIC_NAMES = ("gpumem", "lms_fit", "lms_tune")


def register(shell) -> None:
    """Registers the magics with ``shell`` (called by ``%load_ext lms_magic``).

    ``%lms_tune``'s Apply sets the defaults of the ``%%lms_fit`` registered
    with it (the fit magics object owns them).
    """
    shell.register_magics(GpuMemMagics)
    fit_magics = LmsFitMagics(shell)
    shell.register_magics(fit_magics)
    shell.register_magics(LmsTuneMagics(shell, on_apply=fit_magics.apply_defaults))


def unregister(shell) -> None:
    """Removes every magic that :func:`register` added (``%unload_ext lms_magic``)."""
    manager = shell.magics_manager
    for kind in ("line", "cell"):
        for name in MAGIC_NAMES:
            manager.magics[kind].pop(name, None)
    for magics in (GpuMemMagics, LmsFitMagics, LmsTuneMagics):
        manager.registry.pop(magics.__name__, None)


def _cell_value_not_shown(shell, result) -> None:
    """Makes ``result`` the cell's value (``_``, ``Out[n]``) without showing its table a second time."""
    shell.displayhook.update_user_ns(result)
    shell.displayhook.fill_exec_result(result)


@magics_class
class GpuMemMagics(Magics):
    """``%gpumem`` / ``%%gpumem``: host and GPU memory of a statement or cell."""

    @magic_arguments()
    @argument("-i", "--interval", type=float, default=DEFAULT_INTERVAL_S,
              help="seconds between memory samples for the timeline (default 0.01)")
    @argument("-d", "--devices", default=None,
              help="GPU indices to measure, separated by commas (default: every visible GPU)")
    @argument("-o", dest="return_result", action="store_true",
              help="return the MemoryReport object (as %%timeit -o does)")
    @argument("-q", dest="quiet", action="store_true", help="print nothing")
    @argument("--plot", action="store_true", help="show the memory timeline as a plotly figure")
    @argument("statement", nargs="*", help="the statement to profile (line form)")
    @needs_local_scope
    @line_cell_magic
    @output_can_be_silenced
    def gpumem(self, line="", cell=None, local_ns=None):
        """Measure the host and GPU memory of a statement or a cell.

        Prints the host peak memory and increment in MiB (exact on Linux, from
        the kernel's high-water mark; sampled elsewhere), and for every visible
        GPU the device-used peak and increment (NVML, sampled) beside the exact
        allocator peak of TensorFlow, PyTorch or JAX where already in use.
        The cell runs as under %%time: in your namespace, with IPython's
        syntax, and a trailing expression is the cell's value.

        Examples::

            %%gpumem
            x = np.ones((8192, 4096))

            %gpumem -q -o y = model.predict(batch)
        """
        __tracebackhide__ = True  # noqa: F841 (IPython hides this frame from tracebacks)
        if cell is None:
            option_text, statement = split_options(line, self.gpumem.parser)
            if asks_for_help(option_text):
                return print_help(self.gpumem)
            if not statement:
                raise UsageError("%gpumem needs a statement, e.g. %gpumem x = np.ones(10**8); "
                                 "use %%gpumem for a whole cell")
        else:
            option_text, statement = line, cell
            if asks_for_help(option_text):
                return print_help(self.gpumem)
        args = parse_argstring(self.gpumem, option_text)
        if cell is not None and args.statement:
            raise UsageError("%%gpumem takes options on its first line and code in the cell below; "
                             f"unexpected {' '.join(args.statement)!r}")
        if not (math.isfinite(args.interval) and args.interval > 0):
            raise UsageError(f"-i/--interval must be a positive, finite number of seconds, such as -i 0.01; "
                             f"got {args.interval}")
        devices = _parse_devices(args.devices)
        compiled = CompiledCell(self.shell, statement)
        try:
            profiler = MemoryProfiler(interval_s=args.interval, devices=devices).start()
        except UnknownDeviceError as error:
            raise UsageError(str(error)) from None
        return self._run(compiled, profiler, args, local_ns, is_cell=cell is not None)

    def _run(self, compiled: CompiledCell, profiler: MemoryProfiler, args, local_ns, is_cell: bool):
        __tracebackhide__ = True  # noqa: F841
        report = profiler.report
        try:
            with profiling(profiler):
                value = compiled.run(local_ns)
        finally:
            if not args.quiet:
                print(report)
                if args.plot:
                    self._show_plot(report)
            if report.status != "ok":
                self.shell.displayhook.update_user_ns(report)  # `_` gives the partial report
        if args.return_result:
            if value is not None:
                from IPython.display import display

                display(value)
            if is_cell and not args.quiet:  # printed above: `_` holds it, not shown again
                _cell_value_not_shown(self.shell, report)
                return None
            return report
        return value

    @staticmethod
    def _show_plot(report) -> None:
        try:
            from .ui.plots import display_figure, memory_timeline_figure

            display_figure(memory_timeline_figure(report))
        except ImportError as error:
            print(error)


@magics_class
class LmsFitMagics(Magics):
    """``%%lms_fit``: train with Large Model Support, and compare fairly with plain training."""

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell, **kwargs)
        # None: LMS plans; %lms_tune's Apply changes them
        self.defaults = {"n_tensors": None, "lb": 1, "lean_ops": False, "order_backward": False, "recompute": False}

    def apply_defaults(self, n_tensors: int, lb: int, lean_ops: bool = False, order_backward: bool = False,
                       recompute=False) -> None:
        """Makes ``n_tensors``, ``lb``, ``lean_ops``, ``order_backward`` and ``recompute`` the defaults of the
        following ``%%lms_fit`` cells (%%lms_tune's Apply); ``--recompute`` in a cell wins."""
        self.defaults = {"n_tensors": n_tensors, "lb": lb, "lean_ops": lean_ops, "order_backward": order_backward,
                         "recompute": recompute}

    @magic_arguments()
    @argument("--n-tensors", type=int, default=None,
              help="tensors to swap: by default LMS's plan (nothing where the step fits the device, else the "
                   "fewest bytes that fit; the lowest predicted peak where the capacity is unknown), or what "
                   "%%lms_tune's Apply chose; -1 all, 0 none, N the first N")
    @argument("--lb", type=int, default=None,
              help="swap in this many backward ops ahead of the consumer (default 1, or %%lms_tune's Apply)")
    @argument("--budget", default=None, help="device memory to stay under, e.g. 6GiB (overrides --n-tensors)")
    @argument("--min-bytes", type=int, default=DEFAULT_MIN_BYTES, help="leave smaller tensors alone (default 65536)")
    @argument("--device", default=None, help="the accelerator, e.g. /GPU:0 (default: the first GPU)")
    @argument("--host-device", default=None,
              help="where swapped tensors wait (default /CPU:0; /CPU:1 after lms_magic.simulate_accelerator())")
    @argument("--recompute", choices=("off", "on", "only"), default="off",
              help="off (swap what the plan moves), on (recompute what can be from tensors on the device, swap the "
                   "rest), only (recompute, never swap: nothing crosses the host link)")
    @argument("--order-backward", action="store_true",
              help="run the backward pass one layer's gradient at a time where that lowers the predicted peak "
                   "(bit-identical; off by default: a predicted gain, not yet a measured one); TensorFlow, swaps")
    @argument("--lean-ops", action="store_true",
              help="compute each BatchNormalization's gradient in one piece (on PyTorch: its fused kernel): a lower "
                   "backward-pass peak, results that differ at float rounding")
    @argument("--compare", action="store_true",
              help="also train without LMS from the same weights, optimizer state, seed and batches")
    @argument("--steps", type=int, default=None, help="stop each variant after this many steps")
    @argument("-i", "--interval", type=float, default=DEFAULT_INTERVAL_S, help="memory sampling interval (s)")
    @argument("-o", dest="return_result", action="store_true", help="return the LmsFitResult")
    @argument("-q", dest="quiet", action="store_true", help="print nothing")
    @line_cell_magic
    def lms_fit(self, line, cell=None):
        """Train every Keras fit (or legacy fit_generator) call of the cell with LMS.

        With --compare, each call also runs without LMS from the same starting
        state, and a dashboard compares peak memory, increment, speed, loss and
        accuracy. The model ends as the LMS run left it, and the cell's own
        variables (history = ...) get the LMS run's values.

        Example::

            %%lms_fit --compare --n-tensors -1 --lb 1
            history = model.fit_generator(batches(x, y, 8), steps_per_epoch=25000, epochs=2)
        """
        __tracebackhide__ = True  # noqa: F841
        if asks_for_help(line):
            return print_help(self.lms_fit)
        if cell is None:
            raise UsageError("%%lms_fit works on a cell: put `%%lms_fit --compare` (or other options) on the first "
                             "line of the cell that calls model.fit(...); %%lms_fit --help lists the options")
        args = parse_argstring(self.lms_fit, line)
        options = self._lms_options(args)
        options["verbose"] = 0 if args.quiet else 1
        compiled = CompiledCell(self.shell, cell)

        from .quiet import import_keras_quietly

        import_keras_quietly()
        from .compare import VariantRunner
        from .fit_results import LmsFitResult
        from .intercept import FitInterceptor

        result = LmsFitResult()
        announce = (lambda text: None) if args.quiet else print
        interceptor = FitInterceptor(lambda model, a, kw: self._record(result, runner.run(model, a, kw)))
        with interceptor:
            runner = VariantRunner(interceptor.original_fit, options, args.compare, args.steps, args.interval,
                                   announce, result.notes)
            try:
                value = compiled.run()
            except BaseException:
                interceptor.restore_models()
                if result.calls and not args.quiet:
                    print(result)
                raise
        if not result.calls:
            result.notes.append("the cell called no fit or fit_generator, so nothing was trained with LMS")
        if not args.quiet:
            from .ui.dashboard import show

            show(result, self.shell)
        if not args.return_result:
            return value
        if args.quiet:
            return result
        _cell_value_not_shown(self.shell, result)  # the dashboard showed it
        return None

    @staticmethod
    def _record(result, outcome):
        history, variants = outcome
        result.calls.append(variants)
        return history

    def _lms_options(self, args) -> dict:
        """The cell's LMS options, each checked (a bad one is a UsageError naming the flag as typed)."""
        from .devices import check_devices
        from .lms.options import LmsOptions, OptionError, whole_number

        n_tensors = self.defaults["n_tensors"] if args.n_tensors is None else args.n_tensors
        lb = self.defaults["lb"] if args.lb is None else args.lb
        if not (math.isfinite(args.interval) and args.interval > 0):
            raise UsageError(f"-i/--interval must be a positive, finite number of seconds, got {args.interval}")
        try:
            if args.steps is not None:
                whole_number("steps", args.steps, 1)
            options = LmsOptions(n_tensors=n_tensors, lb=lb, budget_bytes=args.budget, min_bytes=args.min_bytes,
                                 device=args.device, host_device=args.host_device,
                                 recompute={"off": self.defaults["recompute"], "on": True}.get(args.recompute,
                                                                                               args.recompute),
                                 lean_ops=args.lean_ops or self.defaults["lean_ops"],
                                 order_backward=args.order_backward or self.defaults["order_backward"])
            check_devices(options.device, options.host_device)
        except OptionError as error:
            raise UsageError(error.for_magic()) from None
        return {"n_tensors": options.n_tensors, "lb": options.lb, "budget": options.budget_bytes,
                "min_bytes": options.min_bytes, "device": options.device, "host_device": options.host_device,
                "recompute": options.recompute, "lean_ops": options.lean_ops,
                "order_backward": options.order_backward, "verbose": 1}

