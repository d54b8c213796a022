"""The IPython layer: parse magic options, call the library, show the results."""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, needs_local_scope, output_can_be_silenced
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .cell import CompiledCell
from .memory.profile import DEFAULT_INTERVAL_S, MemoryProfiler, UnknownDeviceError, profiling
from .options import split_options


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


MAGIC_NAMES = ("gpumem",)


def register(shell) -> None:
    """Registers the magics with ``shell`` (called by ``%load_ext lms_magic``)."""
    shell.register_magics(GpuMemMagics)


def unregister(shell) -> None:
    """Removes every magic that :func:`register` added (``%unload_ext lms_magic``)."""
    manager = shell.magics_manager
    for kind in ("line", "cell"):
        for name in MAGIC_NAMES:
            manager.magics[kind].pop(name, None)
    manager.registry.pop(GpuMemMagics.__name__, None)


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
            if not statement:
                raise UsageError("%gpumem needs a statement, e.g. %gpumem x = np.ones(10**8); "
                                 "use %%gpumem for a whole cell")
        else:
            option_text, statement = line, cell
        args = parse_argstring(self.gpumem, option_text)
        if cell is not None and args.statement:
            raise UsageError("%%gpumem takes options on its first line and code in the cell below; "
                             f"unexpected {' '.join(args.statement)!r}")
        if not args.interval > 0:
            raise UsageError(f"-i/--interval must be a positive number of seconds, such as -i 0.01; got {args.interval}")
        devices = _parse_devices(args.devices)
        compiled = CompiledCell(self.shell, statement)
        try:
            profiler = MemoryProfiler(interval_s=args.interval, devices=devices).start()
        except UnknownDeviceError as error:
            raise UsageError(str(error)) from None
        return self._run(compiled, profiler, args, local_ns)

    def _run(self, compiled: CompiledCell, profiler: MemoryProfiler, args, local_ns):
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
            return report
        return value

    @staticmethod
    def _show_plot(report) -> None:
        try:
            from .ui.plots import display_figure

            display_figure(report.figure())
        except ImportError as error:
            print(error)
