"""The physical block pool and the block tables, drawn from recorded snapshots (chapter 5).

Left panel: the pool, one row of ``BS`` slots per physical block (as the vLLM paper's Figures
6-7 draw it).  Colour = the sequence holding the block; a slot holding a token is drawn in the
full colour, an allocated but still empty slot in a pale tint of it (it takes the sequence's
next tokens; once the sequence has finished it is internal fragmentation), a free block in grey.  Each block is labelled ``id ×ref count``; hovering a slot tells
block id, slot, owner, logical index and the block's token range.  A slot shows its token's text
through :func:`~paged_kv.viz.labels.visible_token` (a space ``␣``, a newline ``⏎``); words are
sized to fit their slots, and the block labels sit in the left margin, so a phone-wide figure
keeps every word whole (:func:`slot_text_size`, :func:`label_margin`).  Right panel: the block table
of each sequence that exists in the snapshot shown (a finished one's row goes away), logical block
-> physical id; a table longer than :data:`TABLE_COLS` entries wraps onto more rows, each labelled
with the logical index it starts at (``"2 +5"``), so that two-digit ids keep a cell each on a phone.

Pure functions of :class:`~paged_kv.blocks.Snapshot` lists: :func:`blocks_figure` replays a
whole history with plotly frames and a slider (works in the static book with no kernel);
:func:`block_traces` gives one snapshot's traces, which the live widget writes into a
``FigureWidget`` in place.  :func:`block_size_figure` draws the block-size trade-off (waste
vs table size) from measured numbers.
"""

from __future__ import annotations

import math
import textwrap
from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .controls import add_replay_controls, frame_steps, trace_indices
from .labels import visible_token
from .palette import COLORS, FREE_COLOR, discrete_scale, seq_color, tint

# Subplot titles of blocks_figure: two short lines each, anchored at the left edge of their own
# panel, so they cannot run into each other however narrow the page is.
PANEL_TITLES = ("<b>physical KV blocks</b><br>id ×ref count", "<b>block tables</b><br>logical → physical")

# The traces block_traces makes, in order: found by these names, never by position.
TRACE_NAMES = ("pool", "block labels", "block tables")

MAX_ROWS = 24   # blocks per column of the pool grid before it wraps into another column: one column
               # for the book's pools, so a two-digit id keeps room to its left even on a phone


EMPTY_TINT = 0.72  # share of white in the pale tint of an allocated, still empty slot
RESERVED_TINT = 0.42  # share of white in the mid tint of a reserved slot: its token is known, its K/V
                      # not computed yet (the serving engine's chunked prefill, block_traces' computed)

LABEL_GAP = 0.55   # a block's label is anchored this many cells left of its first slot's centre

TEXT_SIZE = 11     # px of a slot's text while every label is a character or two
SHORT_LABEL = 2    # longer labels (words): plotly sizes the text to fit (see slot_text_size)

TABLE_COLS = 5     # block-table entries per row: at 400 px the table panel is ~95 px wide, and five
                   # cells of 17 px hold a two-digit id at 11 px (18 entries in one row overlapped,
                   # "2221201918", at 1280 px too)

TITLE_CHARS = 46   # a heading longer than this wraps: about what a 14-px line holds on a phone
TITLE_LINE_PX = 18


def seq_order(snapshots: Sequence) -> list:
    """Sequence ids in order of first appearance: sequence ``k`` is drawn in
    ``seq_color(k)``."""
    order: list = []
    for snap in snapshots:
        for s in snap.tables:
            if s not in order:
                order.append(s)
    return order


def _colorscale(num_seqs: int, reserved: bool = False) -> tuple[list, int]:
    """A discrete colorscale: z = 0 free; 1 + 2k filled slot of seq k; 2 + 2k allocated, empty slot;
    with ``reserved``, also 1 + 2n + k (n sequences) a reserved slot of seq k (after the others, so
    a figure without reserved slots keeps its values)."""
    colors = [FREE_COLOR]
    for k in range(num_seqs):
        colors += [seq_color(k), tint(seq_color(k), EMPTY_TINT)]
    if reserved:
        colors += [tint(seq_color(k), RESERVED_TINT) for k in range(num_seqs)]
    return discrete_scale(colors), len(colors)


