"""Figures for chapter 4: where contiguous allocation wastes KV memory, and what paging recovers.

Pure functions of what :func:`paged_kv.sim.simulate` recorded (layouts, step arrays,
summaries), so the static book replays them without a kernel:

* :func:`strip_figure`: the pool as a horizontal strip of slots, two rows per policy (which
  request owns each slot, neighbouring regions never alike; which category it is in), block and
  region borders, plotly frames + slider over time.
* :func:`category_bars`: stacked bars in the vLLM paper's Fig. 2 categories, ours beside the paper's.
* :func:`batch_figure`: running requests over time (the paper's Fig. 13 is its average).
* :func:`rate_figure`: mean batch against request rate (where each policy hits its memory limit).
* :func:`block_size_figure`: paging's waste and batch against block size.
* :func:`length_histogram`: the prompt and output lengths of traces.
* :func:`step_rows`: a run's slots per category step by step, the rows of a table.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..errors import ConfigError
from .controls import add_replay_controls, frame_steps, trace_indices
from .palette import COLORS, FREE_COLOR, discrete_scale, seq_color, tint

CATEGORY_LABELS = {"token_states": "token states", "reserved": "reserved (future tokens)",
                   "internal": "internal fragmentation", "external": "external fragmentation",
                   "free": "free"}
# Kept apart from the request palette: dark green = stored, light green = will be stored,
# purple = reserved but never stored (internal), near-black = stranded (external), grey = free.
CATEGORY_COLORS = {"token_states": "#1B7837", "reserved": "#A6DBA0", "internal": "#6A3D9A",
                   "external": "#1A1A1A", "free": FREE_COLOR}
_CATS = list(CATEGORY_LABELS)


# One discrete colour scale for both strip rows: code 0 unowned; 1 .. len(COLORS) the request
# colours (softened, so the category row stands out); then one code per category.
_STRIP_COLORS = [FREE_COLOR, *(tint(c, 0.3) for c in COLORS), *CATEGORY_COLORS.values()]
_FIRST_CATEGORY_CODE = 1 + len(COLORS)
STRIP_TRACE = "strip"   # the heatmap a frame or a live refresh updates, found by this name
BORDER_TRACE = "borders"  # legend entry of the block/region border lines (one column = one slot)
GAP_POOL = 64  # pools of at most this many slots are drawn with a gap between slots, to count them


def step_rows(res, steps: Sequence[int] | None = None) -> tuple[list[str], list[list[int]]]:
    """``(header, rows)`` of a table of ``res`` (a :class:`~paged_kv.sim.SimResult`) step by step:
    the requests running and waiting, then the slots in each category (they add up to the pool).
    Pass them to :func:`paged_kv.viz.text.table`. ``steps``: the steps to list (default: all)."""
    st = res.steps
    steps = range(res.num_steps) if steps is None else steps
    header = ["step", "running", "waiting", *(_SHORT_LABELS[c] for c in _CATS)]
    return header, [[int(s), int(st["running"][s]), int(st["waiting"][s]), *(int(st[c][s]) for c in _CATS)]
                    for s in steps]


def region_colors(owners: np.ndarray, n: int = len(COLORS)) -> np.ndarray:
    """A colour index in ``0 .. n-1`` for each entry of ``owners`` (request ids, -1 none) such that
    two neighbouring entries of different requests never share a colour.

    Each request keeps one colour where it can (preferred ``rid % n``, so colours stay put from
    frame to frame): requests are coloured greedily in order of first appearance, avoiding the
    colours of requests they touch.  A request touching ``n`` or more coloured others (possible
    for paged requests with many scattered blocks) may then clash; a left-to-right pass recolours
    such a run with the first colour differing from both its neighbours.  ``-1`` entries get 0.
    """
    owners = np.asarray(owners)
    starts = np.concatenate([[0], np.flatnonzero(owners[1:] != owners[:-1]) + 1]) if len(owners) else np.zeros(0, int)
    run_owner = owners[starts]
    neighbours: dict[int, set[int]] = {}
    for a, b in zip(run_owner[:-1], run_owner[1:]):
        if a >= 0 and b >= 0:
            neighbours.setdefault(int(a), set()).add(int(b)), neighbours.setdefault(int(b), set()).add(int(a))
    color: dict[int, int] = {}
    for r in dict.fromkeys(int(r) for r in run_owner if r >= 0):
        taken = {color[q] for q in neighbours.get(r, ()) if q in color}
        color[r] = next((c % n for c in range(r % n, r % n + n) if c % n not in taken), r % n)
    run_color = np.array([color.get(int(r), 0) for r in run_owner], dtype=np.int64)
    for i in range(1, len(run_color)):  # the guarantee: no two neighbouring runs alike
        if run_owner[i] >= 0 and run_owner[i - 1] >= 0 and run_color[i] == run_color[i - 1]:
            right = color.get(int(run_owner[i + 1]), -1) if i + 1 < len(run_owner) and run_owner[i + 1] >= 0 else -1
            run_color[i] = next(c for c in range(n) if c not in (run_color[i - 1], right))
    lengths = np.diff(np.concatenate([starts, [len(owners)]]))
    return np.repeat(run_color, lengths)


def strip_rows(owner: np.ndarray, category: np.ndarray, bin_slots: int = 1) -> np.ndarray:
    """``[2, ceil(pool / bin_slots)]`` strip codes: row 0 the owner's colour (``1 +`` its
    :func:`region_colors` index, 0 none), row 1 the category (``1 + len(COLORS)`` + its index in
    CATEGORIES).  A bin shows its most common category, and the owner of the bin's first owned
    slot (0 if the bin holds no owned slot); neighbouring bins of different requests differ in colour."""
    pool = len(owner)
    nb = -(-pool // bin_slots)
    pad = nb * bin_slots - pool
    own = np.concatenate([owner, np.full(pad, -1, owner.dtype)]).reshape(nb, bin_slots)
    cat = np.concatenate([category, np.full(pad, _CATS.index("free"), category.dtype)]).reshape(nb, bin_slots)
    counts = np.stack([(cat == k).sum(1) for k in range(len(_CATS))], axis=1)
    top_cat = counts.argmax(1)
    has = own >= 0
    first = np.where(has.any(1), own[np.arange(nb), has.argmax(1)], -1)
    return np.stack([np.where(first >= 0, 1 + region_colors(first), 0), _FIRST_CATEGORY_CODE + top_cat]).astype(np.int8)


def _aligned(runs: Mapping[str, Sequence]) -> dict[str, list]:
    """Runs padded to equal length: a run that ended early shows an empty pool afterwards."""
    runs = {k: list(v) for k, v in runs.items()}
    if not runs or any(not v for v in runs.values()):
        raise ConfigError("strip_figure needs at least one layout in every run")
    pools = {len(v[0].owner) for v in runs.values()}
    if len(pools) != 1:
        raise ConfigError(f"strip_figure needs runs over one pool size, got {sorted(pools)}")
    longest = max(runs.values(), key=len)
    free = np.full(pools.pop(), _CATS.index("free"), np.int8)
    for v in runs.values():
        for lay in longest[len(v):]:
            v.append(type(lay)(-1, lay.time_s, np.full(len(free), -1, np.int32), free))
    return runs


def _strip_z(runs: Mapping[str, Sequence], i: int, bin_slots: int) -> np.ndarray:
    return np.concatenate([strip_rows(lays[i].owner, lays[i].category, bin_slots) for lays in runs.values()])


def border_shapes(runs: Mapping[str, Sequence], i: int, pad_to: int = 0) -> list[dict]:
    """Vertical lines at every allocation-unit border of layout ``i``, each across its run's pair
    of rows (slot ``b`` starts a unit: a line at ``b - 0.5``), as plotly layout shapes, padded with
    hidden lines to ``pad_to``.  Shapes, not a trace, since plotly cannot animate a trace whose
    points come and go; padded, since an animation frame updates shapes index by index and would
    leave a longer previous frame's extra lines standing."""
    shapes = []
    for j, lays in enumerate(runs.values()):
        borders = lays[i].borders
        for b in (np.asarray(borders)[1:] if borders is not None else ()):
            shapes.append(dict(type="line", xref="x", yref="y", x0=float(b) - 0.5, x1=float(b) - 0.5,
                               y0=2 * j - 0.5, y1=2 * j + 1.5, line=dict(color="black", width=2), visible=True))
    hidden = dict(type="line", xref="x", yref="y", x0=0, x1=0, y0=0, y1=0, visible=False)
    return shapes + [dict(hidden) for _ in range(pad_to - len(shapes))]


