"""The KV-cache calculator's figures (chapter 3): the static calculator, and one GPU's memory.

:func:`calculator_figure` is the calculator of the static book: every case precomputed by
:func:`calculator_data` with :func:`paged_kv.memory.plan_memory`, and three plotly controls (a
model dropdown, a GPU dropdown, a context slider) that change three different properties, so any
combination shows consistent numbers with no kernel.  The cache is paged in whole blocks of
:data:`~paged_kv.defaults.BLOCK_SIZE` tokens (vLLM's default), so a sliding-window layer holds
the blocks vLLM's manager keeps (:mod:`paged_kv.memory.window`), not ``window / 16`` of them;
the model note says how many.  :func:`gpu_memory_figure` draws one GPU's
memory (weights, reserve, KV cache, free); the live calculator (:mod:`paged_kv.widgets.memory`)
redraws it as its inputs change.  Rows beyond a model's declared maximum context are greyed out
and say so.
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import memory
from ..defaults import BLOCK_SIZE, RESERVE_FRACTION
from ..errors import ConfigError
from ..units import GiB, KiB, MiB, format_bytes
from .controls import layout_path, trace_indices
from .memory import CONTEXTS, kv_shape, token_label
from .palette import COLORS, seq_color

__all__ = ["BEYOND_MARK", "CALC_COLUMNS", "CALC_CONTEXTS", "CALC_HEADERS", "DASH", "GREY", "HIGHLIGHT", "MARKER_COLOR",
           "NO_ROOM", "calculator_data", "calculator_figure", "gpu_memory_figure", "gpu_memory_parts"]

CALC_CONTEXTS = [256, *CONTEXTS]  # 256: the bundled tiny model's whole context (max_seq_len)
GREY = "#A0A0A0"
BEYOND_MARK = "\u00a0†"  # a row beyond the model's maximum context (a no-break space: one line on a phone)
CALC_COLUMNS = ["context (tokens)", "KV / sequence", "share of one GPU", "max batch",
                "max batch, fp8 KV", "max batch, TP=8"]
# the same columns as shown: two short lines each, so the table keeps one line per row on a phone
CALC_HEADERS = ["context<br>(tokens)", "KV /<br>sequence", "share of<br>one GPU", "max<br>batch",
                "max<br>batch<br>fp8 KV", "max<br>batch<br>TP=8"]
NO_ROOM = "✗"  # the weights alone do not fit
DASH = "–"  # a row beyond the model's maximum context
TP_DASHES = ["solid", "dash", "dot", "dashdot", "longdash"]
TP_SYMBOLS = ["circle", "square", "diamond", "x", "triangle-up"]
HIGHLIGHT = "#FFF3C4"      # the highlighted row; the context marker is MARKER_COLOR: neither is a series colour
MARKER_COLOR = "#222222"
NOTHING_FITS = "nothing fits on this GPU at any context shown<br>(the weights alone, or the heads do not split)"


def _binary(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1, three significant digits
    (a table cell that stays on one line on a phone): "64 MiB", "1 GiB", "56.7 GiB"."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            v = n / size
            return f"{v:,.0f} {unit}" if v >= 100 or v == int(v) else f"{v:.3g} {unit}"
    return f"{n:,.0f} B"


def _fit(spec, gpu: str, context: int, kv_dtype: str = "fp16", tp: int = 1, block_size: int = BLOCK_SIZE):
    """Max batch; -1 when the weights alone do not fit; None when ``tp`` cannot split the heads."""
    try:
        plan = memory.plan_memory(spec, gpu, context, 1, kv_dtype, tp=tp, block_size=block_size)
    except ConfigError:
        return None
    return plan.max_batch_size if plan.weights_fit else -1


def calculator_data(models: Sequence[str], gpus: Sequence[str], contexts: Sequence[int] = CALC_CONTEXTS,
                    tps: Sequence[int] = (1, 2, 4, 8, 16), block_size: int = BLOCK_SIZE) -> dict:
    """Every case of the static calculator, precomputed with :func:`paged_kv.memory.plan_memory`
    (fp16 KV unless said, weights in their serving dtype, 10% reserve, the cache in whole blocks
    of ``block_size`` tokens: a sliding-window layer at its peak, ``window_blocks`` at most).  A
    max batch of -1 means the weights alone do not fit; ``None``, that the heads cannot be split
    over that many GPUs.  ``beyond`` marks a context past the model's ``max_position`` (computed,
    but not servable)."""
    out = {"models": {}, "gpus": {}, "contexts": list(contexts), "tps": list(tps), "block_size": block_size}
    for g in gpus:
        spec = memory.gpu_preset(g)
        out["gpus"][spec.name] = {"marketed": spec.marketed, "memory_bytes": spec.memory_bytes}
    for name in models:
        spec = memory.model_preset(name)
        m = out["models"][spec.name] = {
            "kind": spec.attention_kind, "source": spec.source, "weights_dtype": spec.weights_dtype,
            "per_token": memory.kv_bytes_per_token(spec),
            "per_token_fp8": memory.kv_bytes_per_token(spec, "fp8"),
            "weights": memory.weights_bytes(spec), "shape": kv_shape(spec), "layers": spec.num_layers,
            "head_dim": spec.head_dim, "window": spec.sliding_window, "sliding_layers": spec.sliding_layers,
            "window_blocks": (memory.window_max_blocks(spec.sliding_window, block_size)
                              if spec.sliding_window else None), "block_size": block_size,
            "max_position": spec.max_position, "cases": {}}
        for g in out["gpus"]:
            gpu_bytes = out["gpus"][g]["memory_bytes"]
            per_seq = {c: memory.kv_cache_bytes(spec, c, 1, block_size=block_size) for c in contexts}
            m["cases"][g] = [{
                "context": c, "beyond": not spec.within_max_context(c),
                "per_seq": per_seq[c], "share": per_seq[c] / gpu_bytes,
                "batch": _fit(spec, g, c, block_size=block_size),
                "batch_fp8": _fit(spec, g, c, "fp8", block_size=block_size),
                "batch_tp": {tp: _fit(spec, g, c, tp=tp, block_size=block_size) for tp in tps}} for c in contexts]
    return out


def _fmt_batch(b) -> str:
    return "-" if b is None else (NO_ROOM if b < 0 else f"{b:,}")


def _fmt_share(share: float) -> str:
    pct = 100 * share
    return f"{pct:,.2f}%" if pct >= 0.01 else f"{pct:.1g}%"


def _table_columns(rows: list) -> list:
    """The table's columns; a row beyond the model's maximum context keeps only its context."""
    def col(fmt):
        return [DASH if r["beyond"] else fmt(r) for r in rows]
    return [[f"{r['context']:,}" + (BEYOND_MARK if r["beyond"] else "") for r in rows],
            col(lambda r: _binary(r["per_seq"])),
            col(lambda r: _fmt_share(r["share"])),
            col(lambda r: _fmt_batch(r["batch"])),
            col(lambda r: _fmt_batch(r["batch_fp8"])),
            col(lambda r: _fmt_batch(r["batch_tp"].get(8)))]


def _font_colors(rows: list) -> list:
    column = [GREY if r["beyond"] else "#222" for r in rows]
    return [column] * len(CALC_COLUMNS)


def _model_note(name: str, m: dict) -> str:
    # the window on a line of its own, with the whole blocks a sliding layer holds at most
    window = (f"<br>sliding window {m['window']:,} on {m['sliding_layers']} layers, each "
              f"≤ {m['window_blocks']:,} blocks of {m['block_size']}" if m["window"] else "")
    cached = m["shape"] if m["kind"] == "MLA" else f"{m['shape']} x {m['head_dim']}"
    top = (f"max context {m['max_position']:,} tokens (grey rows{BEYOND_MARK}: beyond it)"
           if m["max_position"] else "max context not declared")
    return (f"<b>{name}</b>: {m['kind']}, {m['layers']} layers x {cached}"
            f"<br><i>{m['source']}</i><br>KV per token: {m['per_token']:,} B in fp16, "
            f"{m['per_token_fp8']:,} B in fp8{window}<br>{top}"
            f"<br>weights ({m['weights_dtype']}): {format_bytes(m['weights'], 'auto')}")


def _gpu_note(name: str, g: dict) -> str:
    return (f"<b>{name}</b> (sold as \"{g['marketed']}\"): {format_bytes(g['memory_bytes'], 'auto')}"
            f"<br>per GPU, {RESERVE_FRACTION:.0%} kept for activations; TP=1, fp16 KV unless"
            f"<br>a column says; {NO_ROOM}: the weights do not fit; -: heads do not split")


def _row_fills(n: int, active: int) -> list:
    column = [HIGHLIGHT if i == active else ("#F7F7F7" if i % 2 else "white") for i in range(n)]
    return [column] * len(CALC_COLUMNS)


def _line_y(m: dict, g: str, tp: int) -> list:
    """Max batch at TP=``tp`` for the chart: gaps where nothing fits or beyond max context."""
    return [r["batch_tp"][tp] if r["batch_tp"][tp] and r["batch_tp"][tp] > 0 and not r["beyond"]
            else None for r in m["cases"][g]]


def _nothing_fits_y(m: dict, g: str, tps: Sequence[int]) -> list:
    """The "nothing fits" note's y: ``[1]`` (shown) when no TP line of ``g`` has a point, else ``[None]``."""
    return [None] if any(v is not None for tp in tps for v in _line_y(m, g, tp)) else [1]


