"""The live serving panel (chapter 7): submit requests, step the engine, preempt, watch the queues.

:func:`serving_panel` puts buttons around an :class:`~paged_kv.engine.LLMEngine` serving the
tiny model: add a request (prompt text, tokens to generate, samples), run one step or run until
idle, preempt a running request (by the engine's mode: recompute or swap), abort a request in
any state (its blocks are freed at once, :meth:`LLMEngine.abort_request`).  What each button does
is decided by the panel model :class:`paged_kv.panels.serving.ServingPanel`, the same one the
browser edition's page drives; this module only forwards the clicks and draws.  The figure
(:mod:`paged_kv.viz.serving`: queues, GPU pool, CPU pool) updates in place after every action;
a refused request (admission "never") is shown and changes nothing; any other error is shown too
(:mod:`~paged_kv.widgets.panel`), and the next click runs as usual.  The
status line shows each sample's text as it streams (:attr:`RequestOutput.text
<paged_kv.engine.RequestOutput.text>`: a character that a step cut in the middle is held back
until its last byte comes, not shown as "\ufffd"), escaped, since a model may sample "<".
"""

from __future__ import annotations

import html

import ipywidgets as w

from ..engine import EngineConfig
from ..model import load_tiny_model
from ..panels.serving import DEFAULT_PROMPT, MAX_SAMPLES, MAX_TOKENS, ServingPanel, live_requests
from ..viz.serving import refresh_serving_figure, serving_figure
from .panel import button_action, figure_widget_or_output, outputs_html, status_html, update_figure

__all__ = ["serving_panel"]


def serving_panel(model=None, tokenizer=None, config: EngineConfig | None = None,
                  use_figure_widget: bool | None = None, load_model: bool = True):
    """The live panel over a fresh recording :class:`LLMEngine`; returns an ``ipywidgets.VBox``
    whose ``.engine`` attribute is the engine (and ``.panel_model`` the :class:`ServingPanel`).

    Default config: 16 GPU blocks and 16 CPU blocks of 4 tokens, budget 8 tokens per step, no
    watermark, preemption by swap; the toggle picks the mode of the "preempt" button (a swap
    without a CPU pool, or without room in it, falls back to recompute).  With ``model=None`` and
    ``load_model`` the bundled tiny model is loaded; with neither, the engine runs the browser
    edition's timing model and recorded tokens (:class:`ServingPanel` without a model).
    """
    if model is None and load_model:
        model, tokenizer = load_tiny_model()
    panel_model = ServingPanel(model=model, tokenizer=tokenizer, config=config)
    engine = panel_model.new_engine()
    title = panel_model.title
    fig, out = figure_widget_or_output(serving_figure(engine.records, title, replay=False), use_figure_widget)

    prompt = w.Text(value=DEFAULT_PROMPT, description="prompt", layout=w.Layout(width="300px"))
    max_tokens = w.BoundedIntText(value=12, min=1, max=MAX_TOKENS, description="new tokens", layout=w.Layout(width="170px"))
    n = w.BoundedIntText(value=1, min=1, max=MAX_SAMPLES, description="samples", layout=w.Layout(width="150px"))
    add = w.Button(description="submit")
    step = w.Button(description="step", button_style="primary")
    run = w.Button(description="run until idle")
    which = w.Dropdown(options=[], description="request", layout=w.Layout(width="170px"))
    preempt = w.Button(description="preempt", button_style="warning")
    abort = w.Button(description="abort", button_style="danger")
    mode = w.ToggleButtons(options=["swap", "recompute"], value=panel_model.config.preemption_mode,
                           description="mode")
    status = w.HTML()

    def redraw(note: str = "") -> None:
        update_figure(fig, out, lambda f: refresh_serving_figure(f, engine.records, title),
                      lambda: serving_figure(engine.records, title, replay=False))
        keep = which.value
        which.options = live_requests(engine)
        if which.options:                        # keep the selection, or pick the first unfinished request
            which.value = keep if keep in which.options else which.options[0]
        timing = html.escape(panel_model.timing_line(engine)) + "<br>" if panel_model.timed else ""   # no model
        status.value = status_html(note, timing + outputs_html(engine.outputs()))    # streamed: RequestOutput.text

    def act(op: str, fields=dict):              # never raises: errors go to the status line
        return button_action(lambda: panel_model.act(engine, {"op": op, **fields()}), redraw, status)

    add.on_click(act("submit", lambda: {"prompt": prompt.value, "max_tokens": int(max_tokens.value),
                                        "n": int(n.value)}))
    step.on_click(act("step"))
    run.on_click(act("run"))
    preempt.on_click(act("preempt", lambda: {"request": which.value, "mode": mode.value}))
    abort.on_click(act("abort", lambda: {"request": which.value}))
    redraw()
    panel = w.VBox([w.HBox([prompt, max_tokens, n, add]), w.HBox([step, run, which, preempt, abort]), mode,
                    status, fig if out is None else out])
    panel.engine = engine
    panel.panel_model = panel_model
    return panel
