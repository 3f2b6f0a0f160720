"""The engine layer: serving loops over the real model, blocks and cache.

* :mod:`~paged_kv.engine.live`: :class:`LiveRequests`, the live block panel's loop (chapter 5).
* :mod:`~paged_kv.engine.llm_engine`: :class:`LLMEngine` (add_request / step / generate), its
  :class:`EngineConfig`, :class:`RequestOutput`, :class:`EngineStats`, :class:`StepRecord` (chapter 7).
* :mod:`~paged_kv.engine.runner`: :class:`ModelRunner` (the tiny model over a paged cache) and
  :class:`TimingRunner` (a timing model of a large one).
* :mod:`~paged_kv.engine.serving`: :func:`serve_trace` (a trace's arrivals over time),
  :func:`serve_static` (static batching, for comparison), :func:`rate_sweep` (latency against request rate), :class:`SwapTime`, :func:`engine_config_for`.
"""

from .live import LiveRequests
from .llm_engine import EngineConfig, EngineStats, LLMEngine, RequestOutput, StepRecord
from .runner import ModelRunner, TimingRunner
from .serving import ServeResult, SwapTime, engine_config_for, rate_sweep, serve_static, serve_trace

__all__ = ["EngineConfig", "EngineStats", "LLMEngine", "LiveRequests", "ModelRunner", "RequestOutput",
           "ServeResult", "StepRecord", "SwapTime", "TimingRunner", "engine_config_for", "rate_sweep",
           "serve_static", "serve_trace"]
