"""The live block-layout panel (chapter 5): requests come and go, and the pool fills and empties.

:func:`block_panel` puts buttons around a :class:`~paged_kv.engine.LiveRequests` (the tiny model
serving requests over one pool of KV blocks): add a request (prompt text, or just a length: a
prompt of that many spaces), decode a step, finish a request; the figure
(:mod:`paged_kv.viz.blocks`) updates in place in a ``go.FigureWidget``, or is redrawn into an
``ipywidgets.Output`` where FigureWidget is unavailable (it needs ``anywidget``).

Two things the widgets do not do by themselves: ipywidgets 8 leaves a ``Dropdown``'s value at
``None`` when its options change from empty, so after every event
the panel selects a request itself (the one selected before if it still exists, else the oldest);
and the status text sits in a box of fixed height, so the figure below it does not move down a
line each time a request is added.  When the pool fills during a decode step the loop preempts the
latest request by recompute (:class:`~paged_kv.engine.LiveRequests`), and the note says so.
"""

from __future__ import annotations

import html

import ipywidgets as w

from ..engine import LiveRequests
from ..model import SamplingParams, load_tiny_model
from ..viz.blocks import blocks_figure, refresh_blocks_figure
from ..viz.sharing import refresh_sharing_figure, sharing_figure
from .panel import button_action, figure_widget_or_output, status_html, update_figure

__all__ = ["block_panel"]


def block_panel(model=None, tokenizer=None, num_blocks: int = 24, block_size: int = 8,
                use_figure_widget: bool | None = None, load_model: bool = True, sharing: bool = False,
                sampling: SamplingParams | None = None):
    """The live panel over a fresh :class:`LiveRequests`; returns an ``ipywidgets.VBox``.

    With ``model=None`` and ``load_model`` the bundled tiny model is loaded.  ``use_figure_widget``:
    ``None`` tries ``go.FigureWidget`` and falls back to redrawing into an ``Output``.
    ``sharing=True`` (chapter 6) adds a "fork" button (the selected request forks, sharing its
    blocks) and draws the sharing overlays (:mod:`paged_kv.viz.sharing`: shared blocks framed,
    copy-on-write copies as arrows); "finish" then also prunes a beam.  ``sampling`` is how every
    sequence picks its tokens (default greedy; forks only diverge when sampling).
    The panel's ``.live`` attribute is the :class:`LiveRequests` it drives.
    """
    if model is None and load_model:
        model, tokenizer = load_tiny_model()
    live = LiveRequests(model, tokenizer, num_blocks, block_size, sampling=sampling)
    title = f"{num_blocks} blocks × {block_size} slots"
    draw, refresh = (sharing_figure, refresh_sharing_figure) if sharing else (blocks_figure, refresh_blocks_figure)
    fig = draw(live.history.snapshots, title=title, replay=False)
    fig, out = figure_widget_or_output(fig, use_figure_widget)

    prompt = w.Text(value="To be, or not to be", description="prompt", layout=w.Layout(width="320px"))
    length = w.BoundedIntText(value=12, min=1, max=num_blocks * block_size, description="or length",
                              layout=w.Layout(width="170px"))
    add_text, add_len = w.Button(description="add prompt"), w.Button(description="add length")
    decode = w.Button(description="decode step", button_style="primary")
    which = w.Dropdown(options=[], description="request", layout=w.Layout(width="220px"))
    finish = w.Button(description="finish" if not sharing else "finish / prune", button_style="warning")
    fork = w.Button(description="fork", button_style="info")
    status = w.HTML(layout=w.Layout(height="7.5em", overflow="auto"))   # fixed: the figure stays put

    def redraw(note: str = "") -> None:
        update_figure(fig, out, lambda f: refresh(f, live.history.snapshots, title),
                      lambda: draw(live.history.snapshots, title=title, replay=False))
        chosen = which.value
        which.options = [(f"request {s}" + (" (waiting)" if s in live.waiting else ""), s) for s in live.requests]
        if live.requests:             # ipywidgets 8 leaves the value None when options change
            which.value = chosen if chosen in live.requests else live.requests[0]
        texts = "<br>".join(f"<b>request {s}</b>{' (preempted, waiting)' if s in live.waiting else ''}: "
                            f"{html.escape(repr(live.text(s)))}" for s in live.requests) if model is not None else ""
        status.value = status_html(note, texts)

    def act(fn):                                 # never raises: errors go to the status line
        return button_action(fn, redraw, status)

    def finish_selected():
        if which.value is None:
            return "no request to finish"
        live.finish(which.value)

    def fork_selected():
        if which.value is None:
            return "no request to fork"
        if which.value in live.waiting:
            return f"request {which.value} is waiting to be recomputed; fork a running request"
        child = live.fork(which.value)
        return f"request {child} forked from request {which.value}: it shares all its blocks"

    add_text.on_click(act(lambda: live.add(prompt.value) and ""))
    add_len.on_click(act(lambda: live.add(int(length.value)) and ""))
    decode.on_click(act(lambda: "; ".join(live.step())))
    finish.on_click(act(finish_selected))
    fork.on_click(act(fork_selected))
    redraw()
    buttons = [decode, which, fork, finish] if sharing else [decode, which, finish]
    panel = w.VBox([w.HBox([prompt, add_text, length, add_len]), w.HBox(buttons),
                    status, fig if out is None else out])
    panel.live = live
    return panel
