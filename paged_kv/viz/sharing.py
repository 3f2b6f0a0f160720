"""Figures for chapter 6: blocks shared by several sequences, and the copies copy-on-write makes.

:func:`sharing_figure` is :func:`paged_kv.viz.blocks.blocks_figure` (the pool and the block tables,
replayed from recorded snapshots) with two overlays per snapshot:

* every *shared* physical block (ref count >= 2) is framed, the frame thicker and the block darker
  the more tables hold it, and its label reads ``id ×ref count``;
* in the step where a sequence writes into a shared, partly filled block, an arrow runs from the
  block to its copy (``copy-on-write src → dst``).

:func:`savings_figure` draws measured block counts with and without sharing, and
:func:`latency_figure` normalized latency against request rate (the shapes of the vLLM paper's
Figures 15 and 14).  All are pure functions of recorded data.
"""

from __future__ import annotations

import itertools
from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .blocks import KEY, block_cells, blocks_figure, refresh_blocks_figure
from .labels import wrap_title
from .palette import COLORS, seq_color

__all__ = ["SHARING_KEY", "SYSTEM_COLORS", "latency_figure", "refresh_sharing_figure", "savings_figure", "sharing_figure",
           "sharing_overlay"]

FRAME_COLOR = "#222222"
# One colour per serving system in every panel (the order chapter 7's latency figure draws them).
SYSTEM_COLORS = {"paged (vLLM)": COLORS[0], "Orca (Oracle)": COLORS[1], "Orca (Max)": COLORS[2],
                 "Orca (Pow2)": COLORS[3]}
COPY_COLOR = "#D62728"
#: the blocks figure's colour key and the marks this one adds
SHARING_KEY = KEY + "<br>framed: a shared block (ref count ≥ 2, thicker: more holders)<br>red arrow: a copy-on-write copy"


def sharing_overlay(snap) -> tuple[list[dict], list[dict]]:
    """``(shapes, annotations)`` for one snapshot: a frame around each shared block (line width and
    shading grow with the ref count) and an arrow for each copy-on-write copy of the snapshot's
    event.  Coordinates are the pool panel's (``xref="x", yref="y"``)."""
    shapes, notes = [], []
    nb, bs = snap.num_blocks, snap.block_size
    for blk in snap.blocks:
        if blk.ref_count < 2:
            continue
        x0, x1, y = block_cells(blk.block_id, nb, bs)
        shapes.append(dict(type="rect", xref="x", yref="y", x0=x0 - 0.5, x1=x1 + 0.5, y0=y - 0.45, y1=y + 0.45,
                           line=dict(color=FRAME_COLOR, width=1 + blk.ref_count),
                           fillcolor=f"rgba(0,0,0,{min(0.08 * (blk.ref_count - 1), 0.4):.2f})",
                           layer="above", name=f"shared {blk.block_id}"))
    for src, dst in snap.event.copies:
        sx0, sx1, sy = block_cells(src, nb, bs)
        dx0, dx1, dy = block_cells(dst, nb, bs)
        notes.append(dict(xref="x", yref="y", axref="x", ayref="y", x=(dx0 + dx1) / 2, y=dy,
                          ax=(sx0 + sx1) / 2, ay=sy, text="", showarrow=True, arrowhead=3, arrowsize=1.3,
                          arrowwidth=2.5, arrowcolor=COPY_COLOR, name=f"copy {src}->{dst}"))
        notes.append(dict(xref="x", yref="y", x=(dx0 + dx1) / 2, y=dy, yshift=-14, showarrow=False,
                          text=f"<b>copy-on-write {src} → {dst}</b>", font=dict(size=11, color=COPY_COLOR),
                          bgcolor="rgba(255,255,255,0.85)", name=f"copy label {src}->{dst}"))
    return shapes, notes


