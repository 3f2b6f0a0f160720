"""The vLLM paper's own view of Figures 6 and 7 (§4.3): logical blocks, block table, physical blocks.

For every request that exists in a snapshot: its tokens in **logical blocks** (left, one row per
logical block, the words in their slots), its **block table** (middle: the physical block number
and the paper's "# filled" column) and an arrow from each logical block to the **physical block**
that holds it (right: the pool, one row per physical block, free ones grey).  A request that has
finished has no rows.  One plotly frame per snapshot, with a slider (works in the static book).

Pure function of :class:`~paged_kv.blocks.Snapshot` lists (``BlockHistory.snapshots``); the pool
drawing of :mod:`paged_kv.viz.blocks` shows the same state slot by slot.

The words are the text of transparent bars, one per slot, because plotly shrinks a bar's inside
text to fit the bar: at 400 px a slot is ~20 px wide, and a fixed 10-px word ran into the next
("Fourscoreandseven") or lost its ends ("rought").  A word longer than :data:`LINE_CHARS`
characters is set on two lines, so that it shrinks less.
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from ..errors import ConfigError
from .blocks import EMPTY_TINT, seq_order
from .controls import add_replay_controls, frame_steps
from .labels import visible_token
from .palette import DISTINCT_COLORS, FREE_COLOR, seq_color, tint

__all__ = ["logical_view_figure", "logical_view_parts"]

GAP = 3.0          # columns between the table and the pool, where the arrows run
LINE_CHARS = 5     # a slot's word longer than this is set on two lines ("brou" over "ght")


def _columns(bs: int) -> dict:
    """x of the first slot of each part: logical slots, table (physical, # filled), pool slots."""
    table = bs + 0.4
    pool = table + 2 + GAP
    return {"logical": 0.0, "physical": table, "filled": table + 1, "pool": pool}


def logical_view_parts(snap, order: Sequence) -> dict:
    """The drawing of one snapshot as plain data: ``cells`` ``(x, y, colour, text)``, ``arrows``
    ``(x0, y0, x1, y1)`` and ``labels`` ``(x, y, text)`` or ``(x, y, text, textposition)``; rows of requests stack downwards in
    ``order`` (colours follow ``order`` too), each under a "request X" heading."""
    bs = snap.block_size
    col = _columns(bs)
    index = {s: k for k, s in enumerate(order)}
    cells, arrows, labels = [], [], []
    # the two column heads on two lines, so they do not run into each other on a phone-wide page
    labels += [(col["physical"] + 0.5, -1.45, "<b>block table</b>"), (col["physical"], -1.0, "physical"),
               (col["filled"], -0.6, "# filled"), (col["pool"] + bs / 2 - 0.5, -0.6, "<b>physical blocks</b>")]
    y = 0.0
    for s in order:
        if s not in snap.tables:
            continue
        colour = seq_color(index[s])
        labels.append((col["logical"] + bs / 2 - 0.5, y - 0.2, f"<b>request {s}</b>: logical blocks"))
        y += 0.5
        for logical, physical, filled in snap.tables[s]:
            # a shared block holds the same tokens for every table that holds it (a fork shares the
            # prompt's blocks; a write copies first), so each sharer's row shows them, not only the owner's
            words = snap.blocks[physical].labels[:filled]
            for o in range(bs):
                text = visible_token(words[o]) if o < len(words) else ""
                cells.append((col["logical"] + o, y, colour if o < filled else tint(colour, EMPTY_TINT), text))
            labels.append((col["logical"] - 0.5, y, f"{logical}", "middle left"))
            refs = snap.blocks[physical].ref_count        # a shared block reads "7 ×2", as in the pool view
            cells.append((col["physical"], y, "white", str(physical) + (f" ×{refs}" if refs > 1 else "")))
            cells.append((col["filled"], y, "white", str(filled)))
            arrows.append((col["filled"] + 0.55, y, col["pool"] - 0.55, float(physical)))
            y += 1
        y += 0.3
    for blk in snap.blocks:
        owner = blk.owner
        colour = FREE_COLOR if owner is None else seq_color(index[owner])
        for o in range(bs):
            full = owner is not None and o < blk.filled
            fill = colour if full or owner is None else tint(colour, EMPTY_TINT)
            cells.append((col["pool"] + o, float(blk.block_id), fill,
                          visible_token(blk.labels[o]) if o < len(blk.labels) else ""))
        labels.append((col["pool"] + bs - 0.45, float(blk.block_id), f"block {blk.block_id}", "middle right"))
    return {"cells": cells, "arrows": arrows, "labels": labels, "rows": max(y, snap.num_blocks)}


def slot_word(text: str) -> str:
    """A slot's word as drawn: on two lines (``<br>``) when longer than :data:`LINE_CHARS`."""
    if len(text) <= LINE_CHARS:
        return text
    cut = -(-len(text) // 2)
    return text[:cut] + "<br>" + text[cut:]


CELL_W, CELL_H = 0.94, 0.84   # a cell's width and height in axis units (a slot is 1 x 1)


def _frame(parts: dict):
    """(traces, shapes, annotations) of one snapshot's parts."""
    shapes = [dict(type="rect", x0=x - CELL_W / 2, x1=x + CELL_W / 2, y0=y - CELL_H / 2, y1=y + CELL_H / 2,
                   fillcolor=fill, line=dict(color="#999", width=1), layer="below")
              for x, y, fill, _ in parts["cells"]]
    texts = [c for c in parts["cells"] if c[3]]
    full = {seq_color(k) for k in range(DISTINCT_COLORS)}
    ink = ["white" if c[2] in full else "#222" for c in texts]     # white on the full colours
    # one transparent bar per word, exactly over its cell: plotly fits a bar's inside text to the bar
    words = go.Bar(orientation="h", base=[c[0] - CELL_W / 2 for c in texts], x=[CELL_W] * len(texts),
                   y=[c[1] for c in texts], width=CELL_H, text=[slot_word(c[3]) for c in texts],
                   textposition="inside", insidetextanchor="middle", textangle=0,
                   textfont=dict(size=10, color=ink), marker=dict(color="rgba(0,0,0,0)", line=dict(width=0)),
                   hoverinfo="skip", name="words")
    labs = parts["labels"]
    heads = go.Scatter(x=[lab[0] for lab in labs], y=[lab[1] for lab in labs], text=[lab[2] for lab in labs],
                       textposition=[lab[3] if len(lab) > 3 else "middle center" for lab in labs],
                       mode="text", textfont=dict(size=10, color="#333"), hoverinfo="skip", name="labels",
                       cliponaxis=False)
    arrows = [dict(x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y", showarrow=True,
                   arrowhead=2, arrowsize=1, arrowwidth=1.3, arrowcolor="#555", text="")
              for x0, y0, x1, y1 in parts["arrows"]]
    return [words, heads], shapes, arrows


def _caption(snap, title: str) -> str:
    head = f"{title}<br>" if title else ""
    what = snap.event.text or "every block is free"
    return head + f"<sup>step {snap.step}: {what}</sup>"


def logical_view_figure(snapshots: Sequence, title: str = "", height: int | None = None,
                        replay: bool = True) -> go.Figure:
    """Logical blocks → block table → physical blocks for each snapshot, with a slider.

    ``replay=False`` (the live panels) draws the last snapshot alone, with no frames and no slider;
    colours and the height still follow every snapshot, so they stay put as requests come and go.

    Raises:
        ConfigError: no snapshots.
    """
    snapshots = list(snapshots)
    if not snapshots:
        raise ConfigError("no snapshots to draw")
    order = seq_order(snapshots)
    parts = [logical_view_parts(s, order) for s in snapshots]
    bs = snapshots[-1].block_size
    col = _columns(bs)
    rows = max(p["rows"] for p in parts)
    traces, shapes, arrows = _frame(parts[-1])
    fig = go.Figure(traces)
    fig.update_layout(shapes=shapes, annotations=arrows, title=dict(text=_caption(snapshots[-1], title), x=0.01,
                                                                      font=dict(size=14)),
                      height=height or int(34 * (rows + 2) + 160), margin=dict(l=10, r=10, t=70, b=60),
                      plot_bgcolor="white", showlegend=False)
    fig.update_xaxes(visible=False, range=[-1.2, col["pool"] + bs + 1.6])
    fig.update_yaxes(visible=False, range=[rows + 0.2, -1.8])
    if not replay:
        return fig
    frames = []
    for snap, p in zip(snapshots, parts):
        data, shp, arr = _frame(p)
        frames.append(go.Frame(name=str(snap.step), data=data, traces=[0, 1],
                               layout=go.Layout(shapes=shp, annotations=arr, title_text=_caption(snap, title))))
    fig.frames = frames
    if len(snapshots) > 1:
        add_replay_controls(fig, frame_steps([str(s.step) for s in snapshots]), len(snapshots) - 1,
                            currentvalue=dict(prefix="step ", xanchor="right"), frame_ms=1200,
                            slider=dict(x=0.1, len=0.9))
    return fig
