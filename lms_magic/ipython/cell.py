"""Run cell text in the user's namespace exactly as IPython's ``%%time`` does.

IPython's input transformations apply (``!cmd``, other magics), AST
transformers run, assignments land in the user's namespace, and a trailing
expression becomes the value returned (shown as the cell's output).
"""

from __future__ import annotations

import ast


class CompiledCell:
    """A cell compiled for the user's shell: a body and an optional trailing expression.

    Args:
        shell: the ``InteractiveShell`` whose transformations and compiler to use.
        source: the cell text.

    Raises:
        SyntaxError: the cell text is not valid Python after transformation.
    """

    def __init__(self, shell, source: str):
        self._shell = shell
        transformed = shell.transform_cell(source)
        # Registering the text with the compiler makes tracebacks show the cell's lines.
        filename = shell.compile.cache(transformed, shell.execution_count, raw_code=source)
        tree = shell.transform_ast(shell.compile.ast_parse(transformed, filename=filename))
        self._value = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            self._value = shell.compile(ast.Expression(tree.body.pop().value), filename, "eval")
        self._body = shell.compile(tree, filename, "exec")

    def run(self, local_ns=None):
        """Executes the cell; returns the trailing expression's value (or None)."""
        __tracebackhide__ = True  # noqa: F841
        namespace = self._shell.user_ns
        exec(self._body, namespace, local_ns)
        if self._value is not None:
            return eval(self._value, namespace, local_ns)
        return None
