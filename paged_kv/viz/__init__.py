"""Plotly figures for the book (one submodule per chapter topic), and the one place that picks
plotly's renderer.

Figures are built by pure functions of recorded data (snapshots, measurements), so the static
HTML book can show them with no live objects and no kernel.

Rendering (:func:`setup_plotly`):

* **building the book** (``PAGED_KV_BOOK=1``, set by ``make book``): each figure becomes a
  ``text/html`` output *without* its own copy of plotly.js; the book loads plotly.js once per
  page from its own ``_static/`` folder, so pages work offline and stay small.  (plotly >= 6's
  default renderer under a kernel emits ``application/vnd.plotly.v1+json``, which a static
  Sphinx page cannot display.)
* **Colab**: plotly's ``colab`` renderer.
* **elsewhere** (Jupyter, VS Code): plotly's own default.
"""

from __future__ import annotations

import os
import sys

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.base_renderers import MimetypeRenderer

BOOK_ENV = "PAGED_KV_BOOK"

# One palette for the whole book: sequence i is always drawn in COLORS[i % len(COLORS)].
COLORS = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6",
          "#9D755D", "#EECA3B", "#BAB0AC"]
FREE_COLOR = "#EEEEEE"


def is_static_build() -> bool:
    """True while ``make book`` executes the chapters (no reader, no live widgets)."""
    return os.environ.get(BOOK_ENV, "") not in ("", "0")


def in_colab() -> bool:
    """True inside a Google Colab kernel."""
    return "google.colab" in sys.modules


class BookRenderer(MimetypeRenderer):
    """``text/html`` with the figure's div and script only; plotly.js comes from the page."""

    def to_mimebundle(self, fig_dict):
        html = pio.to_html(fig_dict, include_plotlyjs=False, full_html=False, auto_play=False,
                           config={"displaylogo": False, "responsive": True})
        return {"text/html": html}


def setup_plotly() -> str:
    """Choose plotly's default renderer for where this runs; returns the renderer's name."""
    if "paged_kv_book" not in pio.renderers:
        pio.renderers["paged_kv_book"] = BookRenderer()
    if is_static_build():
        pio.renderers.default = "paged_kv_book"
    elif in_colab():
        pio.renderers.default = "colab"
    pio.templates.default = "plotly_white"
    return pio.renderers.default


def line_figure(x, series: dict, title: str, xaxis: str, yaxis: str, log_y: bool = False) -> go.Figure:
    """A simple line chart: ``series`` maps a legend label to y values over ``x``."""
    fig = go.Figure()
    for i, (label, y) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=label,
                                 line=dict(color=COLORS[i % len(COLORS)]), marker=dict(size=4)))
    fig.update_layout(title=title, xaxis_title=xaxis, yaxis_title=yaxis, height=380,
                      margin=dict(l=60, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.2))
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def add_replay_controls(fig: go.Figure, steps: list, active: int, currentvalue: dict,
                        frame_ms: int, slider: dict | None = None, pad_top: int = 30) -> go.Figure:
    """Give a figure with frames the book's replay controls: a slider over ``steps`` (plotly
    slider steps) starting at ``active``, and a play button. Works in a static page (no kernel).

    ``currentvalue``: the slider's label settings; ``slider``: extra slider layout (x, len, pad).
    """
    fig.update_layout(
        sliders=[dict(active=active, steps=steps, y=0, yanchor="top", currentvalue=currentvalue,
                      **{"x": 0, "len": 1, "pad": dict(t=pad_top), **(slider or {})})],
        updatemenus=[dict(type="buttons", showactive=False, x=0, y=0, xanchor="left", yanchor="top",
                          pad=dict(t=pad_top), buttons=[dict(
                              label="▶", method="animate",
                              args=[None, dict(frame=dict(duration=frame_ms, redraw=True),
                                               fromcurrent=True, mode="immediate")])])])
    return fig
