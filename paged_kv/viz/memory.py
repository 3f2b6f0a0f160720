"""Chapter 3's figures: KV cache vs weights, sequences per GPU, attention variants (the
calculator's are :mod:`paged_kv.viz.calculator`).

Each figure has a ``*_data`` function that asks :mod:`paged_kv.memory` for the numbers and
returns plain dicts/lists, and a ``*_figure`` function that only draws them (so a figure can be
rebuilt from stored data with no package state).  Interaction is plotly's own (dropdown
``updatemenus``, sliders), so every figure works in the static HTML book with no kernel.

Contexts beyond a model's declared maximum (:attr:`~paged_kv.memory.ModelSpec.max_position`) are
never drawn as if the model could serve them: lines end at the maximum, and dots give way to a
"beyond max context" mark.
"""

from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go

from .. import memory
from ..defaults import BLOCK_SIZE, RESERVE_FRACTION
from ..units import GiB
from .palette import COLORS, seq_color

__all__ = ["BEYOND", "CONTEXTS", "attention_variants_data", "attention_variants_figure", "gpu_fit_data",
           "gpu_fit_figure", "kv_shape", "kv_vs_weights_data", "kv_vs_weights_figure", "token_label"]

CONTEXTS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
BEYOND = "beyond max context"


def token_label(n: int) -> str:
    """1024 -> "1K", 40960 -> "40K", 163840 -> "160K" (tokens; K = 1,024)."""
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    return f"{n / 1024:.1f}K" if n >= 1024 else str(n)


def kv_shape(spec) -> str:
    """What a token of ``spec`` caches per layer, in words: "8 KV heads", "latent 512 + rope 64"."""
    if spec.kv_lora_rank:
        return f"latent {spec.kv_lora_rank} + rope {spec.qk_rope_head_dim}"
    return f"{spec.num_kv_heads} KV head{'s' if spec.num_kv_heads > 1 else ''}"


def _within(max_position, context: int) -> bool:
    return max_position is None or context <= max_position


# --- KV cache vs weights as context grows ------------------------------------------------------
def kv_vs_weights_data(models: Sequence[str], contexts: Sequence[int] = CONTEXTS,
                       batch_sizes: Sequence[int] = (1, 8, 32), kv_dtype: str = "fp16") -> dict:
    """KV bytes and weight bytes of each model, only up to its maximum context.

    Each model gets its own ``contexts``: those of the argument up to its ``max_position``,
    then ``max_position`` itself if it lies inside the range and is not one of them;
    ``kv[batch][i]`` is the KV cache at ``contexts[i]``.
    """
    out = {"contexts": list(contexts), "batch_sizes": list(batch_sizes), "kv_dtype": kv_dtype,
           "models": {}}
    for name in models:
        spec = memory.model_preset(name)
        own = [c for c in contexts if spec.within_max_context(c)]
        if (spec.max_position is not None and spec.max_position not in own
                and spec.max_position < max(contexts)):
            own.append(spec.max_position)
        out["models"][spec.name] = {
            "weights": memory.weights_bytes(spec), "weights_dtype": spec.weights_dtype,
            "max_position": spec.max_position, "contexts": own,
            "kv": {b: [memory.kv_cache_bytes(spec, c, b, kv_dtype) for c in own]
                   for b in batch_sizes}}
    return out


