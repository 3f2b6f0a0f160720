"""Prefix caching in pictures (chapter 8): the block pool with cached-free blocks, hits and LRU
evictions step by step; radix tree against hashed blocks; hit rate against pool size.

:func:`prefix_pool_figure` draws an engine's :class:`~paged_kv.engine.StepRecord` list (recorded
with ``enable_prefix_caching``): one square per physical block, coloured by the request holding it,
**grey** when free, **sand** when *cached-free* (ref count 0 but its K/V still findable by hash),
in a mid tint of its request's colour while *reserved* (some of its tokens not run yet, their K/V
not computed: a prompt's later chunks under chunked prefill);
a dot marks a block that caches a prefix, a gold star a block handed out as a hit in this step,
a red cross a block whose entry was evicted (least recently used first) to be reused.
:func:`refresh_prefix_pool_figure` redraws the last step in place (the live panel).

:func:`radix_vs_blocks_figure` draws what SGLang's radix tree and vLLM's hashed blocks store for
the same prompts; :func:`hit_rate_figure` draws measured hit rates.  All from plain data.
"""

from __future__ import annotations

import textwrap
from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..errors import ConfigError
from ..validate import count
from .blocks import RESERVED_TINT, reserved_tokens
from .controls import add_replay_controls, frame_steps, trace_indices
from .labels import visible_token, wrap_title
from .palette import FREE_COLOR, discrete_scale, seq_color, tint

__all__ = ["CACHED_FREE_COLOR", "MARKER_KEY", "SHARED_EDGE_COLOR", "hit_rate_figure", "pool_states", "prefix_pool_figure", "radix_tree",
           "radix_vs_blocks_figure", "refresh_prefix_pool_figure"]

CACHED_FREE_COLOR = "#E9D8A6"    # sand: free by ref count, but its K/V is still cached
HIT_COLOR, EVICT_COLOR = "#D4A017", "#C00000"
SHARED_EDGE_COLOR = "#CFCFCF"    # a radix-tree edge on the path of several prompts
PER_ROW = 8                      # blocks per row of the pool grid (a used block's label takes two
                                 # short lines, id over holder, so eight fit a 360-px phone)
TRACE_NAMES = ("pool", "cached", "hits", "evicted")
#: the figure's key, under each step's caption: the markers in their own colours, then the fills
#: (lines of at most ~50 characters: the figure is 368 px wide on a phone)
MARKER_KEY = (f"● caches a prefix, <span style='color:{HIT_COLOR}'>★</span> hit in this step,<br>"
              f"<span style='color:{EVICT_COLOR}'>✕1</span> evicted (LRU order); grey: free,<br>"
              "sand: cached-free, mid tint: reserved")


def pool_states(rec) -> list[tuple]:
    """Per physical block of a record: ``(state, owner, ref count, cached)``, state one of
    ``"free"``, ``"cached-free"``, ``"used"``; ``owner`` the request name holding it (or ``None``)."""
    cached = rec.cached or (False,) * rec.pool.num_blocks
    out = []
    for blk, c in zip(rec.pool.blocks, cached):
        owner = None if blk.owner is None else str(blk.owner).split(".")[0]
        state = "used" if blk.ref_count else ("cached-free" if c else "free")
        out.append((state, owner, blk.ref_count, bool(c)))
    return out


def _owners(records: Sequence) -> list[str]:
    order: list[str] = []
    for r in records:
        for _, owner, _, _ in pool_states(r):
            if owner is not None and owner not in order:
                order.append(owner)
    return order


def _xy(b: int) -> tuple[int, int]:
    return b % PER_ROW, b // PER_ROW


