"""Chapter 9's figures: one speculative step's block table phase by phase, the speed-up against
the batch, and acceptance against ``k``.

* :func:`rollback_figure`: one :class:`~paged_kv.spec_decode.SpecStep` of a
  :func:`~paged_kv.spec_decode.replay_speculation` trace in four stacked panels, one per phase
  (:data:`~paged_kv.spec_decode.PHASES`): the sequence's block table, a row of ``BS`` slots per
  physical block in logical order, each slot coloured by its
  :class:`~paged_kv.spec_decode.SlotState` (:data:`STATE_COLORS`).  A block the rollback sends back
  to the free queue keeps its row in the last panel, grey, framed with a dashed line and labelled
  with where it went.  Stacked rows, not four columns side by side: at 400 px four columns leave
  about 20 px per block row of four slots, too little for a token's character.
* :func:`speedup_figure`: :func:`~paged_kv.memory.speculation.speedup` against the batch, a line
  per ``k``, the break-even line at 1 and each ``k``'s
  :func:`~paged_kv.memory.speculation.crossover_batch` marked.
* :func:`acceptance_rows` and :func:`acceptance_figure`: measured acceptance per ``k`` from
  replayed traces (their own totals), as plain rows and as two stacked panels.

Pure functions of plain data (frozen steps, numbers), so the static book draws them with no live
objects; no torch, no numpy (the browser edition runs them).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..errors import ConfigError
from ..memory.plan import max_batch_size
from ..memory.speculation import DEFAULT_CONTEXT, crossover_batch, speedup
from ..spec_decode import PHASES, SlotState, SpeculationTrace
from ..validate import count
from .blocks import SHORT_LABEL, TEXT_SIZE
from .labels import log_ticks, visible_token, wrap_title
from .palette import COLORS, FREE_COLOR, discrete_scale, seq_color

__all__ = ["FREED_DASH", "ROW_PX", "STATES", "STATE_COLORS", "acceptance_figure", "acceptance_rows",
           "rollback_figure", "speedup_figure"]

STATES = tuple(SlotState)               # z of a slot = its state's index here
STATE_COLORS = {SlotState.VERIFIED: COLORS[0], SlotState.DRAFT: COLORS[8], SlotState.ACCEPTED: COLORS[2],
                SlotState.REJECTED: COLORS[3], SlotState.FREE: FREE_COLOR}
STATE_NAMES = {SlotState.VERIFIED: "verified K/V", SlotState.DRAFT: "draft, unchecked",
               SlotState.ACCEPTED: "draft accepted", SlotState.REJECTED: "draft rejected",
               SlotState.FREE: "free slot"}
FREED_DASH = "dash"                      # the outline of a block freed at rollback
ROW_PX = 34                              # one block row's height
PANEL_PX = 56                            # a panel's title and gap
DRAFT_CHARS = 16                         # the drafts shown in the propose panel's title (a phone's line)
QUEUE_SHOWN = 10                         # free-queue ids in the caption (the tail's, where freed blocks go)
LEGEND_PX = 150                          # the offset axis's title and the key below the panels


def _label_margin(panels) -> int:
    """Pixels left of the slots for the longest block label (``"block 17 freed"``: about 7 px a
    character at plotly's 12 px tick font, and the tick's own gap), so no label is cut."""
    longest = max((len(label) for p in panels for label in p[3]), default=0)
    return 16 + 7 * longest


def _titled(fig, title: str, *, height: int, top: int, bottom: int, legend_y: float) -> None:
    """The line figures' heading (``title`` wrapped for a phone; each extra line adds 18 px to the
    height and the top margin) and their key, horizontal, below the plot."""
    head = wrap_title(title)
    extra = 18 * head.count("<br>")
    fig.update_layout(title=dict(text=head, x=0.01, font=dict(size=14)), height=height + extra,
                      margin=dict(l=60, r=15, t=top + extra, b=bottom),
                      legend=dict(orientation="h", y=legend_y, x=0, yanchor="top"))


def _default_step(trace) -> int:
    """The first step whose rollback frees a block, else 0."""
    return next((s.index for s in trace.steps if s.freed_blocks), 0)


def _phase_caption(s, phase: str, label: Callable[[int], str] | None) -> str:
    k = len(s.drafted)
    if phase == "propose":
        shown = "".join(visible_token(label(t)) for t in s.drafted) if label else " ".join(map(str, s.drafted))
        shown = shown if len(shown) <= DRAFT_CHARS else shown[:DRAFT_CHARS - 1] + "…"
        return f"<b>1 propose</b>: {k} draft{'s' * (k != 1)}" + (f' "{shown}"' if k else "") + ", no slots yet"
    if phase == "verify":
        return f"<b>2 verify</b>: {s.num_fed} fed + {k} drafts written, {len(s.new_blocks)} new block(s)"
    if phase == "accept":
        own = s.emitted[-1]
        shown = f'"{visible_token(label(own))}"' if label else str(own)
        return f"<b>3 accept</b>: {s.accepted} of {k} kept, + the target's {shown}"
    freed = ", ".join(map(str, s.freed_blocks)) or "none"
    return f"<b>4 rollback</b>: {s.rejected} slot(s) back; blocks freed: {freed}"


def _panel(s, phase: str, tokens: Sequence[int], label: Callable[[int], str] | None):
    """(z, text, hover, y labels) of one phase: a row per block drawn (the rollback panel keeps the
    freed blocks' rows, every slot free)."""
    bs = s.block_size
    states = list(s.slot_states(phase))
    table = s.table_before if phase == "propose" else s.table_verify
    states += [(SlotState.FREE,) * bs] * (len(table) - len(states))        # rollback: the freed blocks
    z, text, hover, ylab = [], [], [], []
    for i, (pid, row) in enumerate(zip(table, states)):
        freed = phase == "rollback" and pid in s.freed_blocks
        new = phase in ("verify", "accept") and pid in s.new_blocks
        ylab.append(f"block {pid}" + (" freed" if freed else " new" if new else ""))
        z.append([STATES.index(x) for x in row])
        text.append([])
        hover.append([])
        for o, state in enumerate(row):
            p = i * bs + o
            tok = tokens[p] if state != SlotState.FREE and p < len(tokens) else None
            text[-1].append("" if tok is None else visible_token(label(tok)) if label else str(tok))
            what = STATE_NAMES[state] + ("" if tok is None else f", position {p}, token {tok}")
            hover[-1].append(f"block {pid}, offset {o} (slot {pid * bs + o})<br>{what}")
    return z, text, hover, ylab


def rollback_figure(trace: SpeculationTrace, step: int | None = None, token_text: Callable[[int], str] | None = None,
                    title: str = "") -> go.Figure:
    """One speculative step's block table in four stacked panels, propose / verify / accept /
    rollback: each a row of ``BS`` slots per physical block (logical order, labelled ``block id``,
    ``new`` for a block taken for the lookahead slots, ``freed`` for one the rollback gave back),
    slots coloured by state (:data:`STATE_COLORS`, named in the legend).  A freed block's row is
    framed with a dashed line (``FREED_DASH``) and says where it went in the free queue.

    Args:
        trace: a :func:`~paged_kv.spec_decode.replay_speculation` result.
        step: the step drawn (an index into ``trace.steps``); default the first whose rollback frees
            a block, else step 0.
        token_text: ``id -> str`` for the slots' text (e.g. a tokenizer's label of one id), drawn
            through :func:`~paged_kv.viz.labels.visible_token`; default the token ids.
        title: a heading above the step's caption.

    Raises:
        ConfigError: ``trace`` not a ``SpeculationTrace`` or without steps, ``step`` not an index
            into its steps, ``token_text`` not callable (or returning a non-``str``).
    """
    if not isinstance(trace, SpeculationTrace) or not trace.steps:
        raise ConfigError(f"rollback_figure needs a SpeculationTrace with at least one step, got {trace!r:.60}")
    step = _default_step(trace) if step is None else step
    if type(step) is not int or not 0 <= step < len(trace.steps):
        raise ConfigError(f"step must be an int in 0..{len(trace.steps) - 1} (an index into the trace's steps), "
                          f"got {step!r}")
    if token_text is not None and not callable(token_text):
        raise ConfigError(f"token_text must be a callable id -> str, got {token_text!r:.60}")
    s = trace.steps[step]
    done = sum(len(x.emitted) for x in trace.steps[:step])
    tokens = list(trace.prompt_ids) + list(trace.output_ids[:done])    # the sequence before the pass
    tokens = tokens[:s.num_computed + s.num_fed] + list(s.drafted)     # by position: verified, then drafts
    panels = [_panel(s, phase, tokens, token_text) for phase in PHASES]
    nrows = [max(1, len(p[0])) for p in panels]
    plot_px = PANEL_PX * (len(PHASES) - 1) + ROW_PX * sum(nrows)       # the panels and the gaps between them
    fig = make_subplots(rows=len(PHASES), cols=1, row_heights=nrows, vertical_spacing=PANEL_PX / plot_px,
                        subplot_titles=[_phase_caption(s, phase, token_text) for phase in PHASES])
    for note in fig.layout.annotations:     # each caption starts over the block labels: the full width
        note.update(x=0, xanchor="left", xshift=-_label_margin(panels) + 4, font=dict(size=12))
    longest = max([len(t) for p in panels for row in p[1] for t in row] + [0])
    scale = discrete_scale([STATE_COLORS[x] for x in STATES])
    bs = s.block_size
    for r, (phase, (z, text, hover, ylab)) in enumerate(zip(PHASES, panels), start=1):
        fig.add_trace(go.Heatmap(z=z or [[None] * bs], text=text or [[""] * bs], customdata=hover or [[""] * bs],
                                 name=f"{phase} slots", colorscale=scale, zmin=-0.5, zmax=len(STATES) - 0.5,
                                 showscale=False, xgap=2, ygap=4, texttemplate="%{text}", hoverongaps=False,
                                 textfont=dict(size=TEXT_SIZE if longest <= SHORT_LABEL else None),
                                 hovertemplate="%{customdata}<extra></extra>"), row=r, col=1)
        fig.update_yaxes(row=r, col=1, tickvals=list(range(len(ylab))), ticktext=ylab, autorange="reversed",
                         showgrid=False, zeroline=False)
        fig.update_xaxes(row=r, col=1, tickvals=list(range(bs)), range=[-0.5, bs - 0.5], showgrid=False,
                         zeroline=False, showticklabels=r == len(PHASES))
        if not z:
            fig.add_annotation(row=r, col=1, x=(bs - 1) / 2, y=0, showarrow=False, font=dict(size=11, color="#555"),
                               text="no blocks yet<br>(this pass writes the prompt's K/V)", name="no blocks")
    fig.update_xaxes(title_text="offset in the block (slot)", row=len(PHASES), col=1)
    rows = len(PHASES)
    for i, pid in enumerate(s.table_verify):
        if pid not in s.freed_blocks:
            continue
        pos, n = s.free_queue.index(pid), len(s.free_queue)
        where = " tail" if pos == n - 1 else f", {n - 1 - pos} before the tail"
        fig.add_shape(type="rect", row=rows, col=1, x0=-0.45, x1=bs - 0.55, y0=i - 0.45, y1=i + 0.45,
                      line=dict(color="#222", width=2, dash=FREED_DASH), name=f"freed {pid}")
        fig.add_annotation(row=rows, col=1, x=(bs - 1) / 2, y=i, showarrow=False, name=f"freed label {pid}",
                           text=f"<b>freed → free queue{where}</b>", font=dict(size=11, color="#222"))
    for state in STATES:                      # the key: one legend entry per colour, and the dashed frame
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=STATE_NAMES[state], hoverinfo="skip",
                                 marker=dict(symbol="square", size=12, color=STATE_COLORS[state],
                                             line=dict(color="#999", width=1))))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="dashed: block freed at rollback",
                             hoverinfo="skip", line=dict(color="#222", dash=FREED_DASH, width=2)))
    head = f"{wrap_title(title)}<br>" if title else ""
    caption = (f"target pass {s.passes}: {len(s.drafted)} drafted, {s.accepted} accepted, "
               f"{s.rejected} rolled back")
    q = s.free_queue
    queue = ("empty" if not q else ", ".join(map(str, q)) + " (tail)" if len(q) <= QUEUE_SHOWN
             else f"{len(q)} blocks, …, " + ", ".join(map(str, q[-QUEUE_SHOWN:])) + " (tail)")
    heading = f"{head}{wrap_title(caption)}<br><sup>free queue after: {queue}</sup>"
    # the heading hangs from the figure's top (plotly centres it in the margin by default, where a
    # tall one runs into the first panel's caption); below it, room for that caption
    top = 60 + 20 * (heading.count("<br>") + 1)
    fig.update_layout(title=dict(text=heading, x=0.01, y=1, yref="container", yanchor="top", pad=dict(t=8),
                                 font=dict(size=14)),
                      height=top + plot_px + LEGEND_PX, margin=dict(l=_label_margin(panels), r=15, t=top, b=LEGEND_PX),
                      plot_bgcolor="white",          # the key below the offset axis's title, 3 lines on a phone
                      legend=dict(orientation="h", x=0, y=-50 / plot_px, yanchor="top"))
    return fig


