"""The live serving panel (chapter 7): submit requests, step the engine, preempt, watch the queues.

:func:`serving_panel` puts buttons around an :class:`~paged_kv.engine.LLMEngine` serving the
tiny model: add a request (prompt text, tokens to generate, samples), run one step or run until
idle, preempt a running request (by the engine's mode: recompute or swap), abort a request in
any state (its blocks are freed at once, :meth:`LLMEngine.abort_request`).  The figure
(:mod:`paged_kv.viz.serving`: queues, GPU pool, CPU pool) updates in place after every action;
a refused request (admission "never") is shown and changes nothing; any other error is shown too
(:mod:`~paged_kv.widgets.panel`), and the next click runs as usual.  The
status line shows each sample's text as it streams (:attr:`RequestOutput.text
<paged_kv.engine.RequestOutput.text>`: a character that a step cut in the middle is held back
until its last byte comes, not shown as "\ufffd"), escaped, since a model may sample "<".
"""

from __future__ import annotations


import ipywidgets as w

from ..engine import EngineConfig, LLMEngine
from ..errors import PagedKVError
from ..model import SamplingParams, load_tiny_model
from ..viz.serving import refresh_serving_figure, serving_figure
from .panel import button_action, figure_widget_or_output, outputs_html, run_until_idle, status_html, update_figure

__all__ = ["serving_panel"]


def serving_panel(model=None, tokenizer=None, config: EngineConfig | None = None,
                  use_figure_widget: bool | None = None, load_model: bool = True):
    """The live panel over a fresh recording :class:`LLMEngine`; returns an ``ipywidgets.VBox``
    whose ``.engine`` attribute is the engine.

    Default config: 16 GPU blocks and 16 CPU blocks of 4 tokens, budget 8 tokens per step, no
    watermark, preemption by swap; the toggle picks the mode of the "preempt" button (a swap
    without a CPU pool, or without room in it, falls back to recompute).  With ``model=None`` and ``load_model`` the bundled tiny model is loaded.
    """
    if model is None and load_model:
        model, tokenizer = load_tiny_model()
    config = config or EngineConfig(block_size=4, num_gpu_blocks=16, num_cpu_blocks=16, watermark=0.0,
                                    max_num_batched_tokens=8, preemption_mode="swap")
    engine = LLMEngine(model, config, tokenizer=tokenizer, record=True)
    title = "live engine"
    fig, out = figure_widget_or_output(serving_figure(engine.records, title, replay=False), use_figure_widget)

    prompt = w.Text(value="To be, or not to be", description="prompt", layout=w.Layout(width="300px"))
    max_tokens = w.BoundedIntText(value=12, min=1, max=200, description="new tokens", layout=w.Layout(width="170px"))
    n = w.BoundedIntText(value=1, min=1, max=4, description="samples", layout=w.Layout(width="150px"))
    add = w.Button(description="submit")
    step = w.Button(description="step", button_style="primary")
    run = w.Button(description="run until idle")
    which = w.Dropdown(options=[], description="request", layout=w.Layout(width="170px"))
    preempt = w.Button(description="preempt", button_style="warning")
    abort = w.Button(description="abort", button_style="danger")
    mode = w.ToggleButtons(options=["swap", "recompute"], value=config.preemption_mode, description="mode")
    status = w.HTML()

    def redraw(note: str = "") -> None:
        update_figure(fig, out, lambda f: refresh_serving_figure(f, engine.records, title),
                      lambda: serving_figure(engine.records, title, replay=False))
        keep = which.value
        sch = engine.scheduler
        live = sorted([*sch.waiting, *sch.running, *sch.swapped], key=lambda r: r.order)
        which.options = [str(r.request_id) for r in live]
        if which.options:                        # keep the selection, or pick the first unfinished request
            which.value = keep if keep in which.options else which.options[0]
        status.value = status_html(note, outputs_html(engine.outputs()))    # streamed: RequestOutput.text

    def act(fn):                                 # never raises: errors go to the status line
        return button_action(fn, redraw, status)

    def submit():
        k = int(n.value)
        params = SamplingParams(max_tokens=int(max_tokens.value), n=k,
                                temperature=0.8 if k > 1 else 0.0, seed=0 if k > 1 else None)
        rid = engine.add_request(prompt.value, params, request_id=_next_name(engine))
        return f"request {rid} is waiting"

    def preempt_selected():
        if which.value is None:
            return "no running request to preempt"
        used = engine.scheduler.preempt(_request_id(engine, which.value), mode.value)
        return f"request {which.value} preempted by {used}"

    def abort_selected():
        if which.value is None:
            return "no request to abort"
        engine.abort_request(_request_id(engine, which.value))
        return f"request {which.value} aborted: its blocks are free"

    add.on_click(act(submit))
    step.on_click(act(lambda: engine.step() and None))
    run.on_click(act(lambda: run_until_idle(engine)))
    preempt.on_click(act(preempt_selected))
    abort.on_click(act(abort_selected))
    redraw()
    panel = w.VBox([w.HBox([prompt, max_tokens, n, add]), w.HBox([step, run, which, preempt, abort]), mode,
                    status, fig if out is None else out])
    panel.engine = engine
    return panel


def _next_name(engine: LLMEngine) -> str:
    used = {str(r) for r in engine.scheduler.requests}
    for k in range(26 * 26):
        name = chr(65 + k % 26) + ("" if k < 26 else str(k // 26))
        if name not in used:
            return name
    raise PagedKVError("too many requests for one panel")


def _request_id(engine: LLMEngine, name: str):
    for rid in engine.scheduler.requests:
        if str(rid) == name:
            return rid
    raise PagedKVError(f"no request {name!r}")