def _strip_caption(runs: Mapping[str, Sequence], i: int, title: str) -> str:
    t = max(v[i].time_s for v in runs.values())
    head = f"{title}<br>" if title else ""
    return f"{head}<sup>t = {t:.1f} s · top row of each pair: owning request; bottom row: category</sup>"


_STRIP_TOP = 100  # px: a two-line title (~40) above a legend of up to three rows (~57)
# Short legend names keep the strip's legend to one row on a page, three on a phone.
_SHORT_LABELS = {"token_states": "token states", "reserved": "reserved", "internal": "internal frag.",
                 "external": "external frag.", "free": "free"}


def _row_labels(runs: Mapping[str, Sequence]) -> list[str]:
    """Two rows per run, each label on two lines ("<run> ·" over "request"/"category"): on one
    line the labels took 60% of a phone's width, leaving the strips and the legend ~100 px."""
    return [f"{k} ·<br>{what}" for k in runs for what in ("request", "category")]


def strip_figure(runs: Mapping[str, Sequence], title: str = "", max_bins: int = 240,
                 active: int | None = None, replay: bool = True, height: int | None = None) -> go.Figure:
    """The pool as strips of slots, one pair of rows per run, with a slider over recorded layouts.

    Args:
        runs: label -> list of :class:`~paged_kv.sim.Layout` over one pool size; record
            them with ``simulate(..., layout_times=...)`` so frame ``i`` is the same moment in
            every run (a run that ended sooner is padded with an empty pool).
        max_bins: at most this many columns; ``bin_slots = ceil(pool / max_bins)`` slots each.
        active: the layout shown first (default: the last).
        replay: a frame per layout, a slider and a play button (static book); ``False`` draws
            ``active`` only (the live widget).
    """
    runs = _aligned(runs)
    first = next(iter(runs.values()))
    pool, n = len(first[0].owner), len(first)
    bin_slots = max(1, -(-pool // max_bins))
    active = n - 1 if active is None else active
    ylabels = _row_labels(runs)
    x = np.arange(-(-pool // bin_slots)) * bin_slots + (bin_slots - 1) / 2  # column centres, in slots
    gap = 1 if pool <= GAP_POOL else 0  # small pools: slots you can count
    heat = go.Heatmap(z=_strip_z(runs, active, bin_slots), x=x, y=list(range(len(ylabels))), zmin=-0.5,
                      zmax=len(_STRIP_COLORS) - 0.5, name=STRIP_TRACE, customdata=[[lab.replace("<br>", " ")] * len(x) for lab in ylabels],
                      colorscale=discrete_scale(_STRIP_COLORS), showscale=False, xgap=gap, ygap=3,
                      hovertemplate="slot %{x}<br>%{customdata}<extra></extra>")
    fig = go.Figure(heat)
    borders = bin_slots == 1  # a border per unit is readable only when a column is one slot
    if borders:  # the legend entry; the lines themselves are layout shapes
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=BORDER_TRACE,
                                 line=dict(color="black", width=2)))
    for c in _CATS:  # legend entries for the category colours (the request colours need none)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=_SHORT_LABELS[c],
                                 marker=dict(symbol="square", size=12, color=CATEGORY_COLORS[c],
                                             line=dict(color="#999", width=1))))
    unit = "slot" if bin_slots == 1 else f"slot (one column = {bin_slots} slots)"
    # Top down: title and subtitle pinned to the figure's top edge, then the legend sitting on the
    # plot (up to three rows on a phone), then the strips; the top margin holds both.
    height = height or 220 + 42 * len(ylabels)
    fig.update_layout(title=dict(text=_strip_caption(runs, active, title), x=0.01, font=dict(size=14),
                                 yref="container", y=1 - 20 / height, yanchor="top"),
                      height=height, margin=dict(l=10, r=10, t=_STRIP_TOP, b=70),
                      xaxis=dict(title=unit, range=[-0.5, pool - 0.5], showgrid=False, zeroline=False),
                      yaxis=dict(autorange="reversed", showgrid=False, zeroline=False, tickmode="array",
                                 tickvals=list(range(len(ylabels))), ticktext=ylabels),
                      plot_bgcolor="white",
                      # on the plot's left edge: a legend anchored to the figure's edge pushes the
                      # margin by its own width (on a phone the strips kept ~150 px)
                      legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0, xanchor="left",
                                  font=dict(size=11)))
    most = max(len(border_shapes(runs, i)) for i in range(n)) if borders and replay else 0
    fig.update_layout(shapes=border_shapes(runs, active, most) if borders else [])
    if replay and n > 1:
        strip = trace_indices(fig, [STRIP_TRACE])
        fig.frames = [go.Frame(name=str(i), data=[go.Heatmap(z=_strip_z(runs, i, bin_slots))], traces=strip,
                               layout=go.Layout(title_text=_strip_caption(runs, i, title),
                                                shapes=border_shapes(runs, i, most) if borders else []))
                      for i in range(n)]
        steps = frame_steps([str(i) for i in range(n)], [f"{first[i].time_s:.0f}" for i in range(n)])
        add_replay_controls(fig, steps, active, currentvalue=dict(prefix="t (s) = "), frame_ms=400,
                            slider=dict(pad=dict(t=40, l=60)), pad_top=40)
    return fig


