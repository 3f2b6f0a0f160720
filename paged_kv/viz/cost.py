"""What decoding costs, as figures (chapters 1 and 2): FLOPs per step split into linear layers and
attention, cumulative FLOPs on log-log axes with slope guides, per-step cost on a log *and* a
linear axis, and the roofline bound on decode throughput with the memory wall (the largest batch
that fits).

Figures from plain data (lists of numbers the chapters compute with
:func:`paged_kv.decoding.forward_flops`, :func:`~paged_kv.decoding.profile_decoding` and
:mod:`paged_kv.memory.decode_cost`).  Lines and areas only: no bars on log axes.
"""

from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..errors import ConfigError
from .labels import log_ticks, wrap_title
from .palette import COLORS, seq_color

__all__ = ["attention_timing_figure", "flops_split_figure", "roofline_figure", "scaling_figure",
           "step_cost_figure"]

_LEGEND = dict(orientation="h", y=-0.22, yanchor="top", x=0)
_MARGIN = dict(l=60, r=15, t=75, b=40)


def _title(text: str, width: int = 38) -> str:
    """``text`` broken with ``<br>`` at spaces into lines of at most ``width`` characters where it
    can be (a title wider than a 400 px phone is cut off by plotly): :func:`~.labels.wrap_title`."""
    return wrap_title(text, width)


def _log_axis(values: Sequence[float]) -> dict:
    """A log axis's tick settings over ``values``, every tick labelled (:func:`~.labels.log_ticks`,
    the one home of that rule); none when no value is > 0."""
    if not any(v is not None and v > 0 for v in values):
        return {}
    vals, texts = log_ticks(values)
    return {"tickvals": vals, "ticktext": texts}


def _same_length(x, *ys) -> None:
    for y in ys:
        if len(y) != len(x):
            raise ConfigError(f"series of {len(y)} values against {len(x)} x values")


def flops_split_figure(ctx: Sequence[int], linear: Sequence[float], attention: Sequence[float],
                       counted: Sequence[float] | None = None, unit: str = "MFLOP",
                       title: str = "FLOPs per recompute step") -> go.Figure:
    """Stacked areas "linear layers" and "attention" against the context ``t``, with the counted
    FLOPs (counted from the ops that ran) as markers on top (they should sit on the stack's edge).

    Raises:
        ConfigError: series of different lengths.
    """
    _same_length(ctx, linear, attention, *([counted] if counted is not None else []))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(ctx), y=list(linear), name="linear layers (formula)", mode="lines",
                             stackgroup="flops", line=dict(color=COLORS[0], width=0.5)))
    fig.add_trace(go.Scatter(x=list(ctx), y=list(attention), name="attention (formula)", mode="lines",
                             stackgroup="flops", line=dict(color=COLORS[1], width=0.5)))
    if counted is not None:
        step = max(1, len(ctx) // 25)
        fig.add_trace(go.Scatter(x=list(ctx)[::step], y=list(counted)[::step], mode="markers",
                                 name="counted",
                                 marker=dict(color="#222", size=6, symbol="x")))
    fig.update_layout(title=_title(title), xaxis_title="tokens in the sequence (t)", yaxis_title=f"{unit} per step",
                      height=400, margin=_MARGIN, legend=_LEGEND)
    return fig


def scaling_figure(n: Sequence[int], series: dict[str, Sequence[float]], crossovers: dict[str, int] | None = None,
                   title: str = "Cumulative FLOPs of recompute decoding", unit: str = "FLOPs",
                   guides: dict[int, str] | None = None) -> go.Figure:
    """Log-log lines of cumulative cost against ``n`` generated tokens, with dashed guides of the
    given slopes, each through the first point of a series (``guides``: slope -> series label;
    default: slopes 2 and 3 through the first series), and vertical marks at the ``crossovers``
    (label -> n).

    Raises:
        ConfigError: series of different lengths, non-positive values (log axes), or a guide
            through an unknown series.
    """
    _same_length(n, *series.values())
    if min(n) <= 0 or any(min(y) <= 0 for y in series.values()):
        raise ConfigError("log-log axes need positive n and values")
    first = next(iter(series))
    guides = guides or {2: first, 3: first}
    unknown = [g for g in guides.values() if g not in series]
    if unknown:
        raise ConfigError(f"guides through unknown series {unknown}; series: {list(series)}")
    fig = go.Figure()
    for i, (label, y) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=list(n), y=list(y), name=label, mode="lines",
                                 line=dict(color=seq_color(i), width=3)))
    for slope, label in sorted(guides.items()):
        y0 = series[label][0]
        fig.add_trace(go.Scatter(x=[n[0], n[-1]], y=[y0, y0 * (n[-1] / n[0]) ** slope],
                                 name=f"slope {slope} (∝ n{'²' if slope == 2 else ('³' if slope == 3 else slope)})",
                                 mode="lines", line=dict(color="#555", dash="dash" if slope == 2 else "dot", width=1.5)))
    for i, (label, x) in enumerate((crossovers or {}).items()):
        fig.add_vline(x=x, line=dict(color="#444", width=1, dash="dashdot"))
        fig.add_annotation(x=math.log10(x), y=0.98 - 0.1 * i, yref="paper", xanchor="right", showarrow=False,
                           text=f"{label}: {x:,}", font=dict(size=11), bgcolor="rgba(255,255,255,0.85)")
    values = [v for y in series.values() for v in y]
    span = math.log10(max(values) / min(values))
    fig.update_layout(title=_title(title), height=430, margin=_MARGIN, legend=_LEGEND,
                      xaxis=dict(type="log", title="tokens generated (n)", dtick=1),
                      yaxis=dict(type="log", title=unit, dtick=1 if span <= 6 else 3, exponentformat="power"))
    return fig


