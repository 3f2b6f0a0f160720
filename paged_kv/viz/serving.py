"""The serving engine step by step: its queues and its block pools (chapter 7).

Three panels, from the engine's :class:`~paged_kv.engine.StepRecord` list: the **queues**
(waiting, running, swapped; one box per request, labelled with its progress), the **GPU block
pool** (as chapter 5 draws it, colour = the sequence holding a block, and one shade more: a slot in
the full colour holds K/V, a **reserved** one in a mid tint is taken for a token the engine has not
run yet, a later chunk of a prompt under chunked prefill or a recomputed request's tokens before
its prefill (:attr:`StepRecord.computed <paged_kv.engine.StepRecord.computed>`), a pale one is
allocated and empty; sequences are named ``"<request>"`` and ``"<request>.<i>"`` for sample ``i``), and the
**CPU swap pool** (rows of :data:`CPU_PER_ROW` blocks, each labelled ``id ×ref count`` and its
holders: a block shared by a group's samples is swapped once and held by all of them).  :func:`serving_figure` replays a run with plotly frames and a slider (the
static book); :func:`refresh_serving_figure` redraws the last step in place (the live panel).

:func:`latency_figure` and :func:`swap_figure` draw the chapter's measured curves.
"""

from __future__ import annotations

import math
import textwrap
from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .blocks import block_traces, reserved_tokens, seq_order
from .controls import add_replay_controls, frame_steps, trace_indices
from .labels import log_ticks, wrap_title
from .palette import FREE_COLOR, discrete_scale, seq_color

LANES = ("waiting", "running", "swapped")
TRACE_NAMES = ("queues", "pool", "block labels", "cpu pool")
PANEL_TITLES = ("<b>queues</b> (box: request, generated / max tokens)", "<b>GPU KV blocks</b> id ×ref count",
                "<b>CPU swap blocks</b> id ×ref count, holders")
#: the GPU pool's colour key, under each step's caption
KEY = "GPU slots: full colour: K/V computed; mid: reserved,<br>its token not run yet; pale: empty; grey: free"
PER_LANE = 6     # request boxes per lane before "+k more"
CPU_PER_ROW = 5  # CPU blocks per row: a holder list ("B, B.1") stays readable in a phone-wide cell
                 # (ten in one row were 30 px wide at 400 px, their labels shrunk to about 6 px)
CPU_ROW_PX = 48  # height of one row of CPU blocks
CPU_TEXT_SIZE = 11  # px: "B, B.1" is about 32 px wide, a cell at 400 px about 57 (plotly's own fit
                    # shrank the two-line labels to about 6 px)


def _order(records: Sequence) -> list:
    order = seq_order([r.pool for r in records])
    for r in records:
        for name in r.cpu:
            if name is not None and name not in order:
                order.append(name)
    return order


def _lane_trace(rec, order: Sequence) -> go.Scatter:
    """One scatter: a square per request in its lane, coloured as its leader sequence."""
    index = {s: k for k, s in enumerate(order)}
    xs, ys, texts, colors, hovers = [], [], [], [], []
    for lane, rows in zip(LANES, (rec.waiting, rec.running, rec.swapped)):
        for i, (rid, gen, max_tokens, computed, prompt) in enumerate(rows):
            if i == PER_LANE:
                xs.append(i)
                ys.append(lane)
                texts.append(f"+{len(rows) - PER_LANE}")
                colors.append("white")
                hovers.append(f"{len(rows) - PER_LANE} more {lane}")
                break
            xs.append(i)
            ys.append(lane)
            texts.append(f"<b>{rid}</b> {gen}/{max_tokens}")
            k = index.get(rid)
            colors.append(seq_color(k) if k is not None else FREE_COLOR)
            phase = (f"prompt {computed}/{prompt} computed" if computed < prompt else
                     f"generated {gen} of {max_tokens}")
            hovers.append(f"request {rid}: {lane}<br>{phase}")
    return go.Scatter(x=xs, y=ys, text=texts, mode="markers+text", name="queues", customdata=hovers,
                      hovertemplate="%{customdata}<extra></extra>", showlegend=False,
                      marker=dict(symbol="square", size=16, color=colors, line=dict(color="#333", width=1)),
                      textposition="middle right", textfont=dict(size=11))


def _cpu_xy(b: int) -> tuple[int, int]:
    """Column and row of CPU block ``b`` in the CPU pool panel."""
    return b % CPU_PER_ROW, b // CPU_PER_ROW