def _traces(rec, order: Sequence[str]) -> list:
    index = {s: k for k, s in enumerate(order)}
    states = pool_states(rec)
    rows = -(-len(states) // PER_ROW)
    z = [[None] * PER_ROW for _ in range(rows)]
    text = [[""] * PER_ROW for _ in range(rows)]
    hover = [[""] * PER_ROW for _ in range(rows)]
    n = max(len(order), 1)
    done = rec.computed_tokens() if rec.computed else {}
    for b, (state, owner, refs, cached) in enumerate(states):
        x, y = _xy(b)
        blk = rec.pool.blocks[b]
        pending = reserved_tokens(blk, done, rec.pool.block_size)
        z[y][x] = {"free": 0, "cached-free": 1}.get(state, 2 + index.get(owner, 0) + n * (pending > 0))
        text[y][x] = f"{b}" if state != "used" else f"<b>{b}</b><br>{owner}" + (f" ×{refs}" if refs > 1 else "")
        what = {"free": "free (ref count 0, caches nothing)",
                "cached-free": "cached-free: ref count 0, its K/V still found by hash (evicted LRU)"}.get(
            state, f"held by {owner}, ref count {refs}" + (", caches a prefix" if cached else ""))
        if pending:
            what += f"; reserved: {pending} of its {blk.filled} tokens not run yet, their K/V not computed"
        hover[y][x] = f"block {b}: {what}"
    # z: 0 free, 1 cached-free, 2 + k held by owner k, 2 + n + k held by k and reserved (mid tint)
    colors = ([FREE_COLOR, CACHED_FREE_COLOR] + [seq_color(k) for k in range(n)]
              + [tint(seq_color(k), RESERVED_TINT) for k in range(n)])
    pool = go.Heatmap(z=z, text=text, customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                      texttemplate="%{text}", textfont=dict(size=11), name="pool", showscale=False,
                      colorscale=discrete_scale(colors), zmin=-0.5, zmax=len(colors) - 0.5, xgap=3, ygap=3)
    cx = [_xy(b)[0] + 0.36 for b, s in enumerate(states) if s[3]]
    cy = [_xy(b)[1] - 0.3 for b, s in enumerate(states) if s[3]]
    cached = go.Scatter(x=cx, y=cy, mode="markers", name="cached", hoverinfo="skip", showlegend=False,
                        marker=dict(symbol="circle", size=6, color="#333"))
    hx, hy = zip(*[_xy(b) for b in rec.hits]) if rec.hits else ((), ())
    hits = go.Scatter(x=[x - 0.3 for x in hx], y=[y + 0.25 for y in hy], mode="markers", name="hits",
                      hoverinfo="skip", showlegend=False,
                      marker=dict(symbol="star", size=15, color=HIT_COLOR, line=dict(color="#333", width=1)))
    ex, ey = zip(*[_xy(b) for b in rec.evicted]) if rec.evicted else ((), ())
    evicted = go.Scatter(x=[x - 0.3 for x in ex], y=[y - 0.25 for y in ey], mode="markers+text", name="evicted",
                         text=[f"{k + 1}" for k in range(len(ex))], textposition="middle right",
                         textfont=dict(size=9, color=EVICT_COLOR), hoverinfo="skip", showlegend=False,
                         marker=dict(symbol="x", size=9, color=EVICT_COLOR))
    return [pool, cached, hits, evicted]


def _caption(rec) -> str:
    states = pool_states(rec)
    n = {s: sum(1 for x in states if x[0] == s) for s in ("used", "cached-free", "free")}
    done = rec.computed_tokens() if rec.computed else {}
    pending = sum(reserved_tokens(b, done, rec.pool.block_size) > 0 for b in rec.pool.blocks)
    text = "<br>".join(textwrap.wrap(f"step {rec.step}: {rec.text}", 60))
    used = f"{n['used']} used" + (f" ({pending} reserved)" if pending else "")
    return (f"{text}<br><sup>{used}, {n['cached-free']} cached-free, {n['free']} free;<br>"
            f"{len(rec.hits)} hit blocks, {len(rec.evicted)} evicted in this step<br>{MARKER_KEY}</sup>")


def prefix_pool_figure(records: Sequence, title: str = "", active: int | None = None,
                       replay: bool = True) -> go.Figure:
    """The GPU pool at ``records[active]`` (default: the last), with a slider over all records when
    ``replay`` (frames work in a static page).  See the module's docstring for the encoding.

    Raises:
        ConfigError: no records, or ``active`` not an index into them.
    """
    records = list(records)
    if not records:
        raise ConfigError("prefix_pool_figure needs at least one StepRecord (record=True on the engine)")
    active = len(records) - 1 if active is None else active
    if type(active) is not int or not 0 <= active < len(records):
        raise ConfigError(f"active must be an int in 0..{len(records) - 1} (an index into the records), got {active!r}")
    order = _owners(records)
    rec = records[active]
    fig = go.Figure(_traces(rec, order))
    rows = -(-rec.pool.num_blocks // PER_ROW)
    fig.update_xaxes(visible=False, range=[-0.6, PER_ROW - 0.4])
    fig.update_yaxes(visible=False, autorange="reversed")
    head = f"{wrap_title(title)}<br>" if title else ""
    # room for the tallest caption of any frame (hanging from the top: plotly centres a title in
    # its margin, where a tall one ran into the pool)
    top = 30 + 17 * max((head + _caption(r)).count("<br>") + 1 for r in records)
    fig.update_layout(title=dict(text=head + _caption(rec), x=0.01, font=dict(size=13), yref="container", y=1,
                                 yanchor="top", pad=dict(t=10)),
                      height=130 + top + 70 * rows, margin=dict(l=10, r=10, t=top, b=80),
                      plot_bgcolor="white", showlegend=False)
    if replay and len(records) > 1:
        idx = trace_indices(fig, TRACE_NAMES)
        fig.frames = [go.Frame(name=str(r.step), data=_traces(r, order), traces=idx,
                               layout=go.Layout(title_text=head + _caption(r))) for r in records]
        add_replay_controls(fig, frame_steps([str(r.step) for r in records]), active,
                            currentvalue=dict(prefix="step ", suffix=f" / {records[-1].step}", xanchor="right"),
                            frame_ms=900,
                            slider=dict(x=0.08, len=0.9))
    return fig


def refresh_prefix_pool_figure(fig, records: Sequence, title: str = "") -> None:
    """Redraw ``fig`` (from :func:`prefix_pool_figure` with ``replay=False``) at the last record.
    Raises ``ConfigError`` when there is no record."""
    records = list(records)
    if not records:
        raise ConfigError("refresh_prefix_pool_figure needs at least one StepRecord")
    new = dict(zip(TRACE_NAMES, _traces(records[-1], _owners(records))))
    head = f"{wrap_title(title)}<br>" if title else ""
    with fig.batch_update():
        fig.layout.title.text = head + _caption(records[-1])
        for name in TRACE_NAMES:
            (i,) = trace_indices(fig, [name])
            fig.data[i].update(new[name].to_plotly_json())


# --- radix tree vs hashed blocks -----------------------------------------------------------------
def radix_tree(prompts: Sequence[str]) -> list[tuple[int, int, str, int]]:
    """A radix (compressed prefix) tree of ``prompts``, as SGLang's RadixAttention keeps one over
    token ids: edges ``(start, depth, label, parent)``, each edge labelled with the characters it
    adds, ``start`` its offset in the prompt, ``parent`` the index of the parent edge (-1 root)."""
    root: dict = {}
    for p in prompts:                     # build a plain trie, then merge single-child chains
        node = root
        for ch in p:
            node = node.setdefault(ch, {})
    edges: list[tuple[int, int, str, int]] = []

    def walk(node, start, depth, parent):
        for ch, child in sorted(node.items()):
            label, nxt = ch, child
            while len(nxt) == 1:
                (c2, n2), = nxt.items()
                label, nxt = label + c2, n2
            edges.append((start, depth, label, parent))
            walk(nxt, start + len(label), depth + 1, len(edges) - 1)
    walk(root, 0, 0, -1)
    return edges


def radix_vs_blocks_figure(prompts: Sequence[str], block_size: int, title: str = "") -> go.Figure:
    """Top: each prompt as hashed blocks (vLLM): full blocks in the colour of the first prompt that
    holds the same prefix (pale where a later prompt reuses it), the partial last block blank and
    dotted (never cached).  Bottom: the radix tree (SGLang): one edge per distinct run of
    characters, shared at any length; an edge on the path of several prompts is grey, an edge of
    one prompt only is pale in that prompt's colour (the colours of the top panel).  Stacked, so it
    fits a phone.

    Raises:
        ConfigError: no prompts, a prompt that is not a non-empty str, ``block_size`` not an int >= 1.
    """
    block_size = count("block_size (characters per block)", block_size)
    prompts = list(prompts)
    if not prompts or any(not isinstance(p, str) or not p for p in prompts):
        raise ConfigError(f"radix_vs_blocks_figure needs one or more non-empty str prompts, got {prompts!r:.120}")
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.16,
                        subplot_titles=(f"hashed blocks of {block_size} (vLLM)", "radix tree (SGLang)"))
    owner: dict[str, int] = {}
    for i, p in enumerate(prompts):
        for j in range(-(-len(p) // block_size)):
            chunk = p[j * block_size:(j + 1) * block_size]
            full = len(chunk) == block_size
            key = p[:(j + 1) * block_size]
            k = owner.setdefault(key, i) if full else None
            color = seq_color(k) if full else "white"
            if full and k != i:
                color = tint(color, 0.35)
            fig.add_shape(type="rect", x0=j * block_size, x1=(j + 1) * block_size - 0.15, y0=i - 0.4, y1=i + 0.4,
                          fillcolor=color, line=dict(color="#333", width=1, dash="solid" if full else "dot"),
                          row=1, col=1)
            fig.add_annotation(x=j * block_size + len(chunk) / 2, y=i, text=visible_token(chunk), showarrow=False,
                               font=dict(size=10, family="monospace"), row=1, col=1)
    edges = radix_tree(prompts)
    leaves = [e for e in range(len(edges)) if not any(x[3] == e for x in edges)]
    ypos: dict[int, float] = {e: float(k) for k, e in enumerate(leaves)}
    for e in reversed(range(len(edges))):
        if e not in ypos:
            kids = [ypos[c] for c in range(len(edges)) if edges[c][3] == e]
            ypos[e] = sum(kids) / len(kids)
    through: list[set] = []               # per edge: the prompts whose path runs along it
    for e, (start, depth, label, parent) in enumerate(edges):
        path = ""
        k = e
        while k >= 0:
            path, k = edges[k][2] + path, edges[k][3]
        through.append({i for i, p in enumerate(prompts) if p.startswith(path)})
    for e, (start, depth, label, parent) in enumerate(edges):
        y = ypos[e]
        (only,) = through[e] if len(through[e]) == 1 else (None,)
        fig.add_shape(type="rect", x0=start, x1=start + len(label) - 0.15, y0=y - 0.35, y1=y + 0.35,
                      fillcolor=SHARED_EDGE_COLOR if only is None else tint(seq_color(only), 0.55),
                      line=dict(color="#333", width=1), row=2, col=1)
        fig.add_annotation(x=start + len(label) / 2, y=y, text=visible_token(label), showarrow=False,
                           font=dict(size=10, family="monospace"), row=2, col=1)
        if parent >= 0:
            fig.add_shape(type="line", x0=start - 0.15, x1=start, y0=ypos[parent], y1=y,
                          line=dict(color="#555", width=1), row=2, col=1)
    right = -(-max(len(p) for p in prompts) // block_size) * block_size
    for r, rows in ((1, len(prompts)), (2, len(leaves))):
        fig.update_xaxes(range=[-0.5, right + 0.5], showgrid=False, zeroline=False, row=r, col=1,
                         title="token position" if r == 2 else None)
        fig.update_yaxes(visible=False, range=[rows - 0.5, -0.5], row=r, col=1)
    head = wrap_title(title)
    extra = 18 * head.count("<br>")
    fig.update_layout(title=dict(text=head, x=0.01, font=dict(size=14)), height=200 + 90 * len(prompts) + extra,
                      margin=dict(l=10, r=10, t=80 + extra, b=50), plot_bgcolor="white", showlegend=False)
    return fig


def hit_rate_figure(pool_sizes: Sequence, series: Mapping[str, Sequence[float]], title: str,
                    xaxis: str = "KV pool (blocks)", yaxis: str = "prefix-cache hit rate") -> go.Figure:
    """One line per series (e.g. per prefix length) against pool size, y in [0, 1].

    The pool sizes sit at evenly spaced positions, smallest first, each labelled with its size
    (the series' values follow their pool sizes in any order given): pools of 49, 81
    and 983 blocks are a factor of 20 apart, and on a linear axis (even on a log one) the two
    small pools, where the hit rate changes, were squeezed together at the left edge.  The axis
    title says the spacing is not to scale.

    Raises:
        ConfigError: no pool size, or a series whose length differs from ``pool_sizes``'.
    """
    pool_sizes = list(pool_sizes)
    if not pool_sizes:
        raise ConfigError("hit_rate_figure needs at least one pool size")
    for name, ys in series.items():
        if len(ys) != len(pool_sizes):
            raise ConfigError(f"series {name!r} has {len(ys)} values for {len(pool_sizes)} pool sizes")
    fig = go.Figure()
    order = sorted(range(len(pool_sizes)), key=lambda i: pool_sizes[i])     # smallest pool at the left
    pool_sizes = [pool_sizes[i] for i in order]
    positions = list(range(len(pool_sizes)))
    for k, (name, ys) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=positions, y=[list(ys)[i] for i in order], name=name, mode="lines+markers",
                                 customdata=[f"{p:,}" for p in pool_sizes],
                                 hovertemplate=f"{name}<br>%{{customdata}} blocks: hit rate %{{y:.0%}}<extra></extra>",
                                 line=dict(color=seq_color(k))))
    fig.update_xaxes(tickvals=positions, ticktext=[f"{p:,}" for p in pool_sizes], range=[-0.3, len(pool_sizes) - 0.7],
                     title=f"{xaxis}, evenly spaced, not to scale")
    fig.update_yaxes(range=[0, 1], title=yaxis)
    head = wrap_title(title)
    extra = 18 * head.count("<br>")
    fig.update_layout(title=dict(text=head, x=0.01, font=dict(size=14)), height=380 + extra,
                      legend=dict(orientation="h", y=-0.3), margin=dict(l=60, r=20, t=60 + extra, b=100))
    return fig
