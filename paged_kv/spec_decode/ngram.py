"""Prompt-lookup drafting: guess the next tokens by finding the sequence's last few tokens earlier
in the sequence itself (Saxena, "Prompt Lookup Decoding", 2023; vLLM's ``ngram`` method).

Text repeats itself (names, code, quoted passages, a verse's refrain), so the tokens that followed
an earlier occurrence of the current n-gram are a free guess at what comes next: no draft model,
no GPU time, only a search through the token ids.  A wrong guess costs only the verify pass's
extra positions (:mod:`~paged_kv.spec_decode.acceptance`).

The rule, as vLLM v1's ``NgramProposer`` applies it (``vllm/v1/spec_decode/ngram_proposer.py``):
the *longest* n in ``[prompt_lookup_min, prompt_lookup_max]`` whose final n-gram occurs earlier;
of that n-gram's earlier occurrences, the **earliest**; the up to ``k`` tokens after it (fewer
when it runs into the end of the sequence).  (An "earlier occurrence" may overlap the final
n-gram itself: in ``a a a`` the 2-gram ``a a`` occurs at position 0.)  Pure Python, O(T · n) per
call: the teaching version of vLLM's KMP-style scan.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import ConfigError, PromptError
from ..validate import count

__all__ = ["NgramProposer"]


class NgramProposer:
    """Drafts up to ``num_speculative_tokens`` tokens by prompt lookup.

    Args:
        num_speculative_tokens: ``k``, the most tokens proposed (>= 1).
        prompt_lookup_min, prompt_lookup_max: the n-gram lengths tried, longest first (tokens).

    Raises:
        ConfigError: a count that is not an int >= 1, or ``min > max``.
    """

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int = 5,
                 prompt_lookup_max: int | None = None) -> None:
        self.k = count("num_speculative_tokens", num_speculative_tokens, 1)
        self.min_n = count("prompt_lookup_min", prompt_lookup_min, 1)
        self.max_n = self.min_n if prompt_lookup_max is None else count("prompt_lookup_max", prompt_lookup_max, 1)
        if self.min_n > self.max_n:
            raise ConfigError(f"prompt_lookup_min ({self.min_n}) must be <= prompt_lookup_max ({self.max_n})")

    @classmethod
    def from_config(cls, config) -> "NgramProposer":
        """From a :class:`~paged_kv.spec_decode.config.SpeculativeConfig`."""
        return cls(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)

    def propose(self, token_ids: Sequence[int], limit: int | None = None, *, seq_id=None) -> list[int]:
        """The draft after ``token_ids`` (the sequence so far: prompt and output), at most
        ``min(k, limit)`` tokens; ``[]`` when no n-gram of the allowed lengths recurs.  ``seq_id``
        is accepted for the proposer protocol (:mod:`~paged_kv.spec_decode.proposer`) and unused:
        the lookup keeps nothing between calls.

        Raises:
            PromptError: ``token_ids`` is not a sequence of ints.
        """
        tokens = list(token_ids)
        if any(not isinstance(t, int) or isinstance(t, bool) for t in tokens):
            raise PromptError(f"token ids must be ints, got {tokens[:8]!r}")
        k = self.k if limit is None else min(self.k, max(0, limit))
        total = len(tokens)
        if k == 0:
            return []
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            suffix = tokens[total - n:]
            for start in range(0, total - n):          # earliest first; never the suffix itself
                if tokens[start:start + n] == suffix:
                    after = start + n
                    return tokens[after:after + k]
        return []

    def __repr__(self) -> str:
        return f"NgramProposer(k={self.k}, n={self.min_n}..{self.max_n})"