def _grid(num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
    """(blocks per column, columns of blocks, cells per block column, label cells before a block)."""
    rows = min(num_blocks, MAX_ROWS)
    digits = len(str(max(num_blocks - 1, 0)))
    label = max(1 + block_size // 6, 2 + digits)   # room for "12 ×2" left of the block's slots
    return rows, math.ceil(num_blocks / rows), block_size + label + 1, label


def label_margin(num_blocks: int) -> int:
    """Pixels left of the pool for the first column's block labels (``"12 ×3"`` at 11 px).

    The labels sit in the figure's margin, not in cells of the grid: a margin keeps its width in
    pixels however narrow the figure is, so on a phone-wide page the slots get the rest of the
    panel (cells of the grid would shrink with it, and the slots with them)."""
    digits = len(str(max(num_blocks - 1, 0)))
    return 10 + 7 * (digits + 3)


def slot_text_size(snapshots: Sequence) -> int | None:
    """The font size of the slots' text for a figure of ``snapshots``: :data:`TEXT_SIZE` while no
    label is longer than :data:`SHORT_LABEL` characters (one fits any cell), else ``None``, which
    leaves the size to plotly: it fits the longest label into the narrowest cell (at most the
    layout's 12 px), so a word is smaller on a phone but never cut off (at a fixed 11 px a word
    was wider than its slot at 400 px and lost its ends).  One size for all of a figure's frames."""
    longest = max([len(x) for snap in snapshots for blk in snap.blocks for x in blk.labels] + [0])
    return TEXT_SIZE if longest <= SHORT_LABEL else None


def _heading(title: str) -> tuple[str, int]:
    """``title`` wrapped to lines of :data:`TITLE_CHARS` (plotly does not wrap a title; a long
    one ran off the right edge of a phone-wide figure), as the first lines of the figure's title,
    and how many lines past the first it takes."""
    if not title:
        return "", 0
    lines = textwrap.wrap(title, TITLE_CHARS) or [title]
    return "<br>".join(lines) + "<br>", len(lines) - 1


def block_cells(block_id: int, num_blocks: int, block_size: int) -> tuple[float, float, int]:
    """Where :func:`block_traces` draws physical block ``block_id`` in the pool panel: its first
    and last slot's x (cell centres) and its row y.  Overlays (:mod:`paged_kv.viz.sharing`) use it
    to frame a block."""
    rows, _, width, label = _grid(num_blocks, block_size)
    x0 = (block_id // rows) * width + label
    return x0, x0 + block_size - 1, block_id % rows


def _token_range(logical: int, filled: int, block_size: int) -> str:
    start = logical * block_size
    return f"{start}" if filled == 1 else f"{start}-{start + filled - 1}"


def reserved_tokens(blk, computed: Mapping, block_size: int) -> int:
    """How many of block ``blk``'s stored tokens are *reserved* (their K/V not computed yet): those at
    or past its owner's count in ``computed`` (``{sequence: tokens with K/V}``; an owner missing
    from it has all of its tokens computed)."""
    if not blk.ref_count or blk.owner not in computed:
        return 0
    start = blk.logical * block_size
    return max(0, min(blk.filled, start + blk.filled - computed[blk.owner]))


def block_traces(snap, order: Sequence, max_logical: int | None = None,
                 text_size: int | None = TEXT_SIZE, computed: Mapping | None = None) -> list:
    """The three traces of one snapshot: pool heatmap, block labels, block-table heatmap.

    ``order``: all sequence ids to give colours to (see :func:`seq_order`); the table has a row
    for each of them that exists in ``snap``, in that order.
    ``max_logical``: table columns (default: the longest table in ``snap``).
    ``text_size``: px of the slots' text, ``None`` to let plotly fit it (:func:`slot_text_size`).
    ``computed``: per sequence, the tokens whose K/V is in the cache (a serving engine's
    :attr:`StepRecord.computed <paged_kv.engine.StepRecord.computed>`); a stored token at or past it
    is drawn *reserved*, in a mid tint (:data:`RESERVED_TINT`) between the full colour of a slot
    holding K/V and the pale one of an empty slot.  ``None``: every stored token holds K/V (the
    block manager's own histories, which write a token's K/V when they store it).
    Token labels are drawn through :func:`~paged_kv.viz.labels.visible_token` (a space is ``␣``).
    """
    bs, nb = snap.block_size, snap.num_blocks
    rows, cols, width, label = _grid(nb, bs)
    index = {s: k for k, s in enumerate(order)}
    n = len(order)
    z = [[None] * (cols * width) for _ in range(rows)]
    text = [[""] * (cols * width) for _ in range(rows)]
    hover = [[""] * (cols * width) for _ in range(rows)]
    lx, ly, ltext = [], [], []
    for blk in snap.blocks:
        r, c = blk.block_id % rows, blk.block_id // rows
        x0 = c * width + label
        lx.append(x0 - LABEL_GAP)
        ly.append(r)
        ltext.append(f"<b>{blk.block_id}</b> ×{blk.ref_count}" if blk.ref_count else f"{blk.block_id}")
        for o in range(bs):
            slot = blk.block_id * bs + o
            if blk.ref_count == 0:
                z[r][x0 + o] = 0
                hover[r][x0 + o] = f"block {blk.block_id}, slot {slot}<br>free (ref count 0)"
                continue
            k = index[blk.owner]
            pos = blk.logical * bs + o
            reserved = computed is not None and o < blk.filled and pos >= computed.get(blk.owner, pos + 1)
            z[r][x0 + o] = 1 + 2 * n + k if reserved else 1 + 2 * k + (o >= blk.filled)
            holders = ", ".join(f"{s} (logical {lg})" for s, lg in blk.holders)
            rng = _token_range(blk.logical, blk.filled, bs)
            tok = (f"token {pos}" + (f" {blk.labels[o]!r}" if o < len(blk.labels) else "")
                   + (": reserved, its K/V not computed yet" if reserved else "")
                   if o < blk.filled else "allocated, still empty")
            hover[r][x0 + o] = (f"block {blk.block_id}, slot {slot} (offset {o})<br>owner: {holders}"
                                f"<br>tokens {rng} of {blk.owner}, {blk.filled}/{bs} filled"
                                f"<br>ref count {blk.ref_count}<br>{tok}")
            if o < len(blk.labels):
                text[r][x0 + o] = visible_token(blk.labels[o])
    scale, ncat = _colorscale(n, reserved=computed is not None)
    common = dict(colorscale=scale, zmin=-0.5, zmax=ncat - 0.5, showscale=False, xgap=2, ygap=4,
                  hoverongaps=False, texttemplate="%{text}", textfont=dict(size=text_size))
    pool = go.Heatmap(z=z, text=text, customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                      name="pool", **common)
    labels = go.Scatter(x=lx, y=ly, text=ltext, mode="text", textposition="middle left", name="block labels",
                        hoverinfo="skip", showlegend=False, textfont=dict(size=11, color="#333"),
                        cliponaxis=False)
    # block tables: a row per sequence of this snapshot (in `order`) and per TABLE_COLS entries of it
    present = [s for s in order if s in snap.tables]
    longest = max_logical or max([len(t) for t in snap.tables.values()] + [1])
    width_t = min(longest, TABLE_COLS)
    ty, tz, ttext, thover = [], [], [], []
    for s in present:
        k = index[s]
        entries = [e for e in snap.tables[s] if e[0] < longest]
        for start in range(0, max(len(entries), 1), TABLE_COLS):
            ty.append(table_row_label(s, start))
            tz.append([None] * width_t)
            ttext.append([""] * width_t)
            thover.append([""] * width_t)
            for logical, physical, filled in entries[start:start + TABLE_COLS]:
                col = logical - start
                tz[-1][col] = 1 + 2 * k + (filled < bs)
                ttext[-1][col] = str(physical)
                thover[-1][col] = (f"request {s}: logical {logical} → physical {physical}<br>"
                                   f"tokens {_token_range(logical, filled, bs)}, {filled}/{bs} filled")
    tables = go.Heatmap(z=tz or [[None]], text=ttext or [[""]], customdata=thover or [[""]],
                        hovertemplate="%{customdata}<extra></extra>", name="block tables",
                        x=list(range(width_t)), y=ty or [""], **common)
    return [pool, labels, tables]


def table_row_label(seq_id, start: int) -> str:
    """The y label of a block-table row: the sequence id on its first row, ``"id +start"`` on the
    rows a long table wraps onto (``start``: the logical index of the row's first entry)."""
    return str(seq_id) if start == 0 else f"{seq_id} +{start}"


def table_rows(snap, max_logical: int | None = None) -> int:
    """How many rows the block-table panel takes for ``snap`` (wrapped at :data:`TABLE_COLS`)."""
    longest = max_logical or max([len(t) for t in snap.tables.values()] + [1])
    return sum(max(1, math.ceil(min(len(t), longest) / TABLE_COLS)) for t in snap.tables.values())


#: pixels per line of a caption's small type (plotly's <sup> under a 14 px title)
CAPTION_LINE_PX = 17

#: the colour key under each step's caption (a figure with more marks, chapter 6's, extends it)
KEY = "full colour: a stored token, pale: allocated and empty, grey: free"


def _caption(snap, key: str = KEY) -> str:
    """Title lines of one snapshot: "step N: request X:" in the title's size, what happened and the
    key in small type below (short lines, so a phone-wide figure does not cut them off).  Before
    any event the heading says so ("step 0: every block is free")."""
    used, nb = snap.used_blocks, snap.num_blocks
    what = snap.event.text
    if not what:
        return f"step {snap.step}: every block is free<br><sup>{used}/{nb} blocks used<br>{key}</sup>"
    who, _, detail = what.partition(": ")
    return (f"step {snap.step}: {who}:<br><sup>{detail}<br>{used}/{nb} blocks used, {snap.wasted_slots} "
            f"allocated slots empty<br>{key}</sup>")


def _frame_layout(fig, snapshots: Sequence, shown, title: str, key: str = KEY) -> tuple[list, int]:
    """Set the title and axes for showing ``shown`` out of ``snapshots``; returns (order, max_logical)."""
    order = seq_order(snapshots)
    max_logical = max([len(t) for s in snapshots for t in s.tables.values()] + [1])
    most = max([table_rows(s, max_logical) for s in snapshots] + [1])   # table rows ever shown at once
    rows, cols, width, label = _grid(shown.num_blocks, shown.block_size)
    head, extra = _heading(title)
    # room for the tallest caption of any frame (a longer key, chapter 6's, adds lines) and the
    # panels' titles below it: a fixed 140 px let a six-line caption run into them
    lines = max(_caption(s, key).count("<br>") for s in snapshots)
    fig.update_layout(title=dict(text=head + _caption(shown, key), x=0.01, font=dict(size=14), yref="container",
                                 y=1, yanchor="top", pad=dict(t=12)),
                      margin=dict(l=label_margin(shown.num_blocks), r=20,
                                  t=max(140, 64 + CAPTION_LINE_PX * lines) + TITLE_LINE_PX * extra, b=60))
    # the range starts just left of the first column's labels' anchors (plotly hides a text whose
    # anchor is outside the range); the labels' text runs on into the margin
    fig.update_xaxes(row=1, col=1, visible=False, range=[label - LABEL_GAP - 0.03, cols * width - 1.5])
    fig.update_yaxes(row=1, col=1, visible=False, autorange="reversed")
    # a tick per column; a wrapped table's rows say where they start ("2 +5") and its columns are
    # offsets from there ("+3"), so that row + column is the logical block
    cols_t = min(max_logical, TABLE_COLS)
    wrapped = max_logical > TABLE_COLS
    fig.update_xaxes(row=1, col=2, title_text="logical block", tickvals=list(range(cols_t)),
                     ticktext=[f"+{c}" if wrapped else str(c) for c in range(cols_t)],
                     tickangle=0, range=[-0.5, cols_t - 0.5], showgrid=False, zeroline=False)
    # one table row as tall as one pool row, so a table lines up with the blocks it points to; the
    # range is fixed, so rows keep their height as requests come and go
    fig.update_yaxes(row=1, col=2, autorange=False, range=[most - 0.5, -0.5], type="category", showgrid=False,
                     domain=[1 - min(1.0, most / rows), 1])
    return order, max_logical


def blocks_figure(snapshots: Sequence, title: str = "", active: int | None = None,
                  replay: bool = True, height: int | None = None, key: str = KEY) -> go.Figure:
    """The pool and block tables of ``snapshots[active]``, with a slider over all snapshots.

    Args:
        snapshots: e.g. ``BlockHistory.snapshots`` (colours follow first appearance in them).
        title: a heading shown above each step's caption.
        active: the snapshot shown first (default: the last).
        replay: add a plotly frame per snapshot, a slider and a play button (static book); with
            ``False`` (or one snapshot) the figure shows ``snapshots[active]`` only.
        height: in pixels; default from the number of pool rows.
        key: the colour key under each caption (default :data:`KEY`).
    """
    snapshots = list(snapshots)
    active = len(snapshots) - 1 if active is None else active
    shown = snapshots[active]
    rows = _grid(shown.num_blocks, shown.block_size)[0]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.66, 0.34], horizontal_spacing=0.08,
                        subplot_titles=PANEL_TITLES)
    for note, axis in zip(fig.layout.annotations, ("x", "x2")):   # left-align over each panel
        note.update(x=fig.layout["xaxis" if axis == "x" else "xaxis2"].domain[0], xanchor="left",
                    align="left", font=dict(size=12))
    # the pool's title starts over its block labels, in the margin
    fig.layout.annotations[0].xshift = -label_margin(shown.num_blocks) + 10
    order, max_logical = _frame_layout(fig, snapshots, shown, title, key)
    size = slot_text_size(snapshots)
    for i, trace in enumerate(block_traces(shown, order, max_logical, size)):
        fig.add_trace(trace, row=1, col=1 if i < 2 else 2)
    fig.update_layout(height=height or max(360, 28 * rows + 210), plot_bgcolor="white", showlegend=False)
    if replay and len(snapshots) > 1:
        head = _heading(title)[0]
        traces = trace_indices(fig, TRACE_NAMES)   # the order block_traces returns them in
        fig.frames = [go.Frame(name=str(s.step), data=block_traces(s, order, max_logical, size), traces=traces,
                               layout=go.Layout(title_text=head + _caption(s, key))) for s in snapshots]
        steps = frame_steps([str(s.step) for s in snapshots])
        add_replay_controls(fig, steps, active, currentvalue=dict(prefix="step ", suffix=f" / {snapshots[-1].step}",
                                                                  xanchor="right"),
                            frame_ms=900, slider=dict(x=0.08, len=0.9))
    return fig


def refresh_blocks_figure(fig, snapshots: Sequence, title: str = "", key: str = KEY) -> None:
    """Redraw ``fig`` (made by :func:`blocks_figure` with ``replay=False``) in place to show the last
    of ``snapshots``: the live widget calls this on a ``go.FigureWidget`` after every event."""
    snapshots = list(snapshots)
    with fig.batch_update():
        order, max_logical = _frame_layout(fig, snapshots, snapshots[-1], title, key)
        new = block_traces(snapshots[-1], order, max_logical, slot_text_size(snapshots))
        for i, trace in zip(trace_indices(fig, TRACE_NAMES), new):
            fig.data[i].update(trace.to_plotly_json())


def block_size_figure(sizes: Sequence[int], empty_share: Sequence[float], table_entries: Sequence[float],
                      title: str = "Block size: memory wasted vs block-table size") -> go.Figure:
    """The block-size trade-off in two stacked panels sharing a log block-size axis.

    Args:
        sizes: block sizes (tokens), e.g. ``[1, 2, 4, ..., 256]``.
        empty_share: per size, allocated-but-empty slots as a percentage of allocated slots
            (0 at block size 1, so its axis is linear).
        table_entries: per size, mean block-table entries per sequence (always >= 1, spanning
            orders of magnitude, so its axis is logarithmic).

    Two panels, not one axis, because a percentage and a count share no unit.
    """
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=("<b>memory wasted</b>: empty slots, % of allocated",
                                        "<b>table size</b>: block-table entries per sequence"))
    for note in fig.layout.annotations:
        note.update(x=0, xanchor="left", align="left", font=dict(size=12))
    fig.add_trace(go.Scatter(x=list(sizes), y=list(empty_share), mode="lines+markers", name="empty slots (%)",
                             line=dict(color=COLORS[0]), hovertemplate="BS=%{x}: %{y:.2f}% empty<extra></extra>"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=list(sizes), y=list(table_entries), mode="lines+markers", name="table entries",
                             line=dict(color=COLORS[1]),
                             hovertemplate="BS=%{x}: %{y:.1f} entries per sequence<extra></extra>"),
                  row=2, col=1)
    fig.update_xaxes(type="log", tickvals=list(sizes), ticktext=[str(x) for x in sizes])
    fig.update_xaxes(title_text="block size (tokens per block, log scale)", row=2, col=1)
    fig.update_yaxes(title_text="% of allocated slots", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="entries (log scale)", type="log", row=2, col=1,
                     tickvals=[1, 3, 10, 30, 100, 300, 1000, 3000, 10000])
    fig.update_layout(title=dict(text=title, x=0.01, font=dict(size=14)), height=560, showlegend=False,
                      margin=dict(l=70, r=20, t=90, b=60), plot_bgcolor="white")
    fig.update_xaxes(showgrid=True, gridcolor="#e5e5e5")
    fig.update_yaxes(showgrid=True, gridcolor="#e5e5e5")
    return fig
