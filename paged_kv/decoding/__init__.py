"""The decoding layer (chapters 1, 2 and 5): generate text with the tiny model, recomputing or
through a contiguous or paged KV cache, and measure what each step costs.

* :mod:`~paged_kv.decoding.generate`: :func:`generate`, :class:`GenerationResult`;
* :mod:`~paged_kv.decoding.decoders`: one decoder per cache mode (recompute, contiguous, paged);
* :mod:`~paged_kv.decoding.profiling`: per-step time, counted FLOPs, and the FLOP and byte formulas.
"""

from .decoders import CACHE_MODES, ContiguousDecoder, PagedDecoder, RecomputeDecoder, make_decoder
from .generate import GenerationResult, check_prompts, generate
from .profiling import StepCost, decode_step_bytes, forward_flops, profile_decoding

__all__ = ["CACHE_MODES", "ContiguousDecoder", "GenerationResult", "PagedDecoder", "RecomputeDecoder",
           "StepCost", "check_prompts", "decode_step_bytes", "forward_flops", "generate", "make_decoder",
           "profile_decoding"]