def step_cost_figure(ctx: Sequence[int], series: dict[str, Sequence[float]], unit: str,
                     title: str, prefill_label: str | None = "prefill (the whole prompt)") -> go.Figure:
    """Per-step cost of every series on a log axis (top), and the *last* series alone on a linear
    axis (bottom, decode steps only, the axis fitted to its values and labelled so), where the
    growth of a cached step is visible; the first point is labelled as the prefill.

    Raises:
        ConfigError: series of different lengths or fewer than 2 steps.
    """
    _same_length(ctx, *series.values())
    if len(ctx) < 2:
        raise ConfigError("need at least 2 steps")
    last_label = list(series)[-1]
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.16,
                        subplot_titles=("log scale: every step",
                                        f"linear: {last_label} alone (axis not from 0)"))
    for i, (label, y) in enumerate(series.items()):
        color = seq_color(i)
        fig.add_trace(go.Scatter(x=list(ctx), y=list(y), name=label, mode="lines+markers", marker=dict(size=3),
                                 line=dict(color=color), legendgroup=label), row=1, col=1)
        if label == last_label:
            fig.add_trace(go.Scatter(x=list(ctx)[1:], y=list(y)[1:], name=label, mode="lines+markers",
                                     showlegend=False, marker=dict(size=3), line=dict(color=color),
                                     legendgroup=label), row=2, col=1)
    if prefill_label:
        last = list(series.values())[-1]
        fig.add_annotation(x=ctx[0], y=math.log10(last[0]), xref="x", yref="y", text=prefill_label,
                           showarrow=True, arrowhead=2, ax=60, ay=-25, font=dict(size=11))  # log axis: log10(y)
    fig.update_yaxes(type="log", title_text=unit, row=1, col=1, exponentformat="power",
                     **_log_axis([v for y in series.values() for v in y]))
    fig.update_yaxes(title_text=unit, row=2, col=1)
    fig.update_xaxes(title_text="tokens in the sequence (t)", row=2, col=1)
    fig.update_layout(title=_title(title), height=620, margin=_MARGIN, legend=dict(orientation="h", y=-0.1, yanchor="top"))
    fig.update_annotations(font_size=12)
    return fig


