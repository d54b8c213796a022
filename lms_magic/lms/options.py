"""Every LMS option, validated and normalised once (pure: no framework import).

``LMS(...)``, ``%%lms_fit``, ``%lms_tune`` and the tuning API build an :class:`LmsOptions`; a bad
value raises :class:`OptionError`, which names the option and says what it takes, so the magics
can repeat it with the option as the user typed it (``--lb``, not ``lb=``). Devices are spelt one
way ("/GPU:0", "/CPU:1") whatever the user wrote ("cuda:0", "/device:GPU:0", "gpu"); whether the
device exists is checked when training starts (``lms_magic.devices.check_devices``), where the
framework is at hand.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Callable

from ..units import parse_bytes
from .core.plan import DEFAULT_MIN_BYTES, PLANNED, NAME_FIELDS, Selection

_MAGIC_FLAGS = {"budget_bytes": "--budget", "n_tensors": "--n-tensors", "min_bytes": "--min-bytes",
                "host_device": "--host-device", "batch_size": "--batch-size", "max_trials": "--max-trials"}
_API_NAMES = {"budget_bytes": "budget"}


class OptionError(ValueError):
    """A bad option value: which option, the value given, and what the option takes.

    Example:
        >>> error = OptionError("lb", 0, "must be a whole number >= 1")
        >>> str(error), error.for_magic()
        ('lb=0: must be a whole number >= 1', '--lb 0: must be a whole number >= 1')
    """

    def __init__(self, option: str, value, problem: str):
        self.option, self.value, self.problem = option, value, problem
        super().__init__(f"{_API_NAMES.get(option, option)}={value!r}: {problem}")

    def for_magic(self) -> str:
        """The message with the option spelt as a magic's flag."""
        flag = _MAGIC_FLAGS.get(self.option, "--" + self.option.replace("_", "-"))
        return f"{flag} {self.value}: {self.problem}"


