"""``%%lms_fit``: train a cell's fit calls with Large Model Support, and compare fairly with plain training."""

from __future__ import annotations

import math

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import magic_arguments, parse_argstring

from ..lms.options import LmsOptions
from ..memory.profile import DEFAULT_INTERVAL_S
from .argv import argument, asks_for_help, lms_option_arguments, print_help
from .cell import CompiledCell
from .display import cell_value_not_shown


@magics_class
class LmsFitMagics(Magics):
    """``%%lms_fit``: train with Large Model Support, and compare fairly with plain training."""

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell, **kwargs)
        self._defaults = LmsOptions()  # the options a flag not given keeps; %lms_tune's Apply changes them

    @property
    def defaults(self) -> dict:
        """The options %lms_tune's Apply set for the following cells (``n_tensors`` None: LMS plans)."""
        return {name: getattr(self._defaults, name) for name in _APPLIED}

    def apply_defaults(self, n_tensors: int, lb: int, lean_ops: bool = False, order_backward: bool = False,
                       recompute=False) -> None:
        """Makes ``n_tensors``, ``lb``, ``lean_ops``, ``order_backward`` and ``recompute`` the defaults of the
        following ``%%lms_fit`` cells (%%lms_tune's Apply); a flag given in a cell wins."""
        self._defaults = LmsOptions(n_tensors=n_tensors, lb=lb, lean_ops=lean_ops, order_backward=order_backward,
                                    recompute=recompute)

    @magic_arguments()
    @lms_option_arguments
    @argument("--compare", action="store_true",
              help="also train without LMS from the same weights, optimizer state, seed and batches")
    @argument("--steps", type=int, default=None, help="stop each variant after this many steps")
    @argument("--batch-size", dest="batch_size", choices=("max",), default=None,
              help="max: train at the largest batch that fits the device (confirmed by steps where it can be), with "
                   "LMS where it needs LMS and runs at --speed of plain speed or better")
    @argument("--speed", type=float, default=0.9, help="with --batch-size max: the share of plain speed to keep")
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
        compiled = CompiledCell(self.shell, cell)

        from ..quiet import import_keras_quietly

        import_keras_quietly()
        from ..fit.compare import VariantRunner
        from ..fit.results import LmsFitResult
        from ..fit.intercept import FitInterceptor

        result = LmsFitResult()
        announce = (lambda text: None) if args.quiet else print
        def run(fit, model, fit_args, fit_kwargs):
            if args.batch_size == "max":
                fit_kwargs = self._at_largest(runner, fit, model, fit_args, fit_kwargs, args.speed, announce)
            return self._record(result, runner.run(model, fit_args, fit_kwargs, fit))

        interceptor = FitInterceptor(run)
        from ..lms.explain.account import explain_out_of_memory

        with interceptor:
            # a variant that runs out of memory is marked so, and explained: what filled the step, what would fit
            runner = VariantRunner(interceptor.original_fit, options, args.compare, args.steps, args.interval,
                                   announce, result.notes, explain_out_of_memory)
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
            from ..ui.dashboard import show

            show(result, self.shell)
        if not args.return_result:
            return value
        if args.quiet:
            return result
        cell_value_not_shown(self.shell, result)  # the dashboard showed it
        return None

    @staticmethod
    def _at_largest(runner, fit, model, fit_args, fit_kwargs: dict, speed: float, announce) -> dict:
        """``fit_kwargs`` at the largest batch (``largest_batch``), and the runner's LMS options for it."""
        from ..lms.samples import fit_call, fit_length, sample_count
        from ..sizing.largest import NoCapacityError, largest_batch

        data, batch_size, rest = fit_call(fit, fit_args, fit_kwargs)
        if batch_size is not None:
            raise ValueError("%%lms_fit --batch-size max chooses the batch size: leave batch_size out of the fit call")
        if len(data) == 1 and not hasattr(data[0], "shape") and not isinstance(data[0], (list, tuple, dict)):
            # a dataset, generator or PyDataset: its own batches (a list or dict is arrays, or a list of text)
            raise ValueError("%%lms_fit --batch-size max needs the data as arrays, model.fit(x, y, ...): a dataset "
                             "or generator that is already batched fixes the batch size; pass its arrays, or "
                             "leave --batch-size max out")
        options = runner.lms_options
        try:  # the cell's --budget: what every way of training may fill, the device's capacity or not
            epochs, steps_per_epoch = fit_length(rest)  # a way with LMS is the step a fit that long keeps
            chosen = largest_batch(model, data, speed=speed, budget=options.budget_bytes, min_bytes=options.min_bytes,
                                   device=options.device, host_device=options.host_device, epochs=epochs,
                                   steps_per_epoch=steps_per_epoch)
        except NoCapacityError:
            raise ValueError("%%lms_fit --batch-size max: no device capacity known (no GPU, no "
                             "simulate_accelerator(memory=...)): put --budget 12GiB (what the batch may fill) on the "
                             "cell's first line") from None
        announce(f"lms_magic: --batch-size max: {chosen}")
        if chosen.options is None:
            runner.lms_options = runner.lms_options.replace(n_tensors=0)
        elif "budget" in chosen.options:
            runner.lms_options = runner.lms_options.replace(budget_bytes=chosen.options["budget"])
        samples = sample_count(data[0])
        if samples is not None and chosen.batch_size > samples:
            announce(f"lms_magic: --batch-size max: the data holds {samples} samples: batch {samples}, one step an epoch")
            return {**fit_kwargs, "batch_size": samples}
        return {**fit_kwargs, "batch_size": chosen.batch_size}

    @staticmethod
    def _record(result, outcome):
        history, variants = outcome
        result.calls.append(variants)
        return history

    def _lms_options(self, args) -> LmsOptions:
        """The cell's LMS options, from its flags over the defaults, checked once (a bad one is a UsageError naming
        the flag as typed)."""
        from ..lms.framework import check_devices
        from ..lms.options import OptionError, options_from_flags, whole_number

        if not (math.isfinite(args.interval) and args.interval > 0):
            raise UsageError(f"-i/--interval must be a positive, finite number of seconds, got {args.interval}")
        try:
            if args.steps is not None:
                whole_number("steps", args.steps, 1)
            if not 0 < args.speed <= 1:
                raise UsageError(f"--speed must be a share of plain speed, above 0 and at most 1 (0.9), got {args.speed}")
            options = options_from_flags(vars(args), self._defaults)
            check_devices(options.device, options.host_device)
        except OptionError as error:
            raise UsageError(error.for_magic()) from None
        return options.replace(verbose=0 if args.quiet else 1)


_APPLIED = ("n_tensors", "lb", "lean_ops", "order_backward", "recompute")