def roofline_figure(contexts: Sequence[int], tokens_per_s: dict[str, Sequence[float | None]], title: str,
                    wall: Sequence[tuple[int, float]] | None = None,
                    compute_roof: Sequence[float] | None = None) -> go.Figure:
    """The roofline bound on decode throughput (tokens/s) against the context, one line per
    batch (label -> values over ``contexts``; ``None`` where that batch does not fit, so its line
    ends there), log-log.

    ``wall``: per context, ``(largest batch that fits, its bound in tokens/s)``
    (:func:`paged_kv.memory.max_decode_throughput`), drawn as the memory wall with its batch
    written at each point and the region above it shaded (batches whose KV cache does not fit);
    a context where nothing fits (batch 0) is left out.  ``compute_roof``: tokens/s if compute
    alone limited (any batch), a dashed line; with both, a line under the title says what the
    shading and the gap between them mean (KV capacity, not arithmetic, caps tokens/s).

    Raises:
        ConfigError: series of different lengths or non-positive values.
    """
    _same_length(contexts, *tokens_per_s.values(), *([wall] if wall is not None else []),
                 *([compute_roof] if compute_roof is not None else []))
    values = [v for y in tokens_per_s.values() for v in y if v is not None]
    if any(v <= 0 for v in values) or (compute_roof is not None and min(compute_roof) <= 0):
        raise ConfigError("tokens/s must be positive (log axis)")
    fig = go.Figure()
    for i, (label, y) in enumerate(tokens_per_s.items()):
        fig.add_trace(go.Scatter(x=list(contexts), y=[v for v in y], name=label, mode="lines+markers",
                                 marker=dict(size=5), line=dict(color=seq_color(i)),
                                 connectgaps=False))
    layout_y = dict(type="log", title="at most tokens/s (whole batch)", dtick=1, exponentformat="power")
    if compute_roof is not None:
        fig.add_trace(go.Scatter(x=list(contexts), y=list(compute_roof), name="compute roof (any batch)",
                                 mode="lines", line=dict(color="#555", dash="dash", width=1.5)))
        values += list(compute_roof)
    if wall is not None:
        pts = [(c, b, v) for c, (b, v) in zip(contexts, wall) if b > 0]
        if any(v <= 0 for _, _, v in pts):
            raise ConfigError("the wall's tokens/s must be positive where a batch fits")
        if pts:
            values += [v for _, _, v in pts]
            top = 10 ** (math.log10(max(values)) + 0.35)         # room for the labels above the wall
            xs, ys = [c for c, _, _ in pts], [v for _, _, v in pts]
            fig.add_trace(go.Scatter(x=xs + xs[::-1], y=ys + [top] * len(xs), fill="toself", mode="none",
                                     fillcolor="rgba(120,120,120,0.18)", hoverinfo="skip",
                                     name="batch does not fit in memory"))
            fig.add_trace(go.Scatter(x=xs, y=ys, name="memory wall (largest batch that fits)",
                                     mode="lines+markers+text", text=[f"B={b:,}" for _, b, _ in pts],
                                     textposition=["top right"] + ["top center"] * (len(pts) - 1),
                                     textfont=dict(size=10, color="#222"),   # the first clear of the axis
                                     customdata=[b for _, b, _ in pts],
                                     hovertemplate="t = %{x:,}: at most %{customdata:,} sequences fit, "
                                                   "%{y:,.0f} tokens/s<extra></extra>",
                                     marker=dict(size=7, color="#222"), line=dict(color="#222", width=3)))
            layout_y["range"] = [math.log10(min(values)) - 0.15, math.log10(top)]

    text, margin = _title(title), dict(_MARGIN)
    if wall is not None and compute_roof is not None:   # the figure says what the gap means
        note = _title("Shaded: batches whose KV cache does not fit. Between the wall and the roof, "
                      "KV capacity, not arithmetic, caps tokens/s.", 54)
        text += f"<br><span style='font-size:12px'>{note}</span>"
        margin["t"] += 18 * (note.count("<br>") + 1)
    height = 480 + margin["t"] - _MARGIN["t"] if wall is not None else 420
    fig.update_layout(title=dict(text=text, y=1 - 24 / height, yanchor="top"), height=height, margin=margin,
                      legend=_LEGEND,
                      xaxis=dict(type="log", title="context per sequence (t, tokens)", tickvals=list(contexts),
                                 ticktext=[f"{c:,}" for c in contexts]),
                      yaxis=layout_y)
    return fig


def attention_timing_figure(context_lens: Sequence[int], ms: Sequence[float], bytes_read: Sequence[int],
                            title: str, label: str = "measured (median)") -> go.Figure:
    """Measured time of one decode-attention layer against the context, log-log, with a slope-1
    guide: the bytes read (``bytes_read``, exact) at the bandwidth reached at the longest context,
    so the guide passes through that point and a time proportional to the bytes lies on it.

    Raises:
        ConfigError: series of different lengths or non-positive values.
    """
    _same_length(context_lens, ms, bytes_read)
    if min(context_lens) <= 0 or min(ms) <= 0 or min(bytes_read) <= 0:
        raise ConfigError("log-log axes need positive lengths, times and bytes")
    per_byte = ms[-1] / bytes_read[-1]                      # ms per byte at the longest context
    guide = [b * per_byte for b in bytes_read]
    gbs = [b / (m * 1e6) for b, m in zip(bytes_read, ms)]   # bytes per ms / 1e6 = GB/s
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(context_lens), y=guide, mode="lines", line=dict(color="#555", dash="dash"),
                             name=f"∝ bytes read (slope 1), at {gbs[-1]:.1f} GB/s"))
    fig.add_trace(go.Scatter(x=list(context_lens), y=list(ms), mode="lines+markers", name=label,
                             marker=dict(size=7, color=COLORS[0]), line=dict(color=COLORS[0]),
                             customdata=[[b / 2**20, g] for b, g in zip(bytes_read, gbs)],
                             hovertemplate="t = %{x:,}: %{y:.2f} ms, %{customdata[0]:.0f} MiB read, "
                                           "%{customdata[1]:.1f} GB/s<extra></extra>"))
    fig.update_layout(title=_title(title), height=420, margin=_MARGIN, legend=_LEGEND,
                      xaxis=dict(type="log", title="cached tokens (t)", tickvals=list(context_lens),
                                 ticktext=[f"{c:,}" for c in context_lens]),
                      yaxis=dict(type="log", title="ms per call", **_log_axis(list(ms) + guide)))
    return fig