def whole_number(option: str, value, minimum: int) -> int:
    """``value`` if it is an int (not a bool) >= ``minimum``; else an OptionError naming ``option``.

    Example:
        >>> whole_number("steps", 5, 1)
        5
        >>> whole_number("steps", 0, 1)
        Traceback (most recent call last):
        ...
        lms_magic.lms.options.OptionError: steps=0: must be a whole number >= 1
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OptionError(option, value, f"must be a whole number >= {minimum}")
    return value


_DEVICE = re.compile(r"^/?(?:job:[^/]+/)?(?:replica:\d+/)?(?:task:\d+/)?(?:device:)?(gpu|cuda|cpu)(?::(\d+))?$")


def device_name(spec: str | None) -> str | None:
    """A device in the one spelling LMS uses: "/GPU:0" or "/CPU:1". A name it cannot read is returned as given
    (training then says which devices exist).

    Example:
        >>> [device_name(s) for s in ("cuda:1", "/device:GPU:0", "gpu", "/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:1")]
        ['/GPU:1', '/GPU:0', '/GPU:0', '/CPU:0', '/CPU:1']
        >>> device_name("banana"), device_name(None)
        ('banana', None)
    """
    if spec is None:
        return None
    match = _DEVICE.match(spec.strip().lower())
    if match is None:
        return spec
    kind = "CPU" if match.group(1) == "cpu" else "GPU"
    return f"/{kind}:{int(match.group(2) or 0)}"


@dataclass(frozen=True)
class LmsOptions:
    """The options of one LMS setting, each checked (see :class:`lms_magic.LMS` for their meaning).

    ``budget_bytes`` takes bytes or a size string ("6GiB"); name filters take a name, a layer class or
    a list of them; devices any common spelling.

    Raises:
        OptionError: a value the option does not take (the message says what it takes).

    Example:
        >>> options = LmsOptions(lb=2, budget_bytes="1MiB", device="cuda:0", include_layers="conv")
        >>> options.budget_bytes, options.device, options.selection.include_layers
        (1048576, '/GPU:0', ('conv',))
        >>> LmsOptions(n_tensors=-3)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lms_magic.lms.options.OptionError: n_tensors=-3: must be None (planned...), -1 (all), 0 (LMS off) or a positive count
    """

    n_tensors: int | None = PLANNED
    lb: int = 1
    budget_bytes: int | str | None = None
    min_bytes: int = DEFAULT_MIN_BYTES
    include_layers: tuple[str, ...] = ()
    exclude_layers: tuple[str, ...] = ()
    include_types: tuple[str, ...] = ()
    exclude_types: tuple[str, ...] = ()
    device: str | None = None
    host_device: str | None = None
    verbose: int = 1
    batch_size_hint: int | Callable[[], int] | None = None
    recompute: bool | str = False
    lean_ops: bool = False
    order_backward: bool = False

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        if self.n_tensors is not PLANNED and (isinstance(self.n_tensors, bool) or not isinstance(self.n_tensors, int)
                                              or self.n_tensors < -1):
            raise OptionError("n_tensors", self.n_tensors, "must be None (planned: the lowest predicted peak), "
                                                           "-1 (all), 0 (LMS off) or a positive count")
        whole_number("lb", self.lb, 1)
        whole_number("min_bytes", self.min_bytes, 0)
        if self.budget_bytes is not None:
            try:
                put("budget_bytes", parse_bytes(self.budget_bytes))
            except ValueError:
                raise OptionError("budget_bytes", self.budget_bytes, "not a memory size: give a positive number of "
                                  "bytes or a string such as '6GiB', '512MiB', '8GB'") from None
        for field in NAME_FIELDS:
            put(field, _names(field, getattr(self, field)))
        for role in ("device", "host_device"):
            spec = getattr(self, role)
            if not (spec is None or isinstance(spec, str)):
                raise OptionError(role, spec, "takes a device name such as '/GPU:0' or '/CPU:0'")
            put(role, device_name(spec))
        if not (self.recompute is False or self.recompute is True or self.recompute == "only"):
            raise OptionError("recompute", self.recompute, "takes False (swap what the plan moves), True (recompute "
                                                           "what can be, swap the rest) or 'only' (recompute, never "
                                                           "swap)")
        if not isinstance(self.lean_ops, bool):
            raise OptionError("lean_ops", self.lean_ops, "takes True (BatchNormalization's gradient in one piece: "
                                                         "less memory, results differ at float rounding) or False")
        if not isinstance(self.order_backward, bool):
            raise OptionError("order_backward", self.order_backward, "takes True (the backward pass one layer's "
                                                                     "gradient at a time where that lowers the "
                                                                     "predicted peak) or False")
        hint = self.batch_size_hint
        if hint is not None and not callable(hint):
            whole_number("batch_size_hint", hint, 1)

    @property
    def selection(self) -> Selection:
        """The static filters, for the planner."""
        return Selection(self.n_tensors, self.min_bytes, self.include_layers, self.exclude_layers,
                         self.include_types, self.exclude_types)

    def replace(self, **changes) -> "LmsOptions":
        """A copy with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)

    def batch_size(self) -> int | None:
        """The batch size hint's value (a function is called), or None."""
        hint = self.batch_size_hint
        return whole_number("batch_size_hint", hint(), 1) if callable(hint) else hint


def _names(field: str, value) -> tuple[str, ...]:
    """A name filter as a tuple of names: one string is one name, a layer class counts by its name."""
    if isinstance(value, (str, type)):
        value = (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise OptionError(field, value, f"takes a layer {'type' if 'types' in field else 'name'} or a list of "
                                        "them") from None
    names = tuple(item.__name__ if isinstance(item, type) else item for item in items)
    wrong = [item for item in names if not isinstance(item, str)]
    if wrong:
        raise OptionError(field, value, f"takes names (strings){' or layer classes' if 'types' in field else ''}, "
                                        f"not {wrong[0]!r}")
    return names


def compiled_model(model):
    """``model`` if it is compiled; else a ValueError that says what to do.

    Example:
        >>> import types
        >>> compiled_model(types.SimpleNamespace(compiled=False))
        Traceback (most recent call last):
        ...
        ValueError: this model is not compiled: call model.compile(optimizer, loss) first
    """
    if not getattr(model, "compiled", False):
        raise ValueError("this model is not compiled: call model.compile(optimizer, loss) first")
    return model
