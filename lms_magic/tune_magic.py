"""``%lms_tune``: the LMS tuning widget for a model and its data."""

from __future__ import annotations

import re

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from .lms.core.plan import DEFAULT_MIN_BYTES
from .options import asks_for_help, print_help
from .units import format_size

_USAGE = ("usage: %lms_tune MODEL --data (x, y) [--batch-size 32] [--budget 6GiB] [--steps 5] [--max-trials 12] "
          "[--min-bytes 65536] [--device /GPU:0] [--host-device /CPU:0] [--autotune]")


def split_tune_line(line: str, flags) -> list[str]:
    """The line as argv for ``magic_arguments``: a model or data expression stays one argument.

    Expressions may hold spaces and commas, so the line is cut at the known
    flags only: an option's value runs to the next flag. A word that looks
    like an unknown option is a UsageError (it would otherwise be read as
    part of an expression).

    Example:
        >>> split_tune_line("model --batch-size 64 --data (x_train, y_train) --autotune",
        ...                 ["--batch-size", "--data", "--autotune"])
        ['model', '--batch-size', '64', '--data', '(x_train, y_train)', '--autotune']
    """
    flag_pattern = "|".join(re.escape(flag) for flag in sorted(flags, key=len, reverse=True))
    parts = re.split(rf"(?:^|\s)({flag_pattern})(?=\s|$)", " " + line.strip())
    for text in parts[::2]:
        unknown = re.search(r"(?:^|\s)(--?[A-Za-z][\w-]*)", text)
        if unknown:
            raise UsageError(f"unknown option {unknown.group(1)!r}; " + _USAGE)
    argv = [parts[0].strip()] if parts[0].strip() else []
    for flag, value in zip(parts[1::2], parts[2::2]):
        argv += [flag] + ([value.strip()] if value.strip() else [])
    return argv


@magics_class
class LmsTuneMagics(Magics):
    """``%lms_tune``: sliders for the LMS knobs with instant predictions, Measure, Autotune, Apply.

    Args:
        shell: the InteractiveShell.
        on_apply: called with ``n_tensors``, ``lb``, ``lean_ops`` and ``order_backward`` when Apply is pressed
            (``%%lms_fit``'s ``apply_defaults``, as :func:`lms_magic.magics.register` wires it).
    """

    def __init__(self, shell=None, on_apply=None, **kwargs):
        super().__init__(shell, **kwargs)
        self.on_apply = on_apply

    @magic_arguments()
    @argument("model", nargs="?", help="the compiled Keras model: a name or an expression")
    @argument("--data", help="the training data: (x, y) arrays or a tf.data.Dataset (an expression)")
    @argument("--batch-size", type=int, default=32, help="the batch size to start from (default 32)")
    @argument("--budget", default=None, help="device memory to stay under, e.g. 6GiB")
    @argument("--steps", type=int, default=5, help="timed steps per measured trial (default 5)")
    @argument("--max-trials", type=int, default=12, help="measured trials of the autotuner (default 12)")
    @argument("--min-bytes", type=int, default=DEFAULT_MIN_BYTES, help="leave smaller tensors alone (default 65536)")
    @argument("--device", default=None, help="the accelerator, e.g. /GPU:0 (default: the first GPU; TensorFlow only: JAX uses its default device)")
    @argument("--host-device", default=None,
              help="where swapped tensors wait (default /CPU:0; /CPU:1 after lms_magic.simulate_accelerator(); "
                   "TensorFlow only)")
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
        flags = [option for action in parser._actions for option in action.option_strings if option.startswith("--")]
        args = parser.parse_args(split_tune_line(line, flags))
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
        from .lms.options import OptionError
        from .tuning import TuningSession

        try:
            session = TuningSession(model, data, args.batch_size, args.budget, args.steps, args.min_bytes,
                                    device=args.device, host_device=args.host_device)
            if args.autotune:
                found = session.autotune(args.max_trials)
                print(found)
                return found
        except OptionError as error:
            raise UsageError(f"%lms_tune: {error.for_magic()}") from None
        except ValueError as error:  # BudgetError is one
            raise UsageError(f"%lms_tune: {error}") from None
        from .ui.dashboard import in_widget_frontend

        if not in_widget_frontend(self.shell):
            planned = session.predictor.planned(1, session.batch_size)
            print(f"%lms_tune: the sliders need a notebook. LMS's default plan swaps {planned.n_tensors} of "
                  f"{planned.candidates} candidates: predicted peak {format_size(planned.peak_bytes)} (without LMS "
                  f"{format_size(planned.peak_bytes_without_lms)}). Add --autotune to search here.")
            from .lms.core.peak import format_peak

            for label, count in (("without LMS", 0), ("with the plan", planned.n_tensors)):
                print(f"  {label}: " + format_peak(session.predictor.explain(count, 1, session.batch_size)))
            return None
        from IPython.display import display

        from .ui.tuner import Tuner

        display(Tuner(session, args.max_trials, on_apply=self.on_apply))
        return None


def _evaluate(expression: str, namespace: dict, what: str):
    """``expression`` evaluated in the user's namespace; a UsageError that names ``what`` if it fails."""
    try:
        return eval(expression, namespace)
    except Exception as error:
        raise UsageError(f"%lms_tune could not evaluate {what} ({expression!r}): {error.__class__.__name__}: "
                         f"{error}") from None
