"""The engine layer: serving loops over the real model, blocks and cache.

* :mod:`~paged_kv.engine.live`: :class:`LiveRequests`, the live block panel's loop (chapter 5).
* :mod:`~paged_kv.engine.llm_engine`: :class:`LLMEngine` (add_request / step / generate), chapter 7;
  :mod:`~paged_kv.engine.config`: its :class:`EngineConfig`.
* :mod:`~paged_kv.engine.runner`: :class:`ModelRunner` (the tiny model over a paged cache);
  :mod:`~paged_kv.engine.timing_runner`: :class:`TimingRunner` (a timing model of a large one, its
  swaps timed by :class:`SwapTime`); each
  returns a :class:`ModelRunnerOutput` (:mod:`~paged_kv.engine.runner_output`).
* :mod:`~paged_kv.engine.draft_proposer`: :class:`DraftModelProposer`, speculative decoding's
  draft model over a paged cache of its own (chapter 9; torch).
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
module here but ``runner``, ``draft_proposer``, ``serving`` and ``exactness`` imports without torch and numpy (the
browser build runs them); ``LiveRequests`` and ``LLMEngine`` load the model's side only when
given a model.
"""

import lazy_loader as _lazy

# "runner" and "draft_proposer" are submodules here too: llm_engine names them with lazy_loader.load
# (torch, on first use), which leaves them in sys.modules unbound, and ``paged_kv.engine.runner``
# must still find it.
__getattr__, __dir__, __all__ = _lazy.attach(__name__, submodules=["runner", "draft_proposer"], submod_attrs={
    "config": ["EngineConfig"],
    "draft_proposer": ["DraftModelProposer"],
    "live": ["LiveRequests"],
    "llm_engine": ["LLMEngine"],
    "metrics": ["DISTSERVE_CHATBOT_OPT13B", "SLO", "EngineStats", "goodput_rate", "inter_token_latencies",
                "percentile", "request_goodput", "slo_attainment", "summarize"],
    "outputs": ["RequestOutput"],
    "runner": ["ModelRunner"],
    "runner_output": ["ModelRunnerOutput"],
    "serving": ["ServeResult", "engine_config_for", "rate_sweep", "serve_static", "serve_sweep", "serve_trace"],
    "step_record": ["StepRecord"],
    "timing_runner": ["SwapTime", "TimingRunner"],
    "token_source": ["RecordedTokens", "TokenSource"],
})
__all__.remove("runner")              # the same list __dir__ returns
__all__.remove("draft_proposer")