def calculator_figure(data: dict, model: str | None = None, gpu: str | None = None,
                      context_index: int | None = None) -> go.Figure:
    """The static calculator: a model dropdown (restyles the data), a GPU dropdown (shows that
    GPU's table and curves) and a context slider (highlights a row and marks the chart).

    The three controls change three different properties (data, visibility, row colour and a
    shape), so any combination of choices shows consistent numbers with no kernel.
    ``context_index`` is the row highlighted first (default: 8,192 tokens if listed).  The TP lines
    differ in dash and marker (they often coincide: the cache per GPU stops shrinking once each
    GPU holds one KV head), and stop at the model's maximum context.
    """
    models, gpus, contexts, tps = list(data["models"]), list(data["gpus"]), data["contexts"], data["tps"]
    model, gpu = model or models[0], gpu or gpus[0]
    if context_index is None:
        context_index = contexts.index(8192) if 8192 in contexts else 0
    xs = list(range(len(contexts)))
    fig = make_subplots(rows=2, cols=1, row_heights=[0.56, 0.44], vertical_spacing=0.1,
                        specs=[[{"type": "table"}], [{"type": "xy"}]])
    # Per GPU, one table (named "table: <GPU>") and one line per TP degree; each trace's meta says
    # which, and the controls find traces, annotations and the marker by those names.
    sizes = [11 - 2 * j for j in range(len(tps))]  # nested markers stay visible when lines coincide

    for g in gpus:
        visible = g == gpu
        rows = data["models"][model]["cases"][g]
        fig.add_trace(go.Table(
            name=f"table: {g}", meta=dict(kind="table", gpu=g),
            header=dict(values=[f"<b>{c}</b>" for c in CALC_HEADERS], fill_color="#E8EEF6", font=dict(size=10),
                        height=46),
            cells=dict(values=_table_columns(rows), fill_color=_row_fills(len(rows), context_index),
                       font=dict(size=10, color=_font_colors(rows)), height=20),
            columnwidth=[1.05, 1.3, 1.0, 0.8, 0.95, 0.9], visible=visible), row=1, col=1)
        for j, tp in enumerate(tps):
            fig.add_trace(go.Scatter(
                meta=dict(kind="line", gpu=g, tp=tp),
                x=xs, y=_line_y(data["models"][model], g, tp), mode="lines+markers", name=f"TP={tp}",
                line=dict(color=seq_color(j), dash=TP_DASHES[j % len(TP_DASHES)]),
                marker=dict(symbol=TP_SYMBOLS[j % len(TP_SYMBOLS)], size=max(sizes[j], 4)),
                visible=visible, legendgroup=f"tp{tp}", showlegend=True,
                hovertemplate=f"TP={tp}: %{{y:,}} sequences<extra></extra>"), row=2, col=1)
        fig.add_trace(go.Scatter(   # said in the chart, not an empty chart with a stale axis
            meta=dict(kind="note", gpu=g), x=[(len(xs) - 1) / 2], y=_nothing_fits_y(data["models"][model], g, tps),
            mode="text", text=[NOTHING_FITS], textfont=dict(size=13, color="#B00"), showlegend=False,
            hoverinfo="skip", visible=visible, name=f"nothing fits: {g}"), row=2, col=1)

    fig.add_shape(type="line", x0=context_index, x1=context_index, y0=0, y1=1, xref="x", yref="y domain",
                  line=dict(color=MARKER_COLOR, dash="dot", width=1.5), name="context marker")
    note = dict(xref="paper", yref="paper", x=0, xanchor="left", yanchor="top", showarrow=False,
                align="left", font=dict(size=11))
    fig.update_layout(annotations=[
        dict(text=_model_note(model, data["models"][model]), y=1.33, name="model note", **note),
        dict(text=_gpu_note(gpu, data["gpus"][gpu]), y=1.16, name="GPU note", **note),
        dict(text="<b>model</b>", x=0, y=1.395, xref="paper", yref="paper", xanchor="right",
             yanchor="top", showarrow=False, name="model label"),
        dict(text="<b>GPU</b>", x=0.5, y=1.395, xref="paper", yref="paper", xanchor="right",
             yanchor="top", showarrow=False, name="GPU label")])
    order = [(t.meta["kind"], t.meta["gpu"], t.meta.get("tp")) for t in fig.data]
    table_idx = trace_indices(fig, [f"table: {g}" for g in gpus])
    model_note = layout_path(fig, "annotations", "model note", "text")
    gpu_note = layout_path(fig, "annotations", "GPU note", "text")
    marker_x0 = layout_path(fig, "shapes", "context marker", "x0")
    marker_x1 = layout_path(fig, "shapes", "context marker", "x1")

    def model_args(name: str) -> list:
        m = data["models"][name]
        cells, colors, ys = [], [], []
        for kind, g, tp in order:
            cells.append(_table_columns(m["cases"][g]) if kind == "table" else None)
            colors.append(_font_colors(m["cases"][g]) if kind == "table" else None)
            ys.append(None if kind == "table" else (_nothing_fits_y(m, g, tps) if kind == "note"
                                                    else _line_y(m, g, tp)))
        return [{"cells.values": cells, "cells.font.color": colors, "y": ys},
                {model_note: _model_note(name, m)}]

    model_menu = [dict(label=name, method="update", args=model_args(name)) for name in models]
    gpu_menu = [dict(label=g, method="update",
                     args=[{"visible": [o[1] == g for o in order]},
                           {gpu_note: _gpu_note(g, data["gpus"][g])}]) for g in gpus]
    steps = [dict(label=token_label(c), method="update",
                  args=[{"cells.fill.color": [_row_fills(len(contexts), i)] * len(gpus)},
                        {marker_x0: i, marker_x1: i}, table_idx]) for i, c in enumerate(contexts)]
    fig.update_layout(
        height=980, margin=dict(l=45, r=5, t=250, b=140), title=None,
        updatemenus=[dict(buttons=model_menu, active=models.index(model), x=0, xanchor="left", y=1.41,
                          yanchor="top", direction="down"),
                     dict(buttons=gpu_menu, active=gpus.index(gpu), x=0.5, xanchor="left", y=1.41,
                          yanchor="top", direction="down")],
        sliders=[dict(active=context_index, steps=steps, currentvalue=dict(prefix="highlighted context: "),
                      pad=dict(t=10), y=-0.17)],
        # below the chart, never between the table and the chart: a table whose rows wrap on a phone
        # grows down into that gap, and a legend there covered its last rows (review D9)
        legend=dict(orientation="h", x=0.5, xanchor="center", y=-0.07, yanchor="top",
                    title_text="fp16 KV:"))
    fig.update_xaxes(tickvals=xs, ticktext=[token_label(c) for c in contexts], title_text="context length (tokens)", row=2, col=1)
    fig.update_yaxes(type="log", title_text="max concurrent sequences", row=2, col=1, dtick=1)
    return fig


