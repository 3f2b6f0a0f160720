"""The decoding layer (chapters 1, 2 and 5): generate text with the tiny model, recomputing or
through a contiguous or paged KV cache, and measure what each step costs.

* :mod:`~paged_kv.decoding.generate`: :func:`generate`, :class:`GenerationResult`;
* :mod:`~paged_kv.decoding.decoders`: one decoder per cache mode (recompute, contiguous, paged),
  ``n`` samples per prompt sharing the prompt's blocks;
* :mod:`~paged_kv.decoding.beam_search`: :func:`beam_search` on shared blocks (chapter 6);
* :mod:`~paged_kv.decoding.profiling`: per-step time, counted FLOPs, the FLOP formulas, and one
  layer of decode attention timed as the context grows;
* :mod:`~paged_kv.decoding.speculative`: :func:`speculative_greedy`, speculative decoding by full
  recompute, the reference loop of chapter 9.
"""

from .beam_search import Beam, BeamSearchResult, beam_search, select_candidates
from ..blocks import stored_tokens
from .decoders import CACHE_MODES, ContiguousDecoder, PagedDecoder, RecomputeDecoder, make_decoder
from .generate import GenerationResult, check_prompts, generate
from .profiling import (AttentionTiming, StepCost, attention_crossover, attention_flops, decode_attention_head_major,
                        forward_flops, profile_decoding, time_decode_attention)
from .speculative import SpeculationResult, speculative_greedy

__all__ = ["Beam", "BeamSearchResult", "beam_search", "select_candidates", "CACHE_MODES", "ContiguousDecoder", "GenerationResult", "PagedDecoder", "RecomputeDecoder",
           "AttentionTiming", "StepCost", "attention_crossover", "decode_attention_head_major", "attention_flops", "check_prompts", "forward_flops", "generate",
           "make_decoder", "profile_decoding", "stored_tokens", "time_decode_attention", "SpeculationResult",
           "speculative_greedy"]
