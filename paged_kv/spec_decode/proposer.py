"""What the scheduler asks of a drafter: the proposer protocol, and the check of what it returns.

A proposer guesses the next tokens of one sequence.  The scheduler calls it for every decoding
sequence it speculates for, at schedule time, with the sequence's tokens so far (prompt and
verified output) and a cap on the draft's length; vLLM v1 drafts in its model runner right after
sampling and hands the drafts to the next step's scheduler, which comes to the same tokens: a
draft depends only on the verified tokens.  Two proposers follow it:
:class:`~paged_kv.spec_decode.ngram.NgramProposer` (prompt lookup, pure Python) and
:class:`~paged_kv.engine.draft_proposer.DraftModelProposer` (a smaller model with a paged KV cache
of its own, torch).  Both are deterministic (a greedy draft model), so the speculative-sampling
rule treats each draft's distribution ``q`` as one-hot on its token, as vLLM does for ``ngram``.
Pure Python.
"""

from __future__ import annotations

from typing import Hashable, Protocol, Sequence, runtime_checkable

from ..errors import ConfigError

__all__ = ["Proposer", "check_draft", "check_proposer"]


@runtime_checkable
class Proposer(Protocol):
    """``propose(token_ids, limit, *, seq_id) -> list[int]``: at most ``limit`` draft token ids
    after ``token_ids`` (``[]``: no guess); ``seq_id`` names the sequence, so a proposer with a
    cache of its own keeps one per sequence.  Optionally ``release(seq_id)``: the sequence has
    finished, drop what is kept for it."""

    def propose(self, token_ids: Sequence[int], limit: int | None = None, *,
                seq_id: Hashable = None) -> list[int]: ...


def check_proposer(proposer) -> object:
    """``proposer`` if it has a callable ``propose``.

    Raises:
        ConfigError: it has none (the message names its type).
    """
    if not callable(getattr(proposer, "propose", None)):
        raise ConfigError(f"a proposer needs propose(token_ids, limit, *, seq_id), got {type(proposer).__name__}")
    return proposer


def check_draft(draft, limit: int, seq_id) -> list[int]:
    """A proposer's answer as a list of ints >= 0, at most ``limit`` long.

    Raises:
        ConfigError: not a sequence of ints >= 0, or longer than ``limit`` (a proposer that ignores
            its cap would overrun ``max_tokens`` and the token budget).
    """
    try:
        tokens = list(draft)
    except TypeError:
        raise ConfigError(f"the proposer returned {draft!r:.60} for sequence {seq_id}, "
                          f"not a list of token ids") from None
    if any(type(t) is not int or t < 0 for t in tokens):
        raise ConfigError(f"the proposer returned {tokens[:6]!r} for sequence {seq_id}: token ids are ints >= 0")
    if len(tokens) > limit:
        raise ConfigError(f"the proposer returned {len(tokens)} draft tokens for sequence {seq_id}, "
                          f"more than its limit {limit}")
    return tokens
