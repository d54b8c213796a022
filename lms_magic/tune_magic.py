"""``%lms_tune``: the LMS tuning widget for a model and its data."""

from __future__ import annotations

import re

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from .lms.plan import DEFAULT_MIN_BYTES
from .units import format_mib

# flag -> (attribute, kind): "expr" is Python evaluated in the user's namespace
_FLAGS = {
    "--data": ("data", "expr"), "--batch-size": ("batch_size", int), "--budget": ("budget", str),
    "--steps": ("steps", int), "--max-trials": ("max_trials", int), "--min-bytes": ("min_bytes", int),
    "--device": ("device", str), "--host-device": ("host_device", str), "--autotune": ("autotune", bool),
}
_USAGE = ("usage: %lms_tune MODEL --data (x, y) [--batch-size 32] [--budget 6GiB] [--steps 5] [--max-trials 12] "
          "[--min-bytes 65536] [--device /GPU:0] [--host-device /CPU:0] [--autotune]")


def parse_tune_line(line: str) -> tuple[str, dict]:
    """Splits the line into the model expression and the options (values still text for expressions).

    Expressions may hold spaces and commas: an option's value runs to the next known flag.

    Example:
        >>> parse_tune_line("model --batch-size 64 --data (x_train, y_train)")
        ('model', {'batch_size': 64, 'data': '(x_train, y_train)'})
    """
    flag_pattern = "|".join(re.escape(flag) for flag in sorted(_FLAGS, key=len, reverse=True))
    parts = re.split(rf"(?:^|\s)({flag_pattern})(?=\s|$)", " " + line.strip())
    model, options = parts[0].strip(), {}
    if not model:
        raise UsageError("no model: " + _USAGE)
    for text in parts[::2]:
        unknown = re.search(r"(?:^|\s)(--?[A-Za-z][\w-]*)", text)
        if unknown:
            raise UsageError(f"unknown option {unknown.group(1)!r}; " + _USAGE)
    for flag, value in zip(parts[1::2], parts[2::2]):
        name, kind = _FLAGS[flag]
        value = value.strip()
        if kind is bool:
            if value:
                raise UsageError(f"{flag} takes no value, got {value!r}")
            options[name] = True
            continue
        if not value:
            raise UsageError(f"{flag} needs a value; " + _USAGE)
        if kind is int:
            try:
                options[name] = int(value)
            except ValueError:
                raise UsageError(f"{flag} takes a whole number, got {value!r}") from None
        else:
            options[name] = value
    return model, options


@magics_class
class LmsTuneMagics(Magics):
    """``%lms_tune``: sliders for the LMS knobs with instant predictions, Measure, Autotune, Apply."""

    @line_magic
    def lms_tune(self, line):
        """Tune LMS for a compiled Keras model.

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
        model_expr, options = parse_tune_line(line)
        namespace = self.shell.user_ns
        model = _evaluate(model_expr, namespace, "the model")
        data = _evaluate(options.pop("data"), namespace, "--data") if "data" in options else None
        import keras

        if not isinstance(model, keras.Model):
            raise UsageError(f"%lms_tune: {model_expr!r} is {type(model).__name__!r}, not a Keras model; " + _USAGE)
        autotune_now = options.pop("autotune", False)
        max_trials = options.pop("max_trials", 12)
        if max_trials < 1:
            raise UsageError(f"--max-trials must be at least 1, got {max_trials}")
        from .lms.callback import check_devices
        from .tuning import TuningSession

        try:
            check_devices(options.get("device"), options.get("host_device"))
            session = TuningSession(model, data, options.pop("batch_size", 32), options.pop("budget", None),
                                    options.pop("steps", 5), options.pop("min_bytes", DEFAULT_MIN_BYTES), **options)
            if autotune_now:
                found = session.autotune(max_trials)
                print(found)
                return found
        except ValueError as error:  # BudgetError is one
            raise UsageError(f"%lms_tune: {error}") from None
        from .ui.dashboard import in_widget_frontend

        if not in_widget_frontend(self.shell):
            from .lms.search import Setting

            estimate = session.estimate(Setting(-1, 1, session.batch_size))
            print(f"%lms_tune: the sliders need a notebook. Prediction with every candidate swapped: "
                  f"{format_mib(estimate.peak_bytes)} (without LMS {format_mib(estimate.peak_bytes_without_lms)}). "
                  "Add --autotune to search here.")
            return None
        from IPython.display import display

        from .ui.tuner import Tuner

        display(Tuner(session, max_trials))
        return None


def _evaluate(expression: str, namespace: dict, what: str):
    """``expression`` evaluated in the user's namespace; a UsageError that names ``what`` if it fails."""
    try:
        return eval(expression, namespace)
    except Exception as error:
        raise UsageError(f"%lms_tune could not evaluate {what} ({expression!r}): {error.__class__.__name__}: "
                         f"{error}") from None
