"""The %%lms_fit dashboard: a headline, figures and the table, as plain outputs.

No widget: every part is an ordinary display output (HTML, and plotly's
mimetype with an HTML fallback for the figures), so the dashboard renders in
JupyterLab, Notebook 7, VS Code, Colab and Kaggle with whichever ipywidgets
they have, and stays visible in exported HTML and on nbviewer, where no widget
manager runs. In a terminal, :func:`show` prints the headline and the table.
"""

from __future__ import annotations

import html

from .plots import figure_bundle, fit_figures
from .report_html import fit_result_html


class Dashboard:
    """The outputs of one %%lms_fit result: ``headline`` (text), ``figures`` (plotly Figures) and
    ``summary`` (the table's HTML), shown one below the other.

    Example:
        >>> from lms_magic.fit.results import LmsFitResult
        >>> Dashboard(LmsFitResult()).headline
        '%%lms_fit: the cell called no fit'
    """

    def __init__(self, result):
        self.result = result
        self.headline = result.headline()
        self.figures = fit_figures(result) if result.calls else []
        self.summary = fit_result_html(result)

    def bundles(self) -> list[dict]:
        """The display bundles, in order: headline, figures, table."""
        headline = {"text/html": f"<h3 class='lms-magic-headline'>{html.escape(self.headline)}</h3>",
                    "text/plain": self.headline}
        if not self.result.calls:  # without a fit, the headline says all there is
            return [headline]
        table = {"text/html": self.summary, "text/plain": str(self.result)}
        return [headline, *[figure_bundle(figure) for figure in self.figures], table]

    def _ipython_display_(self):
        from IPython.display import display

        for bundle in self.bundles():
            display(bundle, raw=True)


def in_widget_frontend(shell) -> bool:
    """True in a Jupyter kernel (rich outputs render), False in terminal IPython."""
    return shell is not None and getattr(shell, "kernel", None) is not None


def show(result, shell) -> None:
    """The dashboard in a notebook; the headline and the text table in a terminal."""
    if in_widget_frontend(shell):
        from IPython.display import display

        display(Dashboard(result))
        return
    print(result.headline())
    if result.calls:  # without a fit, the headline says all there is
        print(result)