# --- one GPU's memory, for the live calculator ----------------------------------------------------
def gpu_memory_parts(plan) -> dict:
    """Plain numbers of one GPU from a :class:`~paged_kv.memory.MemoryPlan` (bytes, per GPU)."""
    used = plan.weights_bytes + plan.reserve_bytes + plan.kv_bytes
    group = f"{plan.tp} x {plan.gpu}" if plan.pp == 1 else f"{plan.tp * plan.pp} x {plan.gpu} (PP={plan.pp})"
    return {"title": f"one of {group}: {plan.batch_size} x {plan.seq_len:,} tokens",
            "gpu_bytes": plan.gpu_bytes, "parts": {
                "weights": plan.weights_bytes, "reserve": plan.reserve_bytes,
                f"KV cache ({plan.kv_dtype})": plan.kv_bytes, "free": max(0, plan.gpu_bytes - used)}}


def gpu_memory_figure(parts: dict) -> go.Figure:
    """One horizontal stacked bar of a GPU's memory in GiB, with the card's capacity marked."""
    fig = go.Figure()
    colors = [COLORS[0], "#BAB0AC", COLORS[1], "#EEEEEE"]
    for (name, n), color in zip(parts["parts"].items(), colors):
        fig.add_trace(go.Bar(y=["GPU"], x=[n / GiB], name=name, orientation="h", marker_color=color,
                             hovertemplate=f"{name}: %{{x:,.2f}} GiB<extra></extra>"))
    cap = parts["gpu_bytes"] / GiB
    fig.add_vline(x=cap, line=dict(color="#E45756", dash="dash"), annotation_text=f"{cap:,.1f} GiB")
    # the unit on the ticks, not as an axis title that the legend below would cover; the legend in
    # the bars' order (review c5)
    fig.update_layout(barmode="stack", height=230, margin=dict(l=40, r=20, t=40, b=30),
                      title=dict(text=parts["title"], font=dict(size=13)), xaxis=dict(ticksuffix=" GiB"),
                      legend=dict(orientation="h", y=-0.35, yanchor="top", traceorder="normal"))
    return fig
