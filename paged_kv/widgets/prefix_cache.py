"""The live prefix-cache panel (chapter 8): submit prompts that share a prefix, step the tiny model's
engine, watch hits light up, cached-free blocks wait and the least recently used ones go.

:func:`prefix_cache_panel` puts buttons around an :class:`~paged_kv.engine.LLMEngine` with
``enable_prefix_caching`` on, recording every step; the figure is
:func:`paged_kv.viz.prefix_cache.prefix_pool_figure`, redrawn in place after every action.
"""

from __future__ import annotations


import ipywidgets as w

from ..engine import EngineConfig, LLMEngine
from ..model import SamplingParams, load_tiny_model
from ..viz.prefix_cache import prefix_pool_figure, refresh_prefix_pool_figure
from .panel import button_action, figure_widget_or_output, outputs_html, run_until_idle, status_html, update_figure

__all__ = ["SYSTEM_PROMPTS", "prefix_cache_panel"]

SYSTEM_PROMPTS = ("ROMEO: I pray thee, good Mercutio, ", "KING: Speak the speech, I pray you, ")


def _hits(per_admission: list[int]) -> str:
    """A request's prefix-cache hits in words: ``"waiting"`` before its first admission, else the
    tokens hit at each admission (a recompute preemption re-admits it and looks up again)."""
    if not per_admission:
        return "waiting"
    return "hit " + ", then ".join(map(str, per_admission)) + " tokens"


def prefix_cache_panel(model=None, tokenizer=None, config: EngineConfig | None = None,
                       use_figure_widget: bool | None = None, load_model: bool = True):
    """The live panel; returns an ``ipywidgets.VBox`` whose ``.engine`` is the engine.

    Default config: 24 GPU blocks of 4 tokens, a budget of 32 tokens per step, no watermark,
    prefix caching on.  A prompt is a shared prefix (a dropdown) plus the reader's own text.
    With ``model=None`` and ``load_model`` the bundled tiny model is loaded.
    """
    if model is None and load_model:
        model, tokenizer = load_tiny_model()
    config = config or EngineConfig(block_size=4, num_gpu_blocks=24, watermark=0.0, max_num_batched_tokens=32,
                                    enable_prefix_caching=True)
    engine = LLMEngine(model, config, tokenizer=tokenizer, record=True)
    title = "live prefix cache"
    fig, out = figure_widget_or_output(prefix_pool_figure(engine.records, title, replay=False), use_figure_widget)

    prefix = w.Dropdown(options=list(SYSTEM_PROMPTS) + [""], description="prefix", layout=w.Layout(width="380px"))
    own = w.Text(value="what news?", description="own text", layout=w.Layout(width="260px"))
    max_tokens = w.BoundedIntText(value=8, min=1, max=64, description="new tokens", layout=w.Layout(width="170px"))
    add = w.Button(description="submit")
    step = w.Button(description="step", button_style="primary")
    run = w.Button(description="run until idle")
    status = w.HTML()

    def redraw(note: str = "") -> None:
        update_figure(fig, out, lambda f: refresh_prefix_pool_figure(f, engine.records, title),
                      lambda: prefix_pool_figure(engine.records, title, replay=False))
        st = engine.stats
        rate = "" if not st.prefix_queries else (f"hit rate {st.prefix_hits}/{st.prefix_queries} prompt tokens "
                                                 f"= {st.prefix_hit_rate:.0%}<br>")
        status.value = status_html(note, rate + outputs_html(engine.outputs(), lambda o: _hits(o.cached_tokens)))

    def submit():
        rid = engine.add_request(prefix.value + own.value, SamplingParams(max_tokens=int(max_tokens.value)),
                                 request_id=f"R{len(engine.outputs())}")
        return f"request {rid} is waiting"

    add.on_click(button_action(submit, redraw, status))        # never raise: errors go to the status line
    step.on_click(button_action(lambda: engine.step() and None, redraw, status))
    run.on_click(button_action(lambda: run_until_idle(engine), redraw, status))
    redraw()
    panel = w.VBox([w.HBox([prefix, own]), w.HBox([max_tokens, add, step, run]), status,
                    fig if out is None else out])
    panel.engine = engine
    return panel