def kv_vs_weights_figure(data: dict) -> go.Figure:
    """KV cache / weights (log-log) vs context; a dropdown picks the batch size."""
    fig = go.Figure()
    x, batches = data["contexts"], data["batch_sizes"]
    for i, (name, m) in enumerate(data["models"].items()):
        ratio = [kv / m["weights"] for kv in m["kv"][batches[0]]]
        ends = [c == m["max_position"] for c in m["contexts"]]
        fig.add_trace(go.Scatter(
            x=m["contexts"], y=ratio, name=name, mode="lines+markers",
            line=dict(color=seq_color(i)),
            marker=dict(size=[11 if e else 5 for e in ends],
                        symbol=["diamond" if e else "circle" for e in ends]),
            customdata=[[kv / GiB, m["weights"] / GiB] for kv in m["kv"][batches[0]]],
            hovertemplate=f"<b>{name}</b><br>%{{x:,}} tokens<br>KV %{{customdata[0]:,.2f}} GiB"
                          "<br>weights %{customdata[1]:,.2f} GiB<br>KV / weights %{y:.3g}"
                          "<extra></extra>"))
    buttons = []
    for b in batches:
        ys = [[kv / m["weights"] for kv in m["kv"][b]] for m in data["models"].values()]
        cd = [[[kv / GiB, m["weights"] / GiB] for kv in m["kv"][b]] for m in data["models"].values()]
        buttons.append(dict(label=f"batch {b}", method="restyle", args=[{"y": ys, "customdata": cd}]))
    fig.add_hline(y=1, line=dict(color="#444", dash="dash"), annotation_text="KV cache = weights",
                  annotation_position="top left")
    fig.update_layout(
        title=f"KV cache ({data['kv_dtype']}) / weights as the context grows"
              "<br><sup>◆ a model's maximum context: its line stops there<br>(no ◆: the maximum "
              "lies beyond the chart)</sup>",
        title_font_size=14,
        xaxis=dict(title="context length (tokens per sequence)", type="log", tickvals=x,
                   ticktext=[token_label(c) for c in x]),
        yaxis=dict(title="KV cache / weights", type="log", exponentformat="none", dtick=1), height=560,
        margin=dict(l=60, r=10, t=110, b=50),
        legend=dict(font=dict(size=10), orientation="h", y=-0.2, yanchor="top", x=0),
        updatemenus=[dict(buttons=buttons, direction="down", x=1.0, xanchor="right", y=1.01,
                          yanchor="bottom")])
    return fig


# --- how many sequences fit on each GPU --------------------------------------------------------
def gpu_fit_data(models: Sequence[str], gpus: Sequence[str], contexts: Sequence[int] = CONTEXTS[:6],
                 kv_dtype: str = "fp16", tp: int = 1, block_size: int | None = BLOCK_SIZE) -> dict:
    """``batch[context][gpu][model]``: sequences of that length that fit next to the weights
    (computed for every context; ``max_position[model]`` says which the model can serve), counted
    in whole blocks of ``block_size`` tokens as the calculator counts them (``None``: per token)."""
    specs = [memory.model_preset(m) for m in models]
    batch = {c: {g: [memory.max_batch_size(m, g, c, kv_dtype, tp=tp, block_size=block_size) for m in specs]
                 for g in gpus}
             for c in contexts}
    return {"models": [m.name for m in specs], "max_position": [m.max_position for m in specs],
            "gpus": list(gpus), "contexts": list(contexts), "kv_dtype": kv_dtype, "tp": tp,
            "batch": batch}


def _fit_bars(data: dict, c: int, g: str) -> tuple[list, list]:
    """Bar heights and labels of one GPU at context ``c``: no bar (``None``) where the weights
    do not fit (0) or where ``c`` is beyond the model's maximum context."""
    ys, labels = [], []
    for v, top in zip(data["batch"][c][g], data["max_position"]):
        shown = v if v > 0 and _within(top, c) else None
        ys.append(shown)
        labels.append("" if shown is None else f"{v:,}")
    return ys, labels


def _beyond_marks(data: dict, c: int) -> list:
    """One annotation per model that cannot serve context ``c``, at the left of its row."""
    return [dict(y=m, x=0, yref="y", xref="paper", xanchor="left", showarrow=False,
                 text=f"{BEYOND} ({token_label(top)})", font=dict(size=10, color="#666"),
                 bgcolor="#F2F2F2")
            for m, top in zip(data["models"], data["max_position"]) if not _within(top, c)]


