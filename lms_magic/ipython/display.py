"""How a magic's value is shown: silenced by a trailing ``;``, or made the cell's value without showing it twice."""

from __future__ import annotations

from typing import Callable


def output_can_be_silenced(function: Callable) -> Callable:
    """IPython 8's decorator that lets a trailing ``;`` silence a magic's value; on IPython 7 (Colab's 7.34),
    which has none, a wrapper that returns None when the cell's (or line's) code ends with ``;``."""
    try:
        from IPython.core.magic import output_can_be_silenced as decorate
    except ImportError:
        import functools

        @functools.wraps(function)
        def silenced(self, line="", cell=None, *args, **kwargs):
            value = function(self, line, cell, *args, **kwargs)
            code = [text.split("#", 1)[0].rstrip() for text in (cell if cell is not None else line).splitlines()]
            code = [text for text in code if text]
            return None if code and code[-1].endswith(";") else value

        return silenced
    return decorate(function)


def cell_value_not_shown(shell, result) -> None:
    """Makes ``result`` the cell's value (``_``, ``Out[n]``) without showing its table a second time."""
    shell.displayhook.update_user_ns(result)
    shell.displayhook.fill_exec_result(result)