def _batches(model, gpu, context_len: int, k: int) -> list[int]:
    top = max_batch_size(model, gpu, context_len + 1 + k)
    if top < 1:
        raise ConfigError(f"not one sequence of {context_len + 1 + k} tokens fits on {gpu!r} beside the weights; "
                          "give batches")
    out = [b for b in (2 ** e for e in range(top.bit_length())) if b <= top]
    return out + [top] if out[-1] != top else out


def speedup_figure(model, gpu, *, ks: Sequence[int], alpha, batches: Sequence[int] | None = None,
                   context_len: int = DEFAULT_CONTEXT, draft_cost: float = 0.0, title: str = "") -> go.Figure:
    """Speculation's speed-up (×, :func:`~paged_kv.memory.speculation.speedup`) against the batch
    (sequences, log axis), a line per ``k``; a dashed line at 1 (break-even); each ``k``'s
    :func:`~paged_kv.memory.speculation.crossover_batch` up to the largest batch drawn marked with
    an ``x`` (none where it pays at every batch drawn).

    Args:
        model, gpu: presets or specs, as ``speedup``'s.
        ks: draft tokens per pass, a line each (ints >= 1).
        alpha: acceptance rate per draft token, in [0, 1].
        batches: the batch sizes drawn (ints >= 1); default the powers of two up to the most
            sequences of ``context_len + 1 + max(ks)`` tokens that fit, and that most.
        context_len, draft_cost: as ``speedup``'s (cached tokens per sequence; a draft token's cost
            in target steps).

    Raises:
        ConfigError: ``ks`` or ``batches`` empty or not ints of the range; no sequence fits (with
            ``batches`` not given); bad ``alpha``, ``context_len``, ``draft_cost`` as ``speedup``.
        UnknownPresetError: a model or GPU name not known.
    """
    ks = [count("k (draft tokens per pass)", k, 1) for k in ks]
    if not ks:
        raise ConfigError("ks must name at least one k (draft tokens per pass)")
    context_len = count("context_len", context_len, 0)
    xs = _batches(model, gpu, context_len, max(ks)) if batches is None else \
        sorted({count("batch size", b, 1) for b in batches})
    if not xs:
        raise ConfigError("batches must hold at least one batch size")
    kw = dict(context_len=context_len, draft_cost=draft_cost)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[1, 1], mode="lines", name="1× (no gain)", hoverinfo="skip",
                             line=dict(color="#555", dash="dash", width=1.5)))
    for i, k in enumerate(ks):
        color = seq_color(i)
        ys = [speedup(alpha, k, b, model, gpu, **kw) for b in xs]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=f"k = {k}", legendgroup=f"k{k}",
                                 line=dict(color=color), marker=dict(size=5),
                                 hovertemplate=f"k = {k}, B = %{{x}}: %{{y:.2f}}×<extra></extra>"))
        cross = crossover_batch(alpha, k, model, gpu, max_batch=xs[-1], **kw)
        if cross is not None:
            fig.add_trace(go.Scatter(x=[cross], y=[speedup(alpha, k, cross, model, gpu, **kw)], mode="markers",
                                     name=f"k = {k}: ≤ 1× from B = {cross}", legendgroup=f"k{k}",
                                     marker=dict(symbol="x", size=11, color=color, line=dict(width=1)),
                                     hovertemplate=f"k = {k}: ≤ 1× from B = {cross}<extra></extra>"))
    # at 400 px a tick per decade (1-2-5 ticks took two rows, slanted); every tick for a few batches
    ticks = [(v, t) for v, t in zip(*log_ticks(xs)) if len(xs) < 8 or abs(math.log10(v) - round(math.log10(v))) < 1e-9]
    fig.update_xaxes(type="log", tickvals=[v for v, _ in ticks], ticktext=[t for _, t in ticks], tickangle=0,
                     title_text="batch size (sequences, log scale)")
    fig.update_yaxes(title_text="speed-up over plain decoding (×)", rangemode="tozero")
    _titled(fig, title, height=460, top=60, bottom=40, legend_y=-0.25)
    return fig


