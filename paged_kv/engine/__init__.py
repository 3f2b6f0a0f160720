"""The engine layer: serving loops over the real model, blocks and cache.

* :mod:`~paged_kv.engine.live`: :class:`LiveRequests`, the live block panel's loop (chapter 5).
* :mod:`~paged_kv.engine.llm_engine`: :class:`LLMEngine` (add_request / step / generate), chapter 7;
  :mod:`~paged_kv.engine.config`: its :class:`EngineConfig`.
* :mod:`~paged_kv.engine.runner`: :class:`ModelRunner` (the tiny model over a paged cache) and
  :class:`TimingRunner` (a timing model of a large one), each returning a :class:`ModelRunnerOutput`.
* :mod:`~paged_kv.engine.outputs`: :class:`RequestOutput`; :mod:`~paged_kv.engine.metrics`:
  :class:`EngineStats`, latency percentiles (:func:`percentile`, :func:`summarize`,
  :func:`inter_token_latencies`), an :class:`SLO` and goodput (:func:`slo_attainment`,
  :func:`request_goodput`, :func:`goodput_rate`); :mod:`~paged_kv.engine.step_record`:
  :class:`StepRecord` (a step as plain data).
* :mod:`~paged_kv.engine.serving`: :func:`serve_trace` (a trace's arrivals over time),
  :func:`serve_static` (static batching, for comparison), :func:`serve_sweep` (every run over request
  rates) and :func:`rate_sweep` (latency against request rate), :class:`SwapTime`, :func:`engine_config_for`.
"""

from .live import LiveRequests
from .config import EngineConfig
from .llm_engine import LLMEngine
from .metrics import (DISTSERVE_CHATBOT_OPT13B, SLO, EngineStats, goodput_rate, inter_token_latencies, percentile,
                      request_goodput, slo_attainment, summarize)
from .outputs import RequestOutput
from .runner import ModelRunner, ModelRunnerOutput, TimingRunner
from .serving import ServeResult, SwapTime, engine_config_for, rate_sweep, serve_static, serve_sweep, serve_trace
from .step_record import StepRecord

__all__ = ["DISTSERVE_CHATBOT_OPT13B", "EngineConfig", "EngineStats", "LLMEngine", "LiveRequests", "ModelRunner",
           "ModelRunnerOutput", "RequestOutput", "SLO", "ServeResult", "StepRecord", "SwapTime", "TimingRunner",
           "engine_config_for", "goodput_rate", "inter_token_latencies", "percentile", "rate_sweep",
           "request_goodput", "serve_static", "serve_sweep", "serve_trace", "slo_attainment", "summarize"]
