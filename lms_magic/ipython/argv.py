"""A magic's flags: declared once (``argument``, and ``lms_option_arguments`` from ``LmsOptions``'s fields),
the line split at them, and ``--help``."""

from __future__ import annotations

import re

from IPython.core import magic_arguments
from IPython.core.error import UsageError

_TOKEN = re.compile(r"\S+")
HELP_FLAGS = ("-h", "--help")


def asks_for_help(option_text: str) -> bool:
    """Whether a magic's options ask for its usage (``-h`` or ``--help``), as argparse programs take them.

    Example:
        >>> asks_for_help("--compare --help"), asks_for_help("-q"), asks_for_help("")
        (True, False, False)
    """
    return any(token in HELP_FLAGS for token in option_text.split())


def print_help(magic) -> None:
    """Prints a magic's help as ``%magic?`` shows it: its docstring, with the usage and every option."""
    import inspect

    print(inspect.cleandoc(magic.__doc__ or ""))


def argument(*flags: str, **kwargs):
    """IPython's ``magic_arguments.argument``, the flags also recorded on the magic (``flags_of``) for the line
    splitters, which so need no private argparse state."""
    declare = magic_arguments.argument(*flags, **kwargs)

    def decorate(function):
        takes_value = kwargs.get("action") not in ("store_true", "store_false")
        known = getattr(function, "lms_flags", {})
        function.lms_flags = {**known, **{flag: takes_value for flag in flags if flag.startswith("-")}}
        return declare(function)

    return decorate


def flags_of(magic) -> dict[str, bool]:
    """A magic's flags (those ``argument`` declared, and ``-h``/``--help``) -> whether each takes a value."""
    return {**{flag: False for flag in HELP_FLAGS}, **getattr(magic, "lms_flags", {})}


def lms_option_arguments(function=None, *, only: tuple[str, ...] | None = None):
    """Declares a flag for every ``LmsOptions`` field a magic takes (``lms.options.magic_flags``; ``only``: these
    fields), its help and default from the field; each flag's value is None where it is not given
    (``options_from_flags`` then keeps the default). Use as ``@lms_option_arguments`` or
    ``@lms_option_arguments(only=(...))``."""
    from ..lms.options import magic_flags

    def declare(function):
        flags = [flag for flag in magic_flags() if only is None or flag["name"] in only]
        for flag in reversed(flags):  # IPython lists arguments in the order they are declared, top first
            if flag["switch"]:
                function = argument(flag["flag"], dest=flag["name"], action="store_true", default=None,
                                    help=flag["help"])(function)
            elif flag["choices"]:
                function = argument(flag["flag"], dest=flag["name"], choices=tuple(flag["choices"]), default=None,
                                    help=flag["help"])(function)
            else:
                function = argument(flag["flag"], dest=flag["name"], type=flag["type"], default=None,
                                    help=flag["help"])(function)
        return function

    return declare if function is None else declare(function)


def split_options(line: str, flags: dict[str, bool]) -> tuple[str, str]:
    """Splits ``"-i 0.01 -q x = f(1)"`` into ``("-i 0.01 -q", "x = f(1)")``.

    Leading tokens that are options in ``flags`` (flag -> takes a value: ``flags_of(magic)``)
    are options; the rest of the line, untouched, is the statement. ``--`` ends
    the options explicitly. A leading token that looks like an unknown option
    is an error rather than silently becoming code.

    Example:
        >>> split_options("-q -i 0.5 y = -x  # comment", {"-i": True, "--interval": True, "-q": False})
        ('-q -i 0.5', 'y = -x  # comment')
    """
    takes_value = {**{flag: False for flag in HELP_FLAGS}, **flags}
    position = 0
    expects_value = False
    for match in _TOKEN.finditer(line):
        token = match.group()
        if expects_value:
            expects_value = False
            position = match.end()
            continue
        if token == "--":
            return line[: match.start()].strip(), line[match.end():].strip()
        flag = token.split("=", 1)[0]
        if flag in takes_value:
            expects_value = takes_value[flag] and "=" not in token
            position = match.end()
            continue
        if re.match(r"--?[A-Za-z]", token):
            known = ", ".join(sorted(f for f in takes_value if f.startswith("-")))
            raise UsageError(f"unknown option {token!r}; options are {known}. "
                             "Put '--' before a statement that starts with '-'.")
        break
    else:
        position = len(line)
    return line[:position].strip(), line[position:].strip()


def split_at_flags(line: str, flags, usage: str = "") -> list[str]:
    """The line as argv for ``magic_arguments`` where values are expressions: a model or data expression stays
    one argument (``%lms_tune``).

    Expressions may hold spaces and commas, so the line is cut at the known
    flags only: an option's value runs to the next flag. A word that looks
    like an unknown option is a UsageError (it would otherwise be read as
    part of an expression); ``usage`` ends its message.

    Example:
        >>> split_at_flags("model --batch-size 64 --data (x_train, y_train) --autotune",
        ...                 ["--batch-size", "--data", "--autotune"])
        ['model', '--batch-size', '64', '--data', '(x_train, y_train)', '--autotune']
    """
    flag_pattern = "|".join(re.escape(flag) for flag in sorted(flags, key=len, reverse=True))
    parts = re.split(rf"(?:^|\s)({flag_pattern})(?=\s|$)", " " + line.strip())
    for text in parts[::2]:
        unknown = re.search(r"(?:^|\s)(--?[A-Za-z][\w-]*)", text)
        if unknown:
            raise UsageError(f"unknown option {unknown.group(1)!r}; " + usage)
    argv = [parts[0].strip()] if parts[0].strip() else []
    for flag, value in zip(parts[1::2], parts[2::2]):
        argv += [flag] + ([value.strip()] if value.strip() else [])
    return argv
