"""Every LMS option, validated and normalised once (pure: no framework import).

``LMS(...)``, ``%%lms_fit``, ``%lms_tune`` and the tuning API build an :class:`LmsOptions`; a bad
value raises :class:`OptionError`, which names the option and says what it takes, so the magics
can repeat it with the option as the user typed it (``--lb``, not ``lb=``). Devices are spelt one
way ("/GPU:0", "/CPU:1") whatever the user wrote ("cuda:0", "/device:GPU:0", "gpu"); whether the
device exists is checked when training starts (``lms_magic.lms.framework.check_devices``), where the
framework is at hand.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Callable

from ..units import parse_bytes
from .core.plan import DEFAULT_MIN_BYTES, PLANNED, NAME_FIELDS, Selection

_API_NAMES = {"budget_bytes": "budget"}


def flag_of(option: str) -> str:
    """The magics' flag for an option (an ``LmsOptions`` field or a magic's own, such as ``batch_size``).

    Example:
        >>> flag_of("budget_bytes"), flag_of("n_tensors"), flag_of("max_trials")
        ('--budget', '--n-tensors', '--max-trials')
    """
    field = next((f for f in dataclasses.fields(LmsOptions) if f.name == option), None)
    return (field.metadata.get("flag") if field is not None else None) or "--" + option.replace("_", "-")


def _option(default, help_text: str | None, *, flag: str | None = None, type=None, choices: dict | None = None,
            default_text: str | None = None):
    """An ``LmsOptions`` field that carries its magic flag: the flag (``--`` and the name, dashed, unless given),
    its help, how the flag's text is read (``type``; ``choices``: word -> value; a bool: a switch) and how its
    default reads. ``help_text`` None: no flag (a Python-only option)."""
    return dataclasses.field(default=default, metadata={
        "help": help_text, "flag": flag, "type": type, "choices": choices,
        "default_text": default_text if default_text is not None else str(default)})


def _comma_list(text: str) -> tuple[str, ...]:
    """``"conv1,conv2"`` as ``("conv1", "conv2")``."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def magic_flags() -> list[dict]:
    """Every ``LmsOptions`` field a magic takes as a flag, in field order: ``name``, ``flag``, ``help`` (ending in
    its default), ``type``, ``choices`` and whether it is a switch (a bool field).

    Example:
        >>> [f["flag"] for f in magic_flags()][:4]
        ['--n-tensors', '--lb', '--budget', '--min-bytes']
        >>> next(f["help"] for f in magic_flags() if f["name"] == "min_bytes")
        'leave smaller tensors on the device (default 65536)'
    """
    flags = []
    for field in dataclasses.fields(LmsOptions):
        meta = field.metadata
        if meta.get("help") is None:
            continue
        switch = isinstance(field.default, bool) and meta.get("choices") is None
        flags.append({"name": field.name, "flag": flag_of(field.name), "type": meta.get("type"),
                      "choices": meta.get("choices"), "switch": switch,
                      "help": meta["help"] + ("" if switch else f" (default {meta['default_text']})")})
    return flags


def options_from_flags(given: dict, defaults: "LmsOptions | None" = None) -> "LmsOptions":
    """An ``LmsOptions`` from a magic's parsed flags (``given``: field name -> the flag's value, None where the
    flag was not given), over ``defaults``; checked once, here.

    Example:
        >>> options = options_from_flags({"lb": 3, "recompute": "only", "lean_ops": None})
        >>> options.lb, options.recompute, options.lean_ops
        (3, 'only', False)
    """
    changes = {}
    for flag in magic_flags():
        value = given.get(flag["name"])
        if value is None:
            continue
        changes[flag["name"]] = flag["choices"][value] if flag["choices"] else value
    return (defaults or LmsOptions()).replace(**changes)


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
        return f"{flag_of(self.option)} {self.value}: {self.problem}"


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

    n_tensors: int | None = _option(
        PLANNED, "tensors to move: by default LMS's plan (nothing where the step fits the device, else the fewest "
                 "bytes that fit; the lowest predicted peak where the capacity is unknown); -1 all, 0 none, N the "
                 "first N", type=int, default_text="the plan")
    lb: int = _option(1, "swap in this many backward ops ahead of the consumer", type=int)
    budget_bytes: int | str | None = _option(None, "device memory to stay under, e.g. 6GiB (overrides --n-tensors)",
                                             flag="--budget", default_text="none")
    min_bytes: int = _option(DEFAULT_MIN_BYTES, "leave smaller tensors on the device", type=int)
    include_layers: tuple[str, ...] = _option((), "only these layers' tensors move (names, separated by commas)",
                                              type=_comma_list, default_text="all")
    exclude_layers: tuple[str, ...] = _option((), "these layers' tensors never move (names, separated by commas)",
                                              type=_comma_list, default_text="none")
    include_types: tuple[str, ...] = _option((), "only these layer classes' tensors move, e.g. Conv2D,Dense",
                                             type=_comma_list, default_text="all")
    exclude_types: tuple[str, ...] = _option((), "these layer classes' tensors never move, e.g. Dropout",
                                             type=_comma_list, default_text="none")
    device: str | None = _option(None, "the accelerator, e.g. /GPU:0", default_text="the first GPU")
    host_device: str | None = _option(None, "where swapped tensors wait",
                                      default_text="/CPU:0; /CPU:1 after lms_magic.simulate_accelerator()")
    verbose: int = _option(1, None)  # -q in the magics
    batch_size_hint: int | Callable[[], int] | None = _option(None, None)  # Python only
    recompute: bool | str = _option(
        False, "off (swap what the plan moves), on (recompute what can be from tensors on the device, swap the "
               "rest), only (recompute, never swap: nothing crosses the host link)",
        choices={"off": False, "on": True, "only": "only"}, default_text="off")
    lean_ops: bool = _option(False, "compute each BatchNormalization's gradient in one piece (on PyTorch: its fused "
                                    "kernel): a lower backward-pass peak, results that differ at float rounding")
    order_backward: bool = _option(False, "run the backward pass one layer's gradient at a time where that lowers "
                                          "the predicted peak (bit-identical; a predicted gain, not yet a measured "
                                          "one); TensorFlow, swaps only")

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

    @classmethod
    def from_api(cls, *args, **kwargs) -> "LmsOptions":
        """The options from ``LMS(...)``'s arguments: its names (``budget`` for ``budget_bytes``), positional ones in
        field order.

        Raises:
            TypeError: an argument no field takes (as Python says of a call).

        Example:
            >>> LmsOptions.from_api(-1, budget="1KiB").budget_bytes
            1024
        """
        names = [field.name for field in dataclasses.fields(cls)]
        if len(args) > len(names):
            raise TypeError(f"LMS() takes at most {len(names)} positional options ({len(args)} given)")
        given = dict(zip(names, args))
        for name, value in kwargs.items():
            field = next((n for n in names if _API_NAMES.get(n, n) == name), None)
            if field is None:
                raise TypeError(f"LMS() got an unexpected keyword argument {name!r}; its options are "
                                f"{', '.join(_API_NAMES.get(n, n) for n in names)}")
            if field in given:
                raise TypeError(f"LMS() got multiple values for {name!r}")
            given[field] = value
        return cls(**given)

    @classmethod
    def api_signature(cls) -> list:
        """``LMS(...)``'s parameters, one per field (its API name and default), for ``inspect.signature``."""
        import inspect

        return [inspect.Parameter(_API_NAMES.get(field.name, field.name), inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                  default=field.default) for field in dataclasses.fields(cls)]

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
