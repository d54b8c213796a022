"""The %%lms_fit dashboard: core ipywidgets around plain plotly Figures.

Core widgets (Tab, HTML, Output) render in JupyterLab, Notebook 7, VS Code,
Colab and Kaggle; the figures are plain ``plotly`` Figures shown inside Output
widgets (``FigureWidget`` is fragile on Colab and VS Code). Where no widget
front end exists (terminal IPython), :func:`show` prints the table instead.
"""

from __future__ import annotations

from .plots import figure_bundle, fit_figures

TABS = ("Summary", "Memory", "Training")


class Dashboard:
    """Widgets for one %%lms_fit result; ``figures`` and ``summary`` are kept for inspection.

    Raises:
        ImportError: ipywidgets is missing (the message gives the install command).
    """

    def __init__(self, result):
        try:
            import ipywidgets as widgets
        except ImportError:
            raise ImportError("the %%lms_fit dashboard needs ipywidgets: pip install ipywidgets") from None
        self.result = result
        self.figures = fit_figures(result)
        self.summary = widgets.HTML(value=result._repr_html_())
        outputs = []
        for figure in self.figures:
            # Set, not captured with `with output:`: capture ties the widget to the running
            # cell's messages, which headless runners (nbclient) wait on.
            output = widgets.Output()
            output.outputs = ({"output_type": "display_data", "data": figure_bundle(figure), "metadata": {}},)
            outputs.append(output)
        self.widget = widgets.Tab(children=[self.summary, *outputs])
        for index, title in enumerate(TABS):
            self.widget.set_title(index, title)

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)


def in_widget_frontend(shell) -> bool:
    """True in a Jupyter kernel (widgets can render), False in terminal IPython."""
    return shell is not None and getattr(shell, "kernel", None) is not None


def show(result, shell) -> None:
    """The dashboard in a notebook; the text table in a terminal or without ipywidgets."""
    from IPython.display import display

    if in_widget_frontend(shell):
        try:
            display(Dashboard(result))
            return
        except ImportError as error:
            print(error)
    print(result)