def gpu_fit_figure(data: dict) -> go.Figure:
    """Grouped dots (one per GPU) on a log axis, one row per model; a slider picks the context.

    Dots, not bars: a bar on a log axis has no meaningful length.  Models are rows and the count
    runs left to right, so each GPU's dot sits on its own line within its model's row and its label
    to its right never meets a neighbour's, at 1280 px or on a phone.  The axis is fixed over all
    contexts (so the slider compares like with like) and labelled at powers of ten only.  A model
    whose maximum context is below the slider's value shows no dots and a "beyond max context" mark.
    """
    fig = go.Figure()
    c0 = data["contexts"][0]
    for i, g in enumerate(data["gpus"]):
        x, labels = _fit_bars(data, c0, g)
        fig.add_trace(go.Scatter(y=data["models"], x=x, name=g, mode="markers+text", orientation="h",
                                 marker=dict(color=seq_color(i), size=10,
                                             line=dict(width=1, color="white")),
                                 text=labels, textposition="middle right", cliponaxis=False,
                                 textfont=dict(size=9, color=seq_color(i)),
                                 hovertemplate=f"{g}: %{{x:,}} sequences<extra>%{{y}}</extra>"))
    steps = []
    for c in data["contexts"]:
        bars = [_fit_bars(data, c, g) for g in data["gpus"]]
        steps.append(dict(label=token_label(c), method="update",
                          args=[{"x": [b[0] for b in bars], "text": [b[1] for b in bars]},
                                {"annotations": _beyond_marks(data, c)}]))
    shown = [v for c in data["contexts"] for g in data["gpus"]
             for v in _fit_bars(data, c, g)[0] if v]
    top = math.log10(max(shown)) if shown else 1.0
    ticks = [f"{m}<br><sup>max {token_label(t)}</sup>" if t else m
             for m, t in zip(data["models"], data["max_position"])]
    fig.update_layout(
        scattermode="group", scattergap=0.2, height=250 + 58 * len(data["models"]),
        margin=dict(l=10, r=10, t=100, b=40),
        title=f"Sequences that fit on one GPU<br>(TP={data['tp']}, KV in {data['kv_dtype']}, "
              f"{RESERVE_FRACTION:.0%} reserve)<br><sup>weights in their serving dtype; no dot: the weights "
              f"alone do not fit,<br>or the context is {BEYOND} (marked)</sup>",
        title_font_size=14, annotations=_beyond_marks(data, c0),
        yaxis=dict(tickvals=data["models"], ticktext=ticks, autorange="reversed", automargin=True),
        xaxis=dict(title="concurrent sequences (log)", type="log", range=[-0.15, top + 0.6], dtick=1),
        # the legend under the axis title, the slider under the legend (three legend rows on a phone)
        legend=dict(orientation="h", y=-0.13, x=0.5, xanchor="center", yanchor="top"),
        sliders=[dict(active=0, steps=steps, currentvalue=dict(prefix="context length: "),
                      pad=dict(t=130))])
    return fig


# --- attention variants --------------------------------------------------------------------------
def attention_variants_data(model: str = "Llama-2-70B", tp: int = 8, kv_dtype: str = "fp16") -> dict:
    """Bytes per token of MHA, GQA-8, MQA and MLA on one model's shape: whole, and per GPU at ``tp``."""
    rows = []
    for kind in ("MHA", "GQA", "MQA", "MLA"):
        spec = memory.attention_variant(model, kind)
        rows.append({"kind": kind, "label": f"{kind} ({kv_shape(spec)})",
                     "whole": memory.kv_bytes_per_token(spec, kv_dtype),
                     "per_gpu": memory.kv_bytes_per_token(spec, kv_dtype, tp=tp)})
    return {"model": memory.model_preset(model).name, "tp": tp, "kv_dtype": kv_dtype, "rows": rows}


def attention_variants_figure(data: dict) -> go.Figure:
    """Horizontal bars of KiB per token on a linear axis (lengths proportional, each bar labelled
    at its end, so labels of short bars never run into each other): the whole model, and what each
    GPU keeps under tensor parallelism."""
    labels = [r["label"].replace(" (", "<br>(") for r in data["rows"]]
    fig = go.Figure()
    for i, (key, name) in enumerate([("whole", "whole model (one GPU)"),
                                     ("per_gpu", f"per GPU with TP={data['tp']}")]):
        x = [r[key] / 1024 for r in data["rows"]]
        fig.add_trace(go.Bar(y=labels, x=x, name=name, orientation="h", marker_color=COLORS[i],
                             text=[f"{v:,.0f} KiB" for v in x], textposition="outside", cliponaxis=False,
                             hovertemplate="%{y}<br>%{x:,.1f} KiB per token<extra>" + name + "</extra>"))
    top = max(r["whole"] for r in data["rows"]) / 1024
    fig.update_layout(
        barmode="group", height=460, margin=dict(l=10, r=10, t=60, b=40),
        title=f"KV bytes per token,<br>{data['model']}'s shape ({data['kv_dtype']})",
        xaxis=dict(title="KiB per token", rangemode="tozero", range=[0, top * 1.3]),
        yaxis=dict(autorange="reversed", automargin=True),
        legend=dict(orientation="h", y=-0.15, x=0, yanchor="top", traceorder="normal"))
    return fig