def sharing_figure(snapshots: Sequence, title: str = "", active: int | None = None, replay: bool = True,
                   height: int | None = None) -> go.Figure:
    """The block layout of ``snapshots`` (a :class:`~paged_kv.blocks.BlockHistory`'s) with the
    sharing overlays, a slider over the snapshots and a play button (static book), or one snapshot
    (``replay=False``, the live panel).  Arguments as :func:`paged_kv.viz.blocks.blocks_figure`."""
    snapshots = list(snapshots)
    active = len(snapshots) - 1 if active is None else active
    fig = blocks_figure(snapshots, title=title, active=active, replay=replay, height=height, key=SHARING_KEY)
    base_notes = [a.to_plotly_json() for a in fig.layout.annotations]        # the panel titles
    shapes, notes = sharing_overlay(snapshots[active])
    fig.update_layout(shapes=shapes, annotations=base_notes + notes)
    for frame, snap in zip(fig.frames, snapshots):
        shapes, notes = sharing_overlay(snap)
        frame.layout.shapes = shapes
        frame.layout.annotations = base_notes + notes
    return fig


def refresh_sharing_figure(fig, snapshots: Sequence, title: str = "") -> None:
    """Redraw a :func:`sharing_figure` made with ``replay=False`` (e.g. a ``FigureWidget``) in place
    to show the last of ``snapshots``."""
    snapshots = list(snapshots)
    base_notes = [a.to_plotly_json() for a in fig.layout.annotations
                  if not str(a.name or "").startswith("copy")]
    refresh_blocks_figure(fig, snapshots, title, SHARING_KEY)
    shapes, notes = sharing_overlay(snapshots[-1])
    with fig.batch_update():
        fig.layout.shapes = shapes
        fig.layout.annotations = base_notes + notes


def savings_figure(rows: Sequence[Mapping], title: str = "") -> go.Figure:
    """Paired horizontal bars per (mode, width): our memory saving beside the paper's, one panel per
    trace, the panels stacked.

    ``rows``: dicts with ``trace``, ``mode`` ("parallel" or "beam"), ``width``, ``ours`` (a share)
    and ``paper`` (a share, or ``None`` where the paper prints no single value: that bar is left
    out and its label says so).  Horizontal bars, so that every bar's number has a row of its own
    to the right of the bar: as vertical bars, twelve to a panel, the labels of neighbours ran into
    each other at any width; stacked panels, so that the figure fits a phone.
    """
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    fig = make_subplots(rows=len(traces), cols=1, subplot_titles=traces, shared_xaxes=True,
                        vertical_spacing=0.14 if len(traces) > 1 else 0.0)
    for note in fig.layout.annotations:                          # panel titles, left-aligned
        note.update(x=0, xanchor="left", font=dict(size=13))
    for c, name in enumerate(traces, start=1):
        sub = [r for r in rows if r["trace"] == name]
        y = [f"{'n' if r['mode'] == 'parallel' else 'k'}={r['width']} {r['mode']}" for r in sub]
        fig.add_trace(go.Bar(y=y, x=[100 * r["ours"] for r in sub], name="ours", marker_color=COLORS[0],
                             orientation="h", text=[f"{100 * r['ours']:.1f}%" for r in sub], textposition="outside",
                             cliponaxis=False, showlegend=c == 1, legendgroup="ours"), row=c, col=1)
        fig.add_trace(go.Bar(y=y, x=[0 if r["paper"] is None else 100 * r["paper"] for r in sub],
                             name="paper (§6.3)", marker_color=COLORS[1], orientation="h", showlegend=c == 1,
                             legendgroup="paper", cliponaxis=False,
                             text=["no single value" if r["paper"] is None else f"{100 * r['paper']:.1f}%" for r in sub],
                             hovertemplate="paper (§6.3), %{y}: %{text}<extra></extra>",
                             textposition="outside"), row=c, col=1)
        fig.update_yaxes(autorange="reversed", row=c, col=1)     # the first row at the top
    top = max([100 * r["ours"] for r in rows] + [100 * (r["paper"] or 0) for r in rows])
    fig.update_xaxes(range=[0, top * 1.3], showgrid=True, gridcolor="#e5e5e5")
    fig.update_xaxes(title_text="memory saved by sharing (%)", row=len(traces), col=1)
    bars = max(len([r for r in rows if r["trace"] == name]) for name in traces)
    head = wrap_title(title)
    extra = 18 * head.count("<br>")                              # room for a title broken for a phone
    fig.update_layout(barmode="group", bargap=0.25, bargroupgap=0.05,
                      height=130 + extra + len(traces) * (36 * bars + 40),
                      title=dict(text=head, x=0.01, font=dict(size=14)),
                      uniformtext=dict(minsize=10, mode="show"), plot_bgcolor="white",
                      margin=dict(l=10, r=20, t=70 + extra, b=60),
                      legend=dict(orientation="h", x=0, y=-0.04 * 3, yanchor="top", traceorder="normal"))
    fig.update_yaxes(automargin=True)
    return fig


