"""The causal attention triangle of one decoding step (chapters 1 and 2), as a static figure.

Step ``t`` of decoding needs the scores of the newest query (row ``t``) against the keys of tokens
``1..t``.  Two ways to get them:

* **recompute** (chapter 1): the model runs over all ``t`` tokens again, so it builds the K and V
  of every token again (the strip above the grid) and scores the whole causal ``t x t`` triangle,
  although only the last row feeds the next token;
* **cached** (chapter 2): K/V of tokens ``1..t-1`` are read from the cache, only token ``t``'s
  K/V is made and written, and only the last row of scores is computed.

The grid is drawn to a fixed size (``t_max``) with a slider over ``t`` (plotly frames), so it
works in a static page.  Cell categories and their colours are :data:`CELL_KINDS`.  Follows the
decoding loop of :mod:`paged_kv.decoding.decoders`; the picture is the standard one of Vaswani et
al. 2017 (Fig. 2, causal mask) and Pope et al. 2022 (§2, KV cache).
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from ..errors import ConfigError
from ..validate import count
from .controls import add_replay_controls, frame_steps
from .palette import COLORS, FREE_COLOR, discrete_scale, tint

__all__ = ["CELL_KINDS", "attention_step_cells", "attention_triangle_figure"]

# (label, colour) per cell category; the index is the heatmap's value.
CELL_KINDS = [
    ("masked (future token) or beyond t", "#FFFFFF"),
    ("score computed again (an old query's row)", tint(COLORS[0], 0.45)),
    ("score of the new query (the only row the next token needs)", COLORS[1]),
    ("not computed", FREE_COLOR),
    ("K/V computed again", COLORS[3]),
    ("K/V read from the cache", COLORS[2]),
    ("K/V of the new token (made and written once)", COLORS[5]),
]


def attention_step_cells(t: int, t_max: int, mode: str) -> list[list[int]]:
    """The categories (indices into :data:`CELL_KINDS`) of step ``t``'s picture.

    Row 0 is the K/V strip (one cell per key token); rows ``1..t_max`` are the query rows, column
    ``j`` the key of token ``j + 1``.  Returns ``t_max + 1`` rows of ``t_max`` ints.

    Raises:
        ConfigError: ``t`` outside ``[1, t_max]`` or an unknown ``mode`` (``"recompute"``,
            ``"cached"``).
    """
    t_max = count("t_max", t_max, 1)
    t = count("t", t, 1)
    if t > t_max:
        raise ConfigError(f"t must be in [1, t_max={t_max}], got {t}")
    if mode not in ("recompute", "cached"):
        raise ConfigError(f"mode must be 'recompute' or 'cached', got {mode!r}")
    strip = [(6 if j == t - 1 else (4 if mode == "recompute" else 5)) if j < t else 0 for j in range(t_max)]
    rows = [strip]
    for i in range(1, t_max + 1):
        row = []
        for j in range(t_max):
            if i > t or j >= i:          # beyond this step, or a future key (causal mask)
                row.append(0)
            elif i == t:
                row.append(2)
            else:
                row.append(1 if mode == "recompute" else 3)
        rows.append(row)
    return rows


def _counts(t: int, mode: str) -> str:
    """The title of step ``t``: what it computes per layer and head.  Recompute: the ``t(t+1)/2``
    scores of the causal triangle are needed, but the torch path (a causal mask on the full
    matrix) computes all ``t^2`` and masks the rest, so both are named."""
    if mode == "cached":
        return f"step t = {t}, per layer and head:<br>{t} score{'s' if t > 1 else ''} and 1 K/V pair computed"
    needed = t * (t + 1) // 2
    return (f"step t = {t}, per layer and head: {t} K/V pair{'s' if t > 1 else ''}<br>and {needed} scores "
            f"(the triangle) computed again;<br>the torch path computes all {t * t}, then masks {t * t - needed}")


def attention_triangle_figure(mode: str, t_values: Sequence[int] = tuple(range(2, 13)),
                              active: int | None = None) -> go.Figure:
    """Step ``t`` of decoding as a grid (queries down, keys across) under a K/V strip, with a
    slider over ``t_values`` (static frames).  ``mode``: ``"recompute"`` or ``"cached"``.

    The title counts what the step computes per layer and head: ``t`` K/V pairs and the
    ``t(t+1)/2`` scores of the triangle, and the ``t^2`` the torch path computes before masking
    (recompute), or ``t`` scores and one K/V pair (cached).

    Raises:
        ConfigError: an unknown mode or empty / non-positive ``t_values``.
    """
    t_values = [count("t", t, 1) for t in t_values]
    if not t_values:
        raise ConfigError("t_values must not be empty")
    t_max = max(t_values)
    active = len(t_values) // 2 if active is None else active
    labels = ["K/V"] + [f"q{i}" for i in range(1, t_max + 1)]
    n = len(CELL_KINDS)
    scale = discrete_scale([c for _, c in CELL_KINDS])

    def heat(t):
        z = attention_step_cells(t, t_max, mode)
        text = [[CELL_KINDS[v][0] for v in row] for row in z]
        return go.Heatmap(z=z, x=[f"k{j}" for j in range(1, t_max + 1)], y=labels, zmin=-0.5, zmax=n - 0.5,
                          colorscale=scale, showscale=False, xgap=2, ygap=2, customdata=text,
                          hovertemplate="%{y} × %{x}: %{customdata}<extra></extra>", name="cells")

    t0 = t_values[active]
    fig = go.Figure([heat(t0)])
    # the legend: one invisible marker per category used in this mode
    used = [1, 2, 4, 6] if mode == "recompute" else [2, 3, 5, 6]
    for k in used:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=CELL_KINDS[k][0],
                                 marker=dict(size=12, symbol="square", color=CELL_KINDS[k][1],
                                             line=dict(width=1, color="#888"))))
    fig.frames = [go.Frame(name=f"t={t}", data=[heat(t)], traces=[0],
                           layout=dict(title=dict(text=_counts(t, mode))))
                  for t in t_values]
    add_replay_controls(fig, frame_steps([f"t={t}" for t in t_values], [str(t) for t in t_values]), active,
                        dict(prefix="step t = "), frame_ms=700, pad_top=10,
                        slider=dict(pad=dict(t=10, l=60)))   # clear of the play button at any width
    fig.update_layout(
        title=dict(text=_counts(t0, mode), font=dict(size=13)), height=600,
        margin=dict(l=40, r=10, t=40 + 17 * _counts(t0, mode).count("<br>") + 45, b=210), plot_bgcolor="#D8D8D8",
        xaxis=dict(side="top", title=None, tickfont=dict(size=10), fixedrange=True, showgrid=False,
                   zeroline=False, constrain="domain"),  # the square grid, no background beside it
        yaxis=dict(autorange="reversed", tickfont=dict(size=10), fixedrange=True, scaleanchor="x",
                   showgrid=False, zeroline=False),
        legend=dict(orientation="h", y=-0.02, yanchor="top", x=0, font=dict(size=11)))
    fig.update_layout(sliders=[{**fig.layout.sliders[0].to_plotly_json(), "y": -0.42, "x": 0.1, "len": 0.9}],
                      updatemenus=[{**fig.layout.updatemenus[0].to_plotly_json(), "y": -0.42}])
    return fig
