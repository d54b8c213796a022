"""Splitting a line magic's options from the statement that follows them, and ``--help``."""

from __future__ import annotations

import re

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


def split_options(line: str, parser) -> tuple[str, str]:
    """Splits ``"-i 0.01 -q x = f(1)"`` into ``("-i 0.01 -q", "x = f(1)")``.

    Leading tokens that are options known to ``parser`` (an argparse parser)
    are options; the rest of the line, untouched, is the statement. ``--`` ends
    the options explicitly. A leading token that looks like an unknown option
    is an error rather than silently becoming code.

    Example:
        >>> import argparse
        >>> parser = argparse.ArgumentParser()
        >>> _ = parser.add_argument("-i", "--interval"); _ = parser.add_argument("-q", action="store_true")
        >>> split_options("-q -i 0.5 y = -x  # comment", parser)
        ('-q -i 0.5', 'y = -x  # comment')
    """
    takes_value = {flag: False for flag in HELP_FLAGS}
    for action in parser._actions:
        for flag in action.option_strings:
            takes_value[flag] = action.nargs != 0
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
