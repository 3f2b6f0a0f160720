"""The live prefix-cache panel (chapter 8): submit prompts that share a prefix, step the tiny model's
engine, watch hits light up, cached-free blocks wait and the least recently used ones go.

:func:`prefix_cache_panel` puts buttons around an :class:`~paged_kv.engine.LLMEngine` with
``enable_prefix_caching`` on, recording every step; what each button does is decided by the panel
model :class:`paged_kv.panels.prefix_cache.PrefixCachePanel`, the same one the browser edition's
page drives.  The figure is :func:`paged_kv.viz.prefix_cache.prefix_pool_figure`, redrawn in place
after every action.  :data:`SYSTEM_PROMPTS` (the offered shared prefixes) lives in the panel model
and is re-exported here.
"""

from __future__ import annotations

import html

import ipywidgets as w

from ..engine import EngineConfig
from ..model import load_tiny_model
from ..panels.base import option_label
from ..panels.prefix_cache import DEFAULT_TEXT, MAX_TOKENS, SYSTEM_PROMPTS, PrefixCachePanel, hits_in_words
from ..viz.prefix_cache import prefix_pool_figure, refresh_prefix_pool_figure
from .panel import button_action, figure_widget_or_output, outputs_html, status_html, update_figure

__all__ = ["SYSTEM_PROMPTS", "prefix_cache_panel"]


def prefix_cache_panel(model=None, tokenizer=None, config: EngineConfig | None = None,
                       use_figure_widget: bool | None = None, load_model: bool = True):
    """The live panel; returns an ``ipywidgets.VBox`` whose ``.engine`` is the engine (and
    ``.model`` the :class:`PrefixCachePanel`).

    Default config: 24 GPU blocks of 4 tokens, a budget of 32 tokens per step, no watermark,
    prefix caching on.  A prompt is a shared prefix (a dropdown) plus the reader's own text.
    With ``model=None`` and ``load_model`` the bundled tiny model is loaded; with neither, the
    engine runs the browser edition's timing model and recorded tokens.
    """
    if model is None and load_model:
        model, tokenizer = load_tiny_model()
    panel_model = PrefixCachePanel(model=model, tokenizer=tokenizer, config=config)
    engine = panel_model.new_engine()
    title = panel_model.title
    fig, out = figure_widget_or_output(prefix_pool_figure(engine.records, title, replay=False), use_figure_widget)

    # labelled as the page's dropdown labels them: the empty prefix reads "(none)", not a blank line
    prefix = w.Dropdown(options=[(option_label(p), p) for p in [*SYSTEM_PROMPTS, ""]], value=SYSTEM_PROMPTS[0],
                        description="prefix", layout=w.Layout(width="380px"))
    own = w.Text(value=DEFAULT_TEXT, description="own text", layout=w.Layout(width="260px"))
    max_tokens = w.BoundedIntText(value=8, min=1, max=MAX_TOKENS, description="new tokens", layout=w.Layout(width="170px"))
    add = w.Button(description="submit")
    step = w.Button(description="step", button_style="primary")
    run = w.Button(description="run until idle")
    status = w.HTML()

    def redraw(note: str = "") -> None:
        update_figure(fig, out, lambda f: refresh_prefix_pool_figure(f, engine.records, title),
                      lambda: prefix_pool_figure(engine.records, title, replay=False))
        rate = panel_model.hit_rate(engine)
        timing = html.escape(panel_model.timing_line(engine)) + "<br>" if panel_model.timed else ""   # no model
        status.value = status_html(note, (rate + "<br>" if rate else "") + timing
                                   + outputs_html(engine.outputs(), lambda o: hits_in_words(o.cached_tokens)))

    def act(op: str, fields=dict):              # never raises: errors go to the status line
        return button_action(lambda: panel_model.act(engine, {"op": op, **fields()}), redraw, status)

    add.on_click(act("submit", lambda: {"prefix": prefix.value, "text": own.value,
                                        "max_tokens": int(max_tokens.value)}))
    step.on_click(act("step"))
    run.on_click(act("run"))
    redraw()
    panel = w.VBox([w.HBox([prefix, own]), w.HBox([max_tokens, add, step, run]), status,
                    fig if out is None else out])
    panel.engine = engine
    panel.panel_model = panel_model
    return panel
