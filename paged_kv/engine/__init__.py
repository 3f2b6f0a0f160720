"""The engine layer: serving loops over the real model, blocks and cache.

* :mod:`~paged_kv.engine.live`: :class:`LiveRequests`, the live block panel's loop (chapter 5).
* :mod:`~paged_kv.engine.llm_engine`: :class:`LLMEngine` (add_request / step / generate), its
  :class:`EngineConfig`, :class:`RequestOutput` and :class:`EngineStats` (chapter 7).
* :mod:`~paged_kv.engine.runner`: :class:`ModelRunner` (the tiny model over a paged cache) and
  :class:`TimingRunner` (a timing model of a large one).
"""

from .live import LiveRequests
from .llm_engine import EngineConfig, EngineStats, LLMEngine, RequestOutput
from .runner import ModelRunner, TimingRunner

__all__ = ["EngineConfig", "EngineStats", "LLMEngine", "LiveRequests", "ModelRunner", "RequestOutput",
           "TimingRunner"]