def _cpu_trace(rec, order: Sequence) -> go.Heatmap:
    """The CPU swap pool as rows of :data:`CPU_PER_ROW` blocks, drawn as the GPU pool draws a block:
    coloured as its first holder, labelled ``id ×ref count`` and the holders, and the hover names
    every holder (a prompt block shared by a group's samples is swapped once and held by all of
    them), in :data:`CPU_TEXT_SIZE` px."""
    index = {s: k for k, s in enumerate(order)}
    holders = rec.cpu_holders or tuple(((name, None),) if name is not None else () for name in rec.cpu)
    if not holders:
        return go.Heatmap(z=[[None]], text=[[""]], customdata=[[""]], name="cpu pool", showscale=False,
                          hovertemplate="%{customdata}<extra></extra>", texttemplate="%{text}")
    rows = -(-len(holders) // CPU_PER_ROW)
    z = [[None] * CPU_PER_ROW for _ in range(rows)]
    text = [[""] * CPU_PER_ROW for _ in range(rows)]
    hover = [[""] * CPU_PER_ROW for _ in range(rows)]
    for b, h in enumerate(holders):
        x, y = _cpu_xy(b)
        if not h:
            z[y][x], text[y][x], hover[y][x] = 0, str(b), f"CPU block {b}: free (ref count 0)"
            continue
        who = ", ".join(f"{name} (logical {lg})" if lg is not None else str(name) for name, lg in h)
        names = ", ".join(dict.fromkeys(str(name) for name, _ in h))
        z[y][x] = 1 + index[h[0][0]]
        hover[y][x] = f"CPU block {b}, ref count {len(h)}<br>holds the K/V of {who}"
        text[y][x] = f"<b>{b}</b> ×{len(h)}<br>{names}"
    colors = [FREE_COLOR] + [seq_color(k) for k in range(len(order))]
    return go.Heatmap(z=z, text=text, customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                      texttemplate="%{text}", textfont=dict(size=CPU_TEXT_SIZE), name="cpu pool", showscale=False,
                      hoverongaps=False,
                      colorscale=discrete_scale(colors), zmin=-0.5, zmax=len(colors) - 0.5, xgap=2, ygap=2)


def _traces(rec, order: Sequence) -> list:
    computed = rec.computed_tokens() if rec.computed else None
    pool, labels, _tables = block_traces(rec.pool, order, computed=computed)
    return [_lane_trace(rec, order), pool, labels, _cpu_trace(rec, order)]


def reserved_slots(rec) -> int:
    """Slots of ``rec``'s GPU pool taken for a token whose K/V is not computed yet (the mid tint),
    shared blocks once: the stored tokens of each block at or past its owner's computed count."""
    done = rec.computed_tokens()
    return sum(reserved_tokens(b, done, rec.pool.block_size) for b in rec.pool.blocks)


def _caption(rec) -> str:
    used = rec.pool.used_blocks
    text = "<br>".join(textwrap.wrap(f"step {rec.step} (clock {rec.clock_s * 1e3:.0f} ms): {rec.text}", 56))
    reserved = reserved_slots(rec)
    return (f"{text}<br><sup>{used}/"
            f"{rec.pool.num_blocks} GPU blocks used, {sum(c is not None for c in rec.cpu)}/{len(rec.cpu)} "
            f"CPU blocks; {reserved} slot{'s' * (reserved != 1)} reserved<br>{KEY}</sup>")


def _layout(fig, rec, title: str) -> None:
    head = f"{title}<br>" if title else ""
    fig.update_layout(title=dict(text=head + _caption(rec), x=0.01, font=dict(size=13), yref="container", y=1,
                                 yanchor="top", pad=dict(t=10)))


def serving_figure(records: Sequence, title: str = "", active: int | None = None, replay: bool = True) -> go.Figure:
    """Queues, GPU pool and CPU pool at ``records[active]`` (default: the last), with a slider over
    all records when ``replay`` (frames work in a static page)."""
    records = list(records)
    active = len(records) - 1 if active is None else active
    rec = records[active]
    order = _order(records)
    has_cpu = bool(rec.cpu)
    rows = min(rec.pool.num_blocks, 16)
    cpu_rows = -(-len(rec.cpu) // CPU_PER_ROW)
    plot = 0.8 * (150 + 30 * rows)               # queues and GPU pool, as the figure always drew them
    panels = [0.26 * plot, 0.6 * plot] + ([CPU_ROW_PX * cpu_rows] if has_cpu else [])
    fig = make_subplots(rows=3 if has_cpu else 2, cols=1, vertical_spacing=0.1,
                        row_heights=[p / sum(panels) for p in panels],
                        subplot_titles=PANEL_TITLES if has_cpu else PANEL_TITLES[:2])
    for note in fig.layout.annotations:
        note.update(x=0, xanchor="left", align="left", font=dict(size=12))
    traces = _traces(rec, order)
    fig.add_trace(traces[0], row=1, col=1)
    fig.add_trace(traces[1], row=2, col=1)
    fig.add_trace(traces[2], row=2, col=1)
    if has_cpu:
        fig.add_trace(traces[3], row=3, col=1)
    # the axes by their layout names (row r is xaxis<r>, yaxis<r>; "xaxis" for row 1), in one
    # update: update_xaxes(row=, col=) per axis made this figure ~3x slower to build, and the
    # browser's live panel builds it on every click
    axes = {"xaxis": dict(visible=False, range=[-0.3, PER_LANE + 0.7]),
            "yaxis": dict(type="category", categoryorder="array", categoryarray=list(reversed(LANES)),
                          range=[-0.6, 2.6], showgrid=False)}
    for r in range(2, 4 if has_cpu else 3):
        axes |= {f"xaxis{r}": dict(visible=False), f"yaxis{r}": dict(visible=False, autorange="reversed")}
    fig.update_layout(axes)
    _layout(fig, rec, title)
    fig.update_layout(height=round(sum(panels) / 0.8) + 200, margin=dict(l=20, r=20, t=160, b=70),
                      plot_bgcolor="white", showlegend=False)
    if replay and len(records) > 1:
        names = TRACE_NAMES if has_cpu else TRACE_NAMES[:3]
        idx = trace_indices(fig, names)
        head = f"{title}<br>" if title else ""
        fig.frames = [go.Frame(name=str(r.step), data=_traces(r, order)[:len(names)], traces=idx,
                               layout=go.Layout(title_text=head + _caption(r))) for r in records]
        steps = frame_steps([str(r.step) for r in records])
        add_replay_controls(fig, steps, active, currentvalue=dict(prefix="step ", suffix=f" / {records[-1].step}",
                                                                  xanchor="right"),
                            frame_ms=800, slider=dict(x=0.08, len=0.9))
    return fig


def refresh_serving_figure(fig, records: Sequence, title: str = "") -> None:
    """Redraw ``fig`` (from :func:`serving_figure` with ``replay=False``) in place at the last record."""
    records = list(records)
    order = _order(records)
    with fig.batch_update():
        _layout(fig, records[-1], title)
        names = [n for n in TRACE_NAMES if trace_indices_safe(fig, n)]
        new = dict(zip(TRACE_NAMES, _traces(records[-1], order)))
        for name in names:
            (i,) = trace_indices(fig, [name])
            fig.data[i].update(new[name].to_plotly_json())


def trace_indices_safe(fig, name: str) -> bool:
    """Whether ``fig`` has a trace called ``name``."""
    return any(t.name == name for t in fig.data)


def latency_figure(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], title: str,
                   threshold: float | None = None, y_max: float | None = None,
                   yaxis: str = "normalized latency (s/token)", threshold_text: str | None = None) -> go.Figure:
    """A metric against request rate (req/s), one line per configuration: by default normalized
    latency (s/token, the shape of the vLLM paper's Figure 12), or any ``yaxis`` (SLO attainment).
    ``threshold`` draws a dotted line (the capacity line, the attainment goal), labelled
    ``threshold_text`` (default: ``"<threshold> s/token"``)."""
    fig = go.Figure()
    for k, (name, (x, y)) in enumerate(curves.items()):
        fig.add_trace(go.Scatter(x=list(x), y=list(y), name=name, mode="lines+markers",
                                 line=dict(color=seq_color(k))))
    if threshold is not None:
        fig.add_hline(y=threshold, line=dict(dash="dot", color="#777"),
                      annotation_text=threshold_text or f"{threshold} s/token", annotation_position="top left")
    head = wrap_title(title)
    fig.update_layout(title=dict(text=head, x=0.01, font=dict(size=14)), height=420 + 18 * head.count("<br>"),
                      xaxis_title="request rate (req/s)", yaxis_title=yaxis,
                      legend=dict(orientation="h", y=-0.25),
                      margin=dict(l=60, r=20, t=70 + 18 * head.count("<br>"), b=90))
    if y_max is not None:
        fig.update_yaxes(range=[0, y_max])
    return fig


def swap_figure(block_sizes: Sequence[int], series: Mapping[str, Sequence[float]], title: str,
                yaxis: str, log_y: bool = False) -> go.Figure:
    """One line per series against block size (log-2 axis): the shape of the paper's Figure 19.
    ``log_y``: a log y axis, for costs that span orders of magnitude (a per-block copy cost at
    block size 1 would otherwise flatten the medium sizes), its ticks at 1, 2 and 5 times each
    power of ten, every one labelled (:func:`~.labels.log_ticks`)."""
    fig = go.Figure()
    for k, (name, ys) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=list(block_sizes), y=list(ys), name=name, mode="lines+markers",
                                 line=dict(color=seq_color(k))))
    fig.update_xaxes(type="log", tickvals=list(block_sizes), ticktext=[str(b) for b in block_sizes],
                     title="block size (tokens)")
    head = wrap_title(title)
    extra = 18 * head.count("<br>")
    fig.update_layout(title=dict(text=head, x=0.01, font=dict(size=14)), height=400 + extra, yaxis_title=yaxis,
                      legend=dict(orientation="h", y=-0.3), margin=dict(l=60, r=20, t=70 + extra, b=100))
    if log_y:                  # every tick labelled (1-2-5), the axis from the first tick to the last
        vals, texts = log_ticks([y for ys in series.values() for y in ys])
        fig.update_yaxes(type="log", tickvals=vals, ticktext=texts, range=[math.log10(vals[0]), math.log10(vals[-1])])
    return fig