def refresh_strip(fig, runs: Mapping[str, Sequence], index: int, title: str = "", max_bins: int = 240) -> None:
    """Show layout ``index`` in a :func:`strip_figure` made with ``replay=False`` (e.g. a FigureWidget)."""
    runs = _aligned(runs)
    pool = len(next(iter(runs.values()))[0].owner)
    bin_slots = max(1, -(-pool // max_bins))
    ylabels = _row_labels(runs)
    strip = fig.data[trace_indices(fig, [STRIP_TRACE])[0]]
    with fig.batch_update():
        strip.z = _strip_z(runs, index, bin_slots)
        fig.layout.yaxis.tickvals, fig.layout.yaxis.ticktext = list(range(len(ylabels))), ylabels
        fig.layout.shapes = border_shapes(runs, index) if bin_slots == 1 else []
        fig.layout.title.text = _strip_caption(runs, index, title)


REST_COLOR = "#BDBDBD"  # the part of a paper's bar it does not break down


def category_bars(shares: Mapping[str, Mapping[str, float]], paper: Mapping[str, Mapping[str, float]] | None = None,
                  title: str = "Where the KV memory goes") -> go.Figure:
    """Stacked horizontal bars, % of the memory in use per category (the paper's Fig. 2 basis):
    one bar per system, or with ``paper`` a pair per system, ours above the paper's.

    Args:
        shares: label -> ``SimResult.used_shares()`` (categories except ``free``, summing to 1).
        paper: label -> the paper's bar for that system, category -> share
            (``PAPER_RESULTS["fig2"][key]``); a bar that gives only ``token_states`` and ``rest``
            draws the rest as one grey segment, "not broken down".
    """
    labels = list(shares)
    bars: list[tuple[str, Mapping[str, float]]] = []
    for k in labels:
        bars.append((f"{k} · ours" if paper else k, shares[k]))
        if paper and k in paper:
            bars.append((f"{k} · paper", paper[k]))
    names = [name for name, _ in bars]
    # a pair sits close together, with a wider gap to the next system
    ys, y = [], 0.0
    for name in names:
        ys.append(y)
        y += 0.8 if name.endswith("· ours") else 1.3
    fig = go.Figure()
    # the paper's Fig. 2 names its last segment "external fragmentation & others" (the rounding too)
    names_fig2 = CATEGORY_LABELS | {"external": "external fragmentation & others"}
    segments = [(c, names_fig2[c], CATEGORY_COLORS[c]) for c in _CATS[:-1]]
    segments.append(("rest", "not broken down (paper)", REST_COLOR))
    for c, label, color in segments:
        vals = [100 * bar.get(c, 0.0) for _, bar in bars]
        if not any(vals):
            continue
        fig.add_trace(go.Bar(y=ys, x=vals, orientation="h", name=label, width=0.7, marker_color=color,
                             text=[f"{v:.1f}%" if v >= 6 else "" for v in vals], textposition="inside",
                             insidetextanchor="middle", customdata=names,
                             hovertemplate="%{customdata}: %{x:.1f}%<extra>" + label + "</extra>"))
    fig.update_layout(barmode="stack", title=title, height=230 + 38 * len(bars),
                      xaxis=dict(title="% of the KV memory in use", range=[0, 100]),
                      yaxis=dict(autorange="reversed", tickvals=ys, ticktext=names, showgrid=False),
                      margin=dict(l=10, r=20, t=70, b=120),
                      legend=dict(orientation="h", y=-0.16, yanchor="top", traceorder="normal"))
    return fig


def batch_figure(series: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], t_max: float | None = None,
                 bin_s: float = 5.0, paper: Mapping[str, float] | None = None,
                 title: str = "Requests in the batch over time") -> go.Figure:
    """Running requests over time, averaged over ``bin_s``-second bins (keeps the page small).

    Args:
        series: label -> ``(time_s, dt_s, running)`` step arrays of a run.
        paper: label -> the paper's average batch (Fig. 13a), drawn as a dotted line.
    """
    fig = go.Figure()
    for i, (label, (t, dt, run)) in enumerate(series.items()):
        end = float(t_max if t_max is not None else (t + dt).max())
        edges = np.arange(0.0, end + bin_s, bin_s)
        # time-weighted mean per bin from the running integral; idle time counts as an empty batch
        before = np.concatenate([[0.0], np.cumsum(run * dt)])  # integral up to each step's start
        k = np.searchsorted(t, edges, side="right") - 1  # the step each edge falls in (or after)
        kk = np.maximum(k, 0)
        inside = np.where(k >= 0, np.clip(edges - t[kk], 0, dt[kk]), 0.0)
        integral = np.where(k >= 0, before[kk] + run[kk] * inside, 0.0)
        area = np.diff(integral) / bin_s
        color = seq_color(i)
        fig.add_trace(go.Scatter(x=np.round(edges[:-1] + bin_s / 2, 1), y=np.round(area, 2), mode="lines",
                                 name=label, line=dict(color=color)))
        if paper and label in paper:
            fig.add_hline(y=paper[label], line=dict(color=color, dash="dot", width=1))
    fig.update_layout(title=title + ("<br><sup>dotted: the paper's averages (Fig. 13a)</sup>" if paper else ""),
                      xaxis_title="time (s)", yaxis_title="running requests", height=380,
                      margin=dict(l=60, r=20, t=70, b=50), legend=dict(orientation="h", y=-0.2))
    return fig


def rate_figure(rates: Sequence[float], batches: Mapping[str, Sequence[float]],
                paper: Mapping[str, float] | None = None, paper_rate: float = 2.0,
                title: str = "Mean batch against request rate") -> go.Figure:
    """Mean batch per policy as the arrival rate grows; the paper's Fig. 13a points as diamonds."""
    fig = go.Figure()
    for i, (label, ys) in enumerate(batches.items()):
        color = seq_color(i)
        fig.add_trace(go.Scatter(x=list(rates), y=[round(float(y), 2) for y in ys], mode="lines+markers",
                                 name=label, line=dict(color=color), marker=dict(size=5)))
        if paper and label in paper:
            fig.add_trace(go.Scatter(x=[paper_rate], y=[paper[label]], mode="markers", showlegend=False,
                                     marker=dict(symbol="diamond-open", size=12, color=color, line=dict(width=2)),
                                     hovertemplate=f"paper (Fig. 13a), {label}: %{{y}}<extra></extra>"))
    fig.update_layout(title=title + "<br><sup>open diamonds: the paper's averages at 2 req/s</sup>",
                      xaxis_title="request rate (req/s)", yaxis_title="mean running requests",
                      height=400, margin=dict(l=60, r=20, t=70, b=50), legend=dict(orientation="h", y=-0.2))
    return fig


def block_size_figure(block_sizes: Sequence[int], waste: Sequence[float], batch: Sequence[float],
                      title: str = "Paging: waste and batch against block size") -> go.Figure:
    """Waste (% of memory in use not holding token states) and mean batch per block size; both
    axes start at 0, so each quantity's change reads as its share of the whole."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    xs = [str(b) for b in block_sizes]
    fig.add_trace(go.Bar(x=xs, y=[round(100 * w, 2) for w in waste], name="waste (% of memory in use)",
                         marker_color=CATEGORY_COLORS["internal"]), secondary_y=False)
    fig.add_trace(go.Scatter(x=xs, y=[round(float(b), 2) for b in batch], name="mean batch",
                             mode="lines+markers", line=dict(color=COLORS[0])), secondary_y=True)
    fig.update_layout(title=title, height=380, margin=dict(l=60, r=60, t=50, b=50),
                      legend=dict(orientation="h", y=-0.25), xaxis_title="block size (slots)")
    fig.update_yaxes(title_text="waste (%)", secondary_y=False)
    # plotly syncs a secondary axis to the primary's grid (ticks like 24.3, 26.0): give it its own.
    # From 0, like the bars: an axis cut at the smallest batch drew a 21% drop as a collapse.
    ticks, fmt = nice_ticks(0, max(batch))
    fig.update_yaxes(title_text="mean running requests", secondary_y=True, showgrid=False, tickmode="array",
                     tickvals=ticks, ticktext=[f"{t:{fmt}}" for t in ticks], range=[ticks[0], ticks[-1]])
    return fig


def nice_ticks(lo: float, hi: float, target: int = 5) -> tuple[list[float], str]:
    """About ``target`` round ticks covering ``[lo, hi]`` (steps of 1, 2, 2.5 or 5 times a power
    of ten), and the format spec that prints them without spurious digits."""
    lo, hi = float(lo), float(hi)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise ConfigError(f"nice_ticks needs finite bounds, got {lo!r}, {hi!r}")
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    raw = (hi - lo) / target
    power = 10.0 ** np.floor(np.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first, last = np.floor(lo / step), np.ceil(hi / step)
    ticks = [round(float(k * step), 10) for k in np.arange(first, last + 1)]
    decimals = max(0, -int(np.floor(np.log10(step) + 1e-9))) + (1 if step / power == 2.5 else 0)
    return ticks, f".{decimals}f"


def length_histogram(traces: Mapping[str, object], bins_per_octave: int = 2, max_tokens: int = 2048,
                     title: str = "Prompt and output lengths") -> go.Figure:
    """Share of requests per length bin, prompts and outputs of each trace, on a log length axis.

    Bins are ``bins_per_octave`` per doubling of the length (edges ``2**(k / bins_per_octave)``
    tokens, rounded, from the power of two at or below the shortest length to ``max_tokens``; more
    bins per doubling would hold uneven numbers of integer lengths and draw a jagged outline),
    drawn as filled steps: lengths are log-normal, so on this
    axis a short-request trace (Alpaca-like, mean ~20 tokens) and a long one (ShareGPT-like) both
    show their shape; on a linear axis with equal bins the short one was one tall bar. Binned
    here, so the page carries counts, not every request.
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=("prompt (tokens)", "output (tokens)"), shared_yaxes=True)
    shortest = min(int(min(tr.prompt_len.min(), tr.output_len.min())) for tr in traces.values())
    first = int(np.floor(np.log2(max(shortest, 1))))
    octaves = int(np.ceil(np.log2(max_tokens))) - first
    edges = np.unique(np.round(2.0 ** (first + np.arange(octaves * bins_per_octave + 1) / bins_per_octave)))
    for i, (label, tr) in enumerate(traces.items()):
        color = seq_color(i)
        for col, lengths in ((1, tr.prompt_len), (2, tr.output_len)):
            counts, _ = np.histogram(lengths, edges)
            share = np.round(100 * counts / len(lengths), 3)
            what = "prompts" if col == 1 else "outputs"
            fig.add_trace(go.Scatter(x=edges, y=np.append(share, share[-1]), mode="lines", line_shape="hv",
                                     fill="tozeroy", line=dict(color=color, width=1.5), opacity=0.7,
                                     name=f"{label} (mean {tr.prompt_len.mean():.0f} / {tr.output_len.mean():.0f})",
                                     legendgroup=label, showlegend=col == 1,
                                     hovertemplate=f"{label} {what}<br>from %{{x}} tokens: %{{y}}%<extra></extra>"),
                          row=1, col=col)
    ticks = [int(2 ** k) for k in range(first, int(np.log2(edges[-1])) + 1, 2)]
    fig.update_xaxes(type="log", range=[np.log10(edges[0]), np.log10(edges[-1])], tickvals=ticks,
                     ticktext=[str(t) for t in ticks])
    fig.update_layout(title=f"{title}<br><sup>log length axis, {bins_per_octave} bins per doubling; "
                            "legend: mean prompt / output</sup>",
                      height=380, margin=dict(l=60, r=20, t=80, b=50),
                      legend=dict(orientation="h", y=-0.2), yaxis_title="% of requests")
    return fig
