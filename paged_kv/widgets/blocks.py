"""The live block-layout panel (chapter 5): requests come and go, and the pool fills and empties.

:func:`block_panel` puts buttons around a :class:`~paged_kv.engine.LiveRequests` (the tiny model
serving requests over one pool of KV blocks): add a request (prompt text, or just a length: a
prompt of that many spaces), decode a step, finish a request; the figure
(:mod:`paged_kv.viz.blocks`) updates in place in a ``go.FigureWidget``, or is redrawn into an
``ipywidgets.Output`` where FigureWidget is unavailable (it needs ``anywidget``).
"""

from __future__ import annotations

import ipywidgets as w
from IPython.display import display

from ..engine import LiveRequests
from ..errors import PagedKVError
from ..model import load_tiny_model
from ..viz.blocks import blocks_figure, refresh_blocks_figure
from .panel import figure_widget_or_output

__all__ = ["block_panel"]


def block_panel(model=None, tokenizer=None, num_blocks: int = 24, block_size: int = 8,
                use_figure_widget: bool | None = None, load_model: bool = True):
    """The live panel over a fresh :class:`LiveRequests`; returns an ``ipywidgets.VBox``.

    With ``model=None`` and ``load_model`` the bundled tiny model is loaded.  ``use_figure_widget``:
    ``None`` tries ``go.FigureWidget`` and falls back to redrawing into an ``Output``.
    The panel's ``.live`` attribute is the :class:`LiveRequests` it drives.
    """
    if model is None and load_model:
        model, tokenizer = load_tiny_model()
    live = LiveRequests(model, tokenizer, num_blocks, block_size)
    title = f"{num_blocks} blocks × {block_size} slots"
    fig = blocks_figure(live.history.snapshots, title=title, replay=False)
    fig, out = figure_widget_or_output(fig, use_figure_widget)

    prompt = w.Text(value="To be, or not to be", description="prompt", layout=w.Layout(width="320px"))
    length = w.BoundedIntText(value=12, min=1, max=num_blocks * block_size, description="or length",
                              layout=w.Layout(width="170px"))
    add_text, add_len = w.Button(description="add prompt"), w.Button(description="add length")
    decode = w.Button(description="decode step", button_style="primary")
    which = w.Dropdown(options=[], description="request", layout=w.Layout(width="160px"))
    finish = w.Button(description="finish", button_style="warning")
    status = w.HTML()

    def redraw(note: str = "") -> None:
        if out is None:
            refresh_blocks_figure(fig, live.history.snapshots, title)
        else:
            out.clear_output(wait=True)
            with out:
                display(blocks_figure(live.history.snapshots, title=title, replay=False))
        which.options = live.running
        texts = "<br>".join(f"<b>{s}</b>: {live.text(s)!r}" for s in live.running) if model is not None else ""
        status.value = (f"<span style='color:#c00'>{note}</span><br>" if note else "") + texts

    def act(fn):
        def handler(_):
            try:
                redraw(fn() or "")
            except PagedKVError as e:          # e.g. OutOfBlocksError: show it, change nothing
                redraw(str(e))
        return handler

    def finish_selected():
        if which.value is None:
            return "no request to finish"
        live.finish(which.value)

    add_text.on_click(act(lambda: live.add(prompt.value) and ""))
    add_len.on_click(act(lambda: live.add(int(length.value)) and ""))
    decode.on_click(act(lambda: "; ".join(live.step())))
    finish.on_click(act(finish_selected))
    redraw()
    panel = w.VBox([w.HBox([prompt, add_text, length, add_len]), w.HBox([decode, which, finish]),
                    status, fig if out is None else out])
    panel.live = live
    return panel