def latency_figure(curves: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
                   title: str = "", cap: float | None = None,
                   marks: Mapping[str, Mapping[str, float]] | None = None, cols: int | None = None) -> go.Figure:
    """Normalized latency (s per output token) against request rate, one panel per workload.

    ``curves[panel][system] = (rates, latencies)``, with the same system names in every panel
    (:func:`~paged_kv.sim.latency_sweep`'s): a system has one colour in every panel
    (:data:`SYSTEM_COLORS`, then the palette in order of first appearance) and one entry in a
    legend below the panels.  ``marks[panel][system]``: a rate (req/s) drawn as a dotted vertical
    line in the system's colour (e.g. :func:`~paged_kv.sim.sustained_rate`).  ``cap`` clips the y
    axis (a latency that grows without bound past the knee); ``cols`` panels per row (default up
    to 3), filled row by row.
    """
    panels = list(curves)
    cols = min(3, len(panels)) if cols is None else cols
    nrows = -(-len(panels) // cols)
    fig = make_subplots(rows=nrows, cols=cols, subplot_titles=panels, horizontal_spacing=0.1,
                        vertical_spacing=0.12 if nrows > 1 else 0.0)
    for k, note in enumerate(fig.layout.annotations):           # panel titles: over their own panel,
        axis = fig.layout["xaxis" if k == 0 else f"xaxis{k + 1}"]   # from its left edge, clear of the top tick
        note.update(x=axis.domain[0], xanchor="left", yshift=8, font=dict(size=12))
    systems = list(dict.fromkeys(s for panel in curves.values() for s in panel))
    spare = (c for c in map(seq_color, itertools.count()) if c not in SYSTEM_COLORS.values())
    color = {s: SYSTEM_COLORS.get(s) or next(spare) for s in systems}
    shown = set()
    for i, panel in enumerate(panels):
        r, c = divmod(i, cols)
        for system, (rates, lat) in curves[panel].items():
            fig.add_trace(go.Scatter(x=list(rates), y=list(lat), mode="lines+markers", name=system,
                                     legendgroup=system, showlegend=system not in shown, marker=dict(size=5),
                                     line=dict(color=color[system]),
                                     hovertemplate=f"{system}<br>%{{x:.3g}} req/s: %{{y:.3f}} s/token<extra></extra>"),
                          row=r + 1, col=c + 1)
            shown.add(system)
        for system, rate in (marks or {}).get(panel, {}).items():
            fig.add_vline(x=rate, line=dict(color=color.get(system, "#777"), dash="dot", width=2), row=r + 1, col=c + 1)
        fig.update_yaxes(range=[0, cap] if cap else None, row=r + 1, col=c + 1)
        if r == nrows - 1 or i + cols >= len(panels):
            fig.update_xaxes(title_text="request rate (req/s)", row=r + 1, col=c + 1)
    if marks:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="rate it sustains (dotted)",
                                 line=dict(color="#777", dash="dot", width=2), hoverinfo="skip"))
    for r in range(nrows):
        fig.update_yaxes(title_text="s/token", row=r + 1, col=1)
    head = wrap_title(title)
    fig.update_layout(height=260 * nrows + 150 + 18 * head.count("<br>"), title=dict(text=head, x=0.01, font=dict(size=14)),
                      margin=dict(l=60, r=20, t=80 + 18 * head.count("<br>"), b=110),
                      legend=dict(orientation="h", x=0, y=-0.07 * 3 / max(nrows, 1), yanchor="top"))
    return fig
