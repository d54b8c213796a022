"""``%gpumem`` / ``%%gpumem``: host and GPU memory of a statement or a cell."""

from __future__ import annotations

import math

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, needs_local_scope
from IPython.core.magic_arguments import magic_arguments, parse_argstring

from ..memory.profile import DEFAULT_INTERVAL_S, MemoryProfiler, UnknownDeviceError, profiling
from .argv import argument, asks_for_help, flags_of, print_help, split_options
from .cell import CompiledCell
from .display import cell_value_not_shown, output_can_be_silenced


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
    @argument("--explain", action="store_true",
              help="train nothing: each Keras fit of the cell prints what fills its step's peak and the largest "
                   "batch each way of training fits (lms_magic.explain_fit), and returns that account")
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

        A Keras fit in the cell that runs out of device memory prints, above
        the error, what filled the step's peak and what would fit. With
        --explain, each fit trains nothing and prints that account instead.
        """
        __tracebackhide__ = True  # noqa: F841 (IPython hides this frame from tracebacks)
        if cell is None:
            option_text, statement = split_options(line, flags_of(self.gpumem))
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
        from ..lms.explain.account import FitsExplained, OutOfMemoryExplained

        report = profiler.report
        # a fit that runs out of memory is explained once the measuring is over, above the error
        fits = FitsExplained() if args.explain else OutOfMemoryExplained()
        try:
            with profiling(profiler), fits:
                value = compiled.run(local_ns)
        finally:
            if not args.quiet:
                print(report)
                if args.plot:
                    self._show_plot(report)
            if not args.explain:
                fits.say_why()
            if report.status != "ok":
                self.shell.displayhook.update_user_ns(report)  # `_` gives the partial report
        if args.return_result:
            if value is not None:
                from IPython.display import display

                display(value)
            if is_cell and not args.quiet:  # printed above: `_` holds it, not shown again
                cell_value_not_shown(self.shell, report)
                return None
            return report
        return value

    @staticmethod
    def _show_plot(report) -> None:
        try:
            from ..ui.plots import display_figure, memory_timeline_figure

            display_figure(memory_timeline_figure(report))
        except ImportError as error:
            print(error)