def acceptance_rows(traces_by_k: Mapping[int, SpeculationTrace], method: str) -> list[dict]:
    """One plain row per ``k`` (ascending), from each trace's own totals: ``method``, ``k``,
    ``passes`` (target passes), ``drafted``, ``accepted`` (tokens), ``acceptance_rate``
    (``accepted / drafted``; ``None`` when nothing was drafted), ``tokens_per_pass``,
    ``rolled_back`` (draft slots written then discarded), ``blocks_freed`` (by the rollbacks).

    Raises:
        ConfigError: a ``k`` not an int >= 1, a value not a ``SpeculationTrace``, ``method`` not a
            non-empty ``str``.
    """
    if not isinstance(method, str) or not method:
        raise ConfigError(f"method must be a non-empty str (e.g. 'ngram'), got {method!r:.60}")
    rows = []
    for k, trace in sorted(traces_by_k.items()):
        k = count("k (draft tokens per pass)", k, 1)
        if not isinstance(trace, SpeculationTrace):
            raise ConfigError(f"traces_by_k[{k}] must be a SpeculationTrace, got {type(trace).__name__}")
        rows.append(dict(method=method, k=k, passes=trace.passes, drafted=trace.drafted, accepted=trace.accepted,
                         acceptance_rate=trace.acceptance_rate, tokens_per_pass=trace.tokens_per_pass,
                         rolled_back=trace.rolled_back, blocks_freed=trace.blocks_freed))
    return rows


