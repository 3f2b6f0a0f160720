"""Chapter 8's panel model: requests that share a prefix, the prefix cache's hits, cached-free
blocks waiting for reuse and least-recently-used evictions.

Every decision of the live prefix-cache panel lives here; the ipywidgets panel
(:func:`paged_kv.widgets.prefix_cache.prefix_cache_panel`) and the browser edition's page controls
both forward the reader's actions to :class:`PrefixCachePanel`.  The engine runs with
``enable_prefix_caching`` on (vLLM's automatic prefix caching: full blocks are hashed with their
prefix and reused; a finished request's full blocks stay cached-free until an allocation evicts
them, least recently used first).  In the browser its time is the timing model's and its tokens
the tiny model's recorded continuations (:mod:`paged_kv.panels.engine_panel`).

Actions (JSON): ``{"op": "submit", "prefix": text, "text": text, "max_tokens": 1..64}`` (the
prompt is the shared prefix, one of :data:`SYSTEM_PROMPTS` or ``""``, followed by the reader's own
text; requests are named ``R0``, ``R1``, ...), ``{"op": "step"}`` and ``{"op": "run"}`` (until idle).
"""

from __future__ import annotations

from typing import Any, Mapping

from ..engine.config import EngineConfig
from ..engine.llm_engine import LLMEngine
from ..errors import ConfigError
from ..sampling_params import SamplingParams
from ..viz.prefix_cache import prefix_pool_figure
from .base import select_control
from .continuations import OWN_TEXTS
from .engine_panel import EnginePanel, EngineState, RooflineTiming, engine_config, int_field, text_field

__all__ = ["DEFAULT_TEXT", "MAX_TOKENS", "PrefixCachePanel", "SYSTEM_PROMPTS", "hits_in_words"]

#: the shared prefixes the panel offers (chapter 8's scripted session uses them too)
SYSTEM_PROMPTS = ("ROMEO: I pray thee, good Mercutio, ", "KING: Speak the speech, I pray you, ")
#: the panel's default own text
DEFAULT_TEXT = "what news?"
#: the most new tokens a request may ask for
MAX_TOKENS = 64


def hits_in_words(per_admission: list[int]) -> str:
    """A request's prefix-cache hits in words: ``"waiting"`` before its first admission, else the
    tokens hit at each admission (a recompute preemption re-admits it and looks up again)."""
    if not per_admission:
        return "waiting"
    return "hit " + ", then ".join(map(str, per_admission)) + " tokens"


class PrefixCachePanel(EnginePanel):
    """The prefix cache's panel model (state: :class:`~paged_kv.panels.engine_panel.EngineState`).

    JSON-able arguments: ``block_size``, ``num_gpu_blocks``, ``max_num_batched_tokens``,
    ``watermark`` and the browser's timing model (``timing_model``, ``gpu``, ``efficiency``);
    prefix caching is always on.  Defaults: 24 blocks of 4 tokens, a budget of 32 tokens, no
    watermark, Llama-2-13B on an A100-40GB (chapter 8's set-up).  Python only: ``model``,
    ``tokenizer``, ``config`` (instead of the knobs; it must enable prefix caching),
    ``recordings``.

    Raises:
        ConfigError: a bad knob, knobs given with ``config``, a ``config`` without prefix caching.
    """

    name = "prefix_cache"
    title = "live prefix cache"
    OPS = {"submit": "submit", "step": "step_once", "run": "run_until_idle"}
    demo_actions = [
        {"op": "submit", "prefix": SYSTEM_PROMPTS[0], "text": "what news?", "max_tokens": 8},
        {"op": "step"},
        {"op": "step"},
        {"op": "submit", "prefix": SYSTEM_PROMPTS[0], "text": "how now?", "max_tokens": 8},
        {"op": "run"},
        {"op": "submit", "prefix": SYSTEM_PROMPTS[1], "text": "what news?", "max_tokens": 8},
        {"op": "run"},
        {"op": "submit", "prefix": SYSTEM_PROMPTS[0], "text": "what news?", "max_tokens": 8},
    ]
    KNOBS = {"block_size": 4, "num_gpu_blocks": 24, "max_num_batched_tokens": 32, "watermark": 0.0}

    def __init__(self, block_size: int | None = None, num_gpu_blocks: int | None = None,
                 max_num_batched_tokens: int | None = None, watermark: float | None = None,
                 timing_model: str = "Llama-2-13B", gpu: str = "A100-40GB", efficiency: float = 0.5, *,
                 model=None, tokenizer=None, config: EngineConfig | None = None,
                 recordings: Mapping[str, str] | None = None) -> None:
        knobs = dict(block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                     max_num_batched_tokens=max_num_batched_tokens, watermark=watermark)
        config = engine_config(config, knobs, self.KNOBS, enable_prefix_caching=True)
        if not config.enable_prefix_caching:
            raise ConfigError("the prefix-cache panel's config must have enable_prefix_caching=True")
        super().__init__(config, model, tokenizer, RooflineTiming(timing_model, gpu, efficiency), recordings)

    # --- ops ------------------------------------------------------------------------------------
    def submit(self, engine: LLMEngine, action: Mapping[str, Any]) -> str:
        prompt = text_field(action, "prefix", SYSTEM_PROMPTS[0]) + text_field(action, "text", DEFAULT_TEXT)
        params = SamplingParams(max_tokens=int_field(action, "max_tokens", 8, 1, MAX_TOKENS))
        rid = engine.add_request(prompt, params, request_id=f"R{len(engine.outputs())}")
        return f"request {rid} is waiting"

    # --- drawing --------------------------------------------------------------------------------
    def figure(self, state: EngineState):
        """The GPU pool now: used, cached and cached-free blocks, this step's hits
        (:func:`paged_kv.viz.prefix_cache.prefix_pool_figure`)."""
        return prefix_pool_figure(state.engine.records, self.title, replay=False)

    def hit_rate(self, engine: LLMEngine) -> str:
        """The engine's prefix-cache hit rate over prompt tokens in words (``""`` before any query)."""
        st = engine.stats
        if not st.prefix_queries:
            return ""
        return f"hit rate {st.prefix_hits}/{st.prefix_queries} prompt tokens = {st.prefix_hit_rate:.0%}"

    def status(self, state: EngineState) -> str:
        """What the last action did, the hit rate, where time and tokens come from, each request's
        hits and text."""
        e = state.engine
        lines = [x for x in (state.message, self.hit_rate(e), self.timing_line(e)) if x]
        return "\n".join(lines + self.output_lines(e, lambda o: hits_in_words(o.cached_tokens)))

    def controls(self) -> list[dict]:
        return [
            select_control("prefix", "prefix", SYSTEM_PROMPTS[0], [*SYSTEM_PROMPTS, ""]),
            select_control("text", "own text", DEFAULT_TEXT, OWN_TEXTS),
            {"kind": "int", "name": "max_tokens", "label": "new tokens", "value": 8, "min": 1, "max": MAX_TOKENS},
            {"kind": "button", "label": "submit", "op": "submit"},
            {"kind": "button", "label": "step", "op": "step"},
            {"kind": "button", "label": "run until idle", "op": "run"},
        ]
