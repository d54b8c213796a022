"""Showing results: plotly figures (and, later, ipywidgets dashboards)."""