def acceptance_figure(rows: Sequence[Mapping], title: str = "") -> go.Figure:
    """Two stacked panels against ``k``: the acceptance rate (share of drafts kept) and the tokens
    per target pass, with its ceiling ``k + 1`` dotted; a line per method, one colour each.

    ``rows``: :func:`acceptance_rows`' (several methods' rows concatenated).  A rate of ``None``
    (nothing drafted) is a gap.

    Raises:
        ConfigError: no rows, or a row without one of ``method``, ``k``, ``acceptance_rate``,
            ``tokens_per_pass`` (the message names the row and the key).
    """
    rows = list(rows)
    if not rows:
        raise ConfigError("acceptance_figure needs at least one row (acceptance_rows)")
    for i, row in enumerate(rows):
        missing = [key for key in ("method", "k", "acceptance_rate", "tokens_per_pass") if key not in row]
        if missing:
            raise ConfigError(f"rows[{i}] has no {missing[0]!r} (acceptance_rows makes the rows)")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.14,
                        subplot_titles=("<b>acceptance rate</b>: drafts kept / drafted",
                                        "<b>tokens per target pass</b>"))
    for note in fig.layout.annotations:
        note.update(x=0, xanchor="left", font=dict(size=12))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for i, m in enumerate(methods):
        mine = sorted((r for r in rows if r["method"] == m), key=lambda r: r["k"])
        ks = [r["k"] for r in mine]
        line = dict(color=seq_color(i))
        fig.add_trace(go.Scatter(x=ks, y=[r["acceptance_rate"] for r in mine], mode="lines+markers", name=m,
                                 legendgroup=m, line=line, hovertemplate=f"{m}, k = %{{x}}: %{{y:.2f}}<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=ks, y=[r["tokens_per_pass"] for r in mine], mode="lines+markers", name=m,
                                 legendgroup=m, showlegend=False, line=line,
                                 hovertemplate=f"{m}, k = %{{x}}: %{{y:.2f}} tokens/pass<extra></extra>"), row=2, col=1)
    every = sorted({r["k"] for r in rows})
    fig.add_trace(go.Scatter(x=every, y=[k + 1 for k in every], mode="lines", name="k + 1 (every draft kept)",
                             line=dict(color="#777", dash="dot"), hoverinfo="skip"), row=2, col=1)
    fig.update_xaxes(tickvals=every, title_text="k (draft tokens per pass)", row=2, col=1)
    fig.update_yaxes(range=[0, 1.05], title_text="share", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", title_text="tokens", row=2, col=1)
    # the key well below the k axis's title: on a phone it wraps to several lines
    _titled(fig, title, height=600, top=70, bottom=120, legend_y=-0.24)
    return fig
