"""Speculative decoding's bookkeeping (chapter 9), pure Python: the drafting and acceptance rules.

A cheap proposer guesses the next ``k`` tokens, the target model checks all of them in one pass
(a ``1 + k``-token chunk over the cached context), and the engine keeps the longest prefix the
target agrees with plus the target's own next token; the draft slots the target rejected are
rolled back (:meth:`paged_kv.blocks.BlockSpaceManager.truncate`).  Leviathan, Kalman & Matias,
"Fast Inference from Transformers via Speculative Decoding" (ICML 2023); vLLM v1's
``vllm/v1/spec_decode/`` for the engine side.

* :mod:`~paged_kv.spec_decode.config`: :class:`SpeculativeConfig`, vLLM's ``speculative_config``;
* :mod:`~paged_kv.spec_decode.ngram`: :class:`NgramProposer`, prompt-lookup drafting;
* :mod:`~paged_kv.spec_decode.acceptance`: :func:`accept_greedy`, the greedy acceptance rule.

No torch and no numpy: the scheduler drafts with it and the browser edition runs it.
"""

from .acceptance import accept_greedy
from .config import SPECULATIVE_METHODS, SpeculativeConfig
from .ngram import NgramProposer

__all__ = ["SPECULATIVE_METHODS", "NgramProposer", "SpeculativeConfig", "accept_greedy"]
