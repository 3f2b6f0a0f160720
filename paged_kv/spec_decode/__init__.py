"""Speculative decoding's bookkeeping (chapter 9), pure Python: the drafting and acceptance rules.

A cheap proposer guesses the next ``k`` tokens, the target model checks all of them in one pass
(a ``1 + k``-token chunk over the cached context), and the engine keeps the longest prefix the
target agrees with plus the target's own next token; the draft slots the target rejected are
rolled back (:meth:`paged_kv.blocks.BlockSpaceManager.truncate`).  Leviathan, Kalman & Matias,
"Fast Inference from Transformers via Speculative Decoding" (ICML 2023); vLLM v1's
``vllm/v1/spec_decode/`` for the engine side.

* :mod:`~paged_kv.spec_decode.config`: :class:`SpeculativeConfig`, vLLM's ``speculative_config``;
* :mod:`~paged_kv.spec_decode.ngram`: :class:`NgramProposer`, prompt-lookup drafting;
* :mod:`~paged_kv.spec_decode.proposer`: :class:`Proposer`, what the scheduler asks of a drafter;
* :mod:`~paged_kv.spec_decode.acceptance`: :func:`accept_greedy`, the greedy acceptance rule;
* :mod:`~paged_kv.spec_decode.sampling_rule`: :func:`speculative_sample`, the speculative-sampling
  rule (Leviathan et al. 2023, Alg. 1), exact over Fractions with an injected random source;
* :mod:`~paged_kv.spec_decode.enumeration`: :func:`exact_output_distribution`, the output
  distribution with and without speculation, enumerated exactly;
* :mod:`~paged_kv.spec_decode.replay`: :func:`replay_speculation`, greedy speculation's KV side
  (propose, lookahead slots, accept, rollback) replayed through a block manager, no model.

The same rule over tensors, for the engine, is :mod:`paged_kv.model.rejection_sampler` (torch).

No torch and no numpy: the scheduler drafts with it and the browser edition runs it.
"""

from .acceptance import accept_greedy
from .config import SPECULATIVE_METHODS, SpeculativeConfig
from .enumeration import exact_output_distribution, speculative_distribution, target_distribution
from .ngram import NgramProposer
from .proposer import Proposer, check_draft, check_proposer
from .replay import PHASES, SlotState, SpecStep, SpeculationTrace, replay_speculation
from .sampling_rule import (FLOAT_TOLERANCE, check_distribution, residual, rule_outcomes, speculative_sample,
                            uniform_chooser)

__all__ = ["FLOAT_TOLERANCE", "PHASES", "SPECULATIVE_METHODS", "NgramProposer", "Proposer", "SlotState", "SpecStep",
           "SpeculationTrace", "SpeculativeConfig", "accept_greedy",
           "check_distribution", "check_draft", "check_proposer", "exact_output_distribution", "residual",
           "rule_outcomes", "speculative_distribution",
           "replay_speculation", "speculative_sample", "target_distribution", "uniform_chooser"]
