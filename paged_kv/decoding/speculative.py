"""Speculative decoding without a cache: the reference loop that chapter 9 starts from.

Each *target pass* runs the model once over the whole sequence plus the draft (a full recompute,
as chapter 1's decoder does) and keeps what :func:`~paged_kv.spec_decode.accept_greedy` keeps, so
the output is plain greedy decoding's by construction, and the count of passes shows what
speculation saves before any KV bookkeeping enters.  The engine's version (chapter 9's subject)
verifies the same ``1 + k`` positions as one chunk over the paged cache and rolls the rejected
draft slots back.  Greedy only.

Legend: T tokens so far, k draft tokens, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import PromptError
from ..spec_decode import NgramProposer, accept_greedy
from ..validate import count

__all__ = ["SpeculationResult", "speculative_greedy"]


@dataclass(frozen=True)
class SpeculationResult:
    """What :func:`speculative_greedy` did.

    Attributes:
        token_ids: prompt plus output.
        target_passes: forward passes of the target (one per verify; plain decoding needs one per
            output token).
        draft_tokens: tokens proposed in all; ``accepted_tokens`` of them kept, ``rolled_back``
            (= drafted - accepted) thrown away with their slots.
    """

    token_ids: list[int]
    target_passes: int
    draft_tokens: int
    accepted_tokens: int

    @property
    def rolled_back(self) -> int:
        return self.draft_tokens - self.accepted_tokens


@torch.no_grad()
def speculative_greedy(model, prompt, max_new_tokens: int, proposer: NgramProposer) -> SpeculationResult:
    """Greedy decoding of ``max_new_tokens`` tokens after ``prompt``, ``proposer`` drafting before
    each target pass; a draft never runs past ``max_new_tokens`` (the pass's own token is the last).

    Raises:
        PromptError: an empty prompt, or one that with the output would pass ``max_seq_len``.
        ConfigError: ``max_new_tokens`` not an int >= 1.
    """
    count("max_new_tokens", max_new_tokens, 1)
    seq = [int(t) for t in prompt]
    if not seq:
        raise PromptError("the prompt is empty")
    end = len(seq) + max_new_tokens
    if end > model.cfg.max_seq_len:
        raise PromptError(f"{len(seq)} prompt + {max_new_tokens} new tokens pass max_seq_len {model.cfg.max_seq_len}")
    passes = drafted = accepted = 0
    while len(seq) < end:
        draft = proposer.propose(seq, limit=end - len(seq) - 1)
        ids = torch.tensor([seq + draft], device=model.device)                    # (1, T + k)
        target = model(ids)[0, len(seq) - 1:].argmax(-1).tolist()                  # (k + 1) greedy tokens
        kept = accept_greedy(draft, target)
        passes, drafted, accepted = passes + 1, drafted + len(draft), accepted + len(kept) - 1
        seq += kept
    return SpeculationResult(seq, passes, drafted, accepted)
