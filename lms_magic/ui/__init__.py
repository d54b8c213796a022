"""Showing results: plotly figures, HTML tables and ipywidgets (the dashboard, the tuner); results never import it."""
