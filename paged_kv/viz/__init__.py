"""Plotly figures for the book (one submodule per chapter topic), and the one place that picks
plotly's renderer.

Submodules: :mod:`~paged_kv.viz.palette` (colours), :mod:`~paged_kv.viz.labels` (a token's text in a
figure: whitespace made visible), :mod:`~paged_kv.viz.controls` (sliders and
dropdowns that find what they change by name), :mod:`~paged_kv.viz.text` (computed prose, tables,
package source); by chapter: ``attention``, ``cost`` (1-2); ``memory``, ``calculator`` (3);
``fragmentation`` (4); ``blocks``, ``logical_view``, ``kernel_walk``, ``gpu_results`` (5);
``sharing`` (6); ``serving`` (7); ``prefix_cache`` (8); ``spec_decode`` (9).  Of the package, only ``widgets/`` imports
this layer.

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

from .controls import add_replay_controls, layout_path, trace_indices
from .labels import log_ticks, wrap_title
from .palette import COLORS, FREE_COLOR, discrete_scale, seq_color, tint

__all__ = ["BOOK_ENV", "BookRenderer", "TEMPLATE", "COLORS", "FREE_COLOR", "add_replay_controls", "discrete_scale",
           "in_colab", "is_static_build", "layout_path", "line_figure", "seq_color", "setup_plotly", "tint", "trace_indices"]

BOOK_ENV = "PAGED_KV_BOOK"
#: the plotly template of every figure in the book (set by :func:`setup_plotly`; the panel models
#: set it on their figures themselves, so a live figure's bytes never depend on who called it)
TEMPLATE = "plotly_white"


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
    pio.templates.default = TEMPLATE
    return pio.renderers.default


def line_figure(x, series: dict, title: str, xaxis: str, yaxis: str, log_y: bool = False) -> go.Figure:
    """A simple line chart: ``series`` maps a legend label to y values over ``x``; the title is
    broken to fit a phone (:func:`~.labels.wrap_title`), and ``log_y`` labels every tick."""
    fig = go.Figure()
    for i, (label, y) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=label,
                                 line=dict(color=seq_color(i)), marker=dict(size=4)))
    head = wrap_title(title)
    extra = 18 * head.count("<br>")
    fig.update_layout(title=head, xaxis_title=xaxis, yaxis_title=yaxis, height=380 + extra,
                      margin=dict(l=60, r=20, t=50 + extra, b=50), legend=dict(orientation="h", y=-0.2))
    if log_y:                                  # every tick labelled (1-2-5 per decade)
        vals, texts = log_ticks([v for y in series.values() for v in y])
        fig.update_yaxes(type="log", tickvals=vals, ticktext=texts)
    return fig
