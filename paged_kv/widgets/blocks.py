"""The live block-layout panel (chapters 5 and 6): requests come and go, and the pool fills and empties.

:func:`block_panel` puts ipywidgets around a panel model (:class:`~paged_kv.panels.block_pool.BlockPoolPanel`,
or :class:`~paged_kv.panels.block_pool.ForkPanel` with ``sharing``), which holds every decision: the
buttons only turn a click into an action (add a request: prompt text, or just a length, a prompt
of that many spaces; decode a step; finish a request; fork one; append one token to one) and draw the
:class:`~paged_kv.panels.base.Step` the model returns, so this panel and the browser edition's
controls cannot disagree.  The model's state wraps a :class:`~paged_kv.engine.LiveRequests` (the
tiny model serving requests over one pool of KV blocks); the figure (:mod:`paged_kv.viz.blocks`)
updates in place in a ``go.FigureWidget``, or is redrawn into an ``ipywidgets.Output`` where
FigureWidget is unavailable (it needs ``anywidget``).

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
from ..panels.base import step
from ..panels.block_pool import BlockPoolPanel, ForkPanel
from .panel import button_action, figure_widget_or_output, status_html, update_figure

__all__ = ["block_panel"]


class _Current:
    """The panel's current state; each action gives a new one (the model is pure)."""

    def __init__(self, state) -> None:
        self.state = state


class _CurrentLive:
    """``panel.live``: the :class:`LiveRequests` of the panel's current state, whichever object that
    is after the last action (reading and setting an attribute go to it)."""

    def __init__(self, current: _Current) -> None:
        object.__setattr__(self, "_current", current)

    def __getattr__(self, name):
        return getattr(self._current.state.live, name)

    def __setattr__(self, name, value) -> None:
        setattr(self._current.state.live, name, value)

    def __delattr__(self, name) -> None:
        delattr(self._current.state.live, name)


def block_panel(model=None, tokenizer=None, num_blocks: int = 24, block_size: int = 8,
                use_figure_widget: bool | None = None, load_model: bool = True, sharing: bool = False,
                sampling: SamplingParams | None = None):
    """The live panel over a fresh :class:`LiveRequests`; returns an ``ipywidgets.VBox``.

    With ``model=None`` and ``load_model`` the bundled tiny model is loaded.  ``use_figure_widget``:
    ``None`` tries ``go.FigureWidget`` and falls back to redrawing into an ``Output``.
    ``sharing=True`` (chapter 6) adds a "fork" button (the selected request forks, sharing its
    blocks) and an "append to selected" button (one token for the selected request alone: its
    first write into a shared block copies it), and draws the sharing overlays (:mod:`paged_kv.viz.sharing`: shared blocks framed,
    copy-on-write copies as arrows); "finish" then also prunes a beam.  ``sampling`` is how every
    sequence picks its tokens (default greedy; forks only diverge when sampling).
    The panel's ``.live`` attribute is the :class:`LiveRequests` of its current state, and
    ``.panel_model`` the panel model it drives.

    Raises:
        ConfigError: a bad pool size (from the panel model).
    """
    if model is None and load_model:
        model, tokenizer = load_tiny_model()

    def factory(num_blocks: int, block_size: int) -> LiveRequests:
        return LiveRequests(model, tokenizer, num_blocks, block_size, sampling=sampling)

    pm = (ForkPanel if sharing else BlockPoolPanel)(num_blocks, block_size, prompt="To be, or not to be", length=12,
                                                    live_requests_factory=factory)
    current = _Current(pm.initial())
    fig, out = figure_widget_or_output(pm.figure(current.state), use_figure_widget)

    prompt = w.Text(value=pm.prompt, description="prompt", layout=w.Layout(width="320px"))
    length = w.BoundedIntText(value=pm.length, min=1, max=num_blocks * block_size, description="or length",
                              layout=w.Layout(width="170px"))
    add_text, add_len = w.Button(description="add prompt"), w.Button(description="add length")
    decode = w.Button(description="decode step", button_style="primary")
    which = w.Dropdown(options=[], description="request", layout=w.Layout(width="220px"))
    finish = w.Button(description="finish" if not sharing else "finish / prune", button_style="warning")
    fork = w.Button(description="fork", button_style="info")
    append = w.Button(description="append to selected")
    status = w.HTML(layout=w.Layout(height="7.5em", overflow="auto"))   # fixed: the figure stays put

    def redraw(note: str = "") -> None:
        state = current.state
        live = state.live
        update_figure(fig, out, lambda f: pm.refresh_figure(f, state), lambda: pm.figure(state))
        chosen = which.value
        which.options = [(f"request {s}" + (" (waiting)" if s in live.waiting else ""), s) for s in live.requests]
        if live.requests:             # ipywidgets 8 leaves the value None when options change
            which.value = chosen if chosen in live.requests else live.requests[0]
        texts = "<br>".join(f"<b>request {s}</b>{' (preempted, waiting)' if source == 'preempted, waiting' else ''}: "
                            f"{html.escape(repr(text))}" for s, text, source in pm.request_lines(state))
        status.value = status_html(note, texts)

    def act(action):                  # never raises: errors go to the status line
        def run():
            done = step(pm, current.state, action())
            current.state = done.state
            return done.note or done.state.message
        return button_action(run, redraw, status)

    add_text.on_click(act(lambda: {"op": "add", "prompt": prompt.value}))
    add_len.on_click(act(lambda: {"op": "add_length", "length": int(length.value)}))
    decode.on_click(act(lambda: {"op": "step"}))
    finish.on_click(act(lambda: {"op": "finish", "request": which.value}))
    fork.on_click(act(lambda: {"op": "fork", "request": which.value}))
    append.on_click(act(lambda: {"op": "append", "request": which.value}))
    redraw()
    buttons = [decode, which, fork, append, finish] if sharing else [decode, which, finish]
    panel = w.VBox([w.HBox([prompt, add_text, length, add_len]), w.HBox(buttons),
                    status, fig if out is None else out])
    panel.live = _CurrentLive(current)
    panel.panel_model = pm
    return panel
