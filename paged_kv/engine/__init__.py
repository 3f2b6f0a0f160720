"""The engine layer: serving loops over the real model, blocks and cache.

* :mod:`~paged_kv.engine.live`: :class:`LiveRequests`, the live block panel's loop (chapter 5).
* :mod:`~paged_kv.engine.llm_engine`: :class:`LLMEngine` (add_request / step / generate), chapter 7;
  :mod:`~paged_kv.engine.config`: its :class:`EngineConfig`.
* :mod:`~paged_kv.engine.runner`: :class:`ModelRunner` (the tiny model over a paged cache);
  :mod:`~paged_kv.engine.timing_runner`: :class:`TimingRunner` (a timing model of a large one); each
  returns a :class:`ModelRunnerOutput` (:mod:`~paged_kv.engine.runner_output`).
* :mod:`~paged_kv.engine.token_source`: where a token comes from without the model
  (:class:`RecordedTokens`, recorded greedy continuations, and a labelled stand-in).
* :mod:`~paged_kv.engine.outputs`: :class:`RequestOutput`; :mod:`~paged_kv.engine.metrics`:
  :class:`EngineStats`, latency percentiles (:func:`percentile`, :func:`summarize`,
  :func:`inter_token_latencies`), an :class:`SLO` and goodput (:func:`slo_attainment`,
  :func:`request_goodput`, :func:`goodput_rate`); :mod:`~paged_kv.engine.step_record`:
  :class:`StepRecord` (a step as plain data).
* :mod:`~paged_kv.engine.serving`: :func:`serve_trace` (a trace's arrivals over time),
  :func:`serve_static` (static batching, for comparison), :func:`serve_sweep` (every run over request
  rates) and :func:`rate_sweep` (latency against request rate), :class:`SwapTime`, :func:`engine_config_for`.

The names below are imported on first use (``lazy_loader``, as ``paged_kv`` does).  Every
module here but ``runner``, ``serving`` and ``exactness`` imports without torch and numpy (the
browser build runs them); ``LiveRequests`` and ``LLMEngine`` load the model's side only when
given a model.
"""

import lazy_loader as _lazy

__getattr__, __dir__, __all__ = _lazy.attach(__name__, submod_attrs={
    "config": ["EngineConfig"],
    "live": ["LiveRequests"],
    "llm_engine": ["LLMEngine"],
    "metrics": ["DISTSERVE_CHATBOT_OPT13B", "SLO", "EngineStats", "goodput_rate", "inter_token_latencies",
                "percentile", "request_goodput", "slo_attainment", "summarize"],
    "outputs": ["RequestOutput"],
    "runner": ["ModelRunner"],
    "runner_output": ["ModelRunnerOutput"],
    "serving": ["ServeResult", "SwapTime", "engine_config_for", "rate_sweep", "serve_static", "serve_sweep",
                "serve_trace"],
    "step_record": ["StepRecord"],
    "timing_runner": ["TimingRunner"],
    "token_source": ["RecordedTokens", "TokenSource"],
})
