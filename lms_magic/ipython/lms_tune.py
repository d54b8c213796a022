"""``%lms_tune``: the LMS tuning widget for a model and its data."""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import magic_arguments

from .argv import argument, asks_for_help, flags_of, lms_option_arguments, print_help, split_at_flags
from ..units import format_size

_USAGE = ("usage: %lms_tune MODEL --data (x, y) [--batch-size 32] [--budget 6GiB] [--steps 5] [--max-trials 12] "
          "[--min-bytes N] [--device /GPU:0] [--host-device /CPU:0] [--autotune]")


@magics_class
class LmsTuneMagics(Magics):
    """``%lms_tune``: sliders for the LMS knobs with instant predictions, Measure, Autotune, Apply.

    Args:
        shell: the InteractiveShell.
        on_apply: called with ``n_tensors``, ``lb``, ``lean_ops`` and ``order_backward`` when Apply is pressed
            (``%%lms_fit``'s ``apply_defaults``, as :func:`lms_magic.ipython.register` wires it).
    """

    def __init__(self, shell=None, on_apply=None, **kwargs):
        super().__init__(shell, **kwargs)
        self.on_apply = on_apply

    @magic_arguments()
    @argument("model", nargs="?", help="the compiled Keras model: a name or an expression")
    @argument("--data", help="the training data: (x, y) arrays or a tf.data.Dataset (an expression)")
    @argument("--batch-size", type=int, default=32, help="the batch size to start from (default 32)")
    @lms_option_arguments(only=("budget_bytes", "min_bytes", "device", "host_device"))
    @argument("--steps", type=int, default=5, help="timed steps per measured trial (default 5)")
    @argument("--max-trials", type=int, default=12, help="measured trials of the autotuner (default 12)")
    @argument("--autotune", action="store_true", help="search now and return the result (no widget)")
    @line_magic
    def lms_tune(self, line):
        """Tune LMS for a compiled Keras model (TensorFlow or JAX backend).

        Sliders for n_tensors, lb, batch size and the memory budget update the
        predicted device peak, the bytes swapped per step and the step-time
        lower bound at once, without training. Measure runs a few steps with
        the current setting from a saved start (the model is left as it was);
        Autotune searches for the fastest measured setting within the budget;
        Apply makes the setting the default of the next %%lms_fit and prints
        the LMS(...) call. With --autotune, the search runs at once and its
        result is returned.

        Example::

            %lms_tune model --batch-size 64 --data (x_train, y_train) --budget 6GiB
        """
        if asks_for_help(line):
            return print_help(self.lms_tune)
        parser = self.lms_tune.parser
        flags = [flag for flag in flags_of(self.lms_tune) if flag.startswith("--")]
        args = parser.parse_args(split_at_flags(line, flags, _USAGE))
        if not args.model:
            raise UsageError("no model: " + _USAGE)
        namespace = self.shell.user_ns
        model = _evaluate(args.model, namespace, "the model")
        data = _evaluate(args.data, namespace, "--data") if args.data is not None else None
        import keras

        if not isinstance(model, keras.Model):
            raise UsageError(f"%lms_tune: {args.model!r} is {type(model).__name__!r}, not a Keras model; " + _USAGE)
        if args.max_trials < 1:
            raise UsageError(f"--max-trials must be at least 1, got {args.max_trials}")
        from ..lms.options import OptionError, options_from_flags
        from ..tuning.session import TuningSession

        try:
            options = options_from_flags(vars(args))
            session = TuningSession(model, data, args.batch_size, options.budget_bytes, args.steps,
                                    options.min_bytes, device=options.device, host_device=options.host_device)
            if args.autotune:
                found = session.autotune(args.max_trials)
                print(found)
                return found
        except OptionError as error:
            raise UsageError(f"%lms_tune: {error.for_magic()}") from None
        except ValueError as error:  # BudgetError is one
            raise UsageError(f"%lms_tune: {error}") from None
        from ..ui.dashboard import in_widget_frontend

        if not in_widget_frontend(self.shell):
            planned = session.predictor.planned(1, session.batch_size)
            print(f"%lms_tune: the sliders need a notebook. LMS's default plan swaps {planned.n_tensors} of "
                  f"{planned.candidates} candidates: predicted peak {format_size(planned.peak_bytes)} (without LMS "
                  f"{format_size(planned.peak_bytes_without_lms)}). Add --autotune to search here.")
            from ..lms.core.peak import format_peak

            for label, count in (("without LMS", 0), ("with the plan", planned.n_tensors)):
                print(f"  {label}: " + format_peak(session.predictor.explain(count, 1, session.batch_size)))
            return None
        from IPython.display import display

        from ..ui.tuner import Tuner

        display(Tuner(session, args.max_trials, on_apply=self.on_apply))
        return None


def _evaluate(expression: str, namespace: dict, what: str):
    """``expression`` evaluated in the user's namespace; a UsageError that names ``what`` if it fails."""
    try:
        return eval(expression, namespace)
    except Exception as error:
        raise UsageError(f"%lms_tune could not evaluate {what} ({expression!r}): {error.__class__.__name__}: "
                         f"{error}") from None
