"""The live speculative-decoding panel (chapter 9): pick a prompt, ``k`` and the n-gram length, replay,
then walk the target passes and watch each one's lookahead slots written and taken back.

:func:`spec_decode_panel` puts ipywidgets around the panel model
:class:`paged_kv.panels.spec_decode.SpecDecodePanel`, the same one the browser edition's page
drives; the controls are built from the model's own :meth:`~paged_kv.panels.base.PanelModel.controls`,
so the two fronts offer the same inputs.  Every action goes through :func:`paged_kv.panels.step`
(a refusal becomes the status line's note and changes nothing) and the figure is redrawn in place.
"""

from __future__ import annotations

import html

import ipywidgets as w

from ..panels import step
from ..panels.spec_decode import SpecDecodePanel
from .panel import button_action, figure_widget_or_output, status_html, update_figure

__all__ = ["spec_decode_panel"]


def _inputs(controls: list[dict]) -> dict[str, w.Widget]:
    """One ipywidget per named control (select -> Dropdown, int -> BoundedIntText)."""
    out = {}
    for c in controls:
        if c["kind"] == "select":
            options = list(zip(c.get("labels", c["options"]), c["options"]))
            out[c["name"]] = w.Dropdown(options=options, value=c["value"], description=c["label"],
                                        layout=w.Layout(width="340px"))
        elif c["kind"] == "int":
            out[c["name"]] = w.BoundedIntText(value=c["value"], min=c["min"], max=c["max"], description=c["label"],
                                              layout=w.Layout(width="170px"))
    return out


def _replace(fig, new) -> None:
    """Redraw a FigureWidget as ``new`` in one message (a pass may have more blocks than the last)."""
    with fig.batch_update():
        fig.data = ()
        fig.add_traces(list(new.data))
        fig.layout = new.layout


def spec_decode_panel(use_figure_widget: bool | None = None, **knobs):
    """The live panel; returns an ``ipywidgets.VBox`` whose ``.panel_model`` is the
    :class:`SpecDecodePanel` (``knobs``: its ``block_size`` and ``num_blocks``) and whose
    ``.current()`` returns the state shown."""
    model = SpecDecodePanel(**knobs)
    shown = step(model, model.initial(), None)
    fig, out = figure_widget_or_output(shown.figure, use_figure_widget)
    controls = model.controls()
    inputs = _inputs(controls)
    status = w.HTML()
    current = {"state": shown.state}

    def show(result, note: str = "") -> None:
        current["state"] = result.state
        update_figure(fig, out, lambda f: _replace(f, result.figure), lambda: result.figure)
        status.value = status_html(note or result.note, html.escape(result.status).replace("\n", "<br>"))

    def act(op: str):
        def run() -> str:
            action = {"op": op, **{name: box.value for name, box in inputs.items()}} if op == "run" else {"op": op}
            result = step(model, current["state"], action)
            show(result, result.note)
            return result.note
        return button_action(run, lambda note: None, status)

    buttons = []
    for c in controls:
        if c["kind"] == "button":
            b = w.Button(description=c["label"], button_style="primary" if c["op"] == "next" else "")
            b.on_click(act(c["op"]))
            buttons.append(b)
    show(shown)
    panel = w.VBox([w.HBox([inputs["prompt"]]), w.HBox([inputs[n] for n in ("k", "ngram", "max_tokens")]),
                    w.HBox(buttons), status, fig if out is None else out])
    panel.panel_model = model
    panel.current = lambda: current["state"]
    return panel
