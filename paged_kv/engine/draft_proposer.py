"""Drafting with a small model over its own paged KV cache, rolled back the way the target's is.

Speculative decoding (Leviathan et al., ICML 2023; Chen et al. 2023) with a draft *model* (vLLM's
``method: "draft_model"``) runs the draft ``k`` times per step to propose ``k`` tokens.  Re-running
it over the whole sequence each time would cost a full prefill per step; instead the draft keeps
its own KV cache per sequence, exactly as the target does: a :class:`~paged_kv.blocks.BlockSpaceManager`
of its own hands out blocks and slots, a :class:`~paged_kv.storage.PagedKVCache` of ``draft.cfg.num_layers``
layers holds the K/V.  The draft's slots for its own drafts are written speculatively; when the
target rejects some of them, the next call sees a history that differs from what the draft cached
and takes the difference back with :meth:`~paged_kv.blocks.BlockSpaceManager.truncate`, the same
rollback the target's cache gets (vLLM v1 keeps the draft's KV in the same paged pool as the
target's, one more group of layers; ours is a separate pool, so the draft's memory is visible on
its own).

Legend: T tokens of a history, k draft tokens, V vocabulary.
"""

from __future__ import annotations

import itertools
from typing import Hashable, Sequence

import torch

from ..blocks import BlockSpaceManager, blocks_needed
from ..blocks.block_table import check_seq_id
from ..defaults import BLOCK_SIZE
from ..errors import ConfigError, OutOfBlocksError, PromptError
from ..model.llama import TinyLlama
from ..model.sampling import probabilities, sample
from ..sampling_params import SamplingParams
from ..storage import PagedKVCache, run_from_manager
from ..validate import count

__all__ = ["DraftModelProposer"]

_SCRATCH = -1            # the manager's id of the scratch sequence (caller ids get 0, 1, 2, ...)


class DraftModelProposer:
    """Drafts up to ``k`` tokens per call with ``draft_model``, over a paged KV cache of its own.

    The proposer protocol of the engine (as :class:`~paged_kv.spec_decode.NgramProposer`):
    :meth:`propose` returns the greedy draft, :meth:`propose_with_probs` the draft and its
    distributions ``q`` for the speculative-sampling rule, :meth:`release` drops a sequence.

    Cache policy.  Per ``seq_id`` the proposer remembers the tokens whose K/V its cache holds.  A
    call with history ``token_ids`` (prompt and verified output) keeps the longest common prefix of
    the two (never the history's last token, whose logits choose the first draft), rolls the rest
    back with :meth:`BlockSpaceManager.truncate` (rejected drafts and anything after an earlier
    divergence), prefills the history's remaining tokens in one chunk, then runs ``k - 1`` decode
    steps.  The last draft's K/V is never written (no pass needs it), so afterwards the cache holds
    ``T + k - 1`` tokens: the history plus all drafts but the last.  A history sharing no token
    with the cache starts the sequence over (its blocks freed, the history allocated anew).
    ``seq_id=None`` uses one scratch sequence, kept between calls like any other (so a single
    caller such as :func:`~paged_kv.decoding.speculative_greedy` is incremental too).  Nothing is
    evicted behind the caller's back: a finished or preempted request must be :meth:`release`\\ d,
    and the pool is sized by the caller.  The draft's blocks are never shared or prefix-cached.

    Args:
        draft_model: a :class:`~paged_kv.model.TinyLlama` of the target's tokenizer (e.g.
            :func:`~paged_kv.model.draft.truncated_draft`); its dtype and device are the cache's.
        num_speculative_tokens: ``k``, the most tokens one call proposes (>= 1).
        block_size: tokens per block of the draft's pool (BS).
        num_blocks: blocks in the draft's pool (NB); a sequence of history ``T`` needs
            ``ceil((T + k - 1) / BS)`` of them while it is cached.
        backend: ``"torch"`` or ``"triton"`` for the draft's passes.

    Raises:
        ConfigError: a count that is not an int >= 1, or ``draft_model`` not a ``TinyLlama``.
    """

    def __init__(self, draft_model: TinyLlama, num_speculative_tokens: int, *, block_size: int = BLOCK_SIZE,
                 num_blocks: int, backend: str = "torch") -> None:
        if not isinstance(draft_model, TinyLlama):
            raise ConfigError(f"draft_model must be a TinyLlama, got {type(draft_model).__name__}")
        self.model, self.backend = draft_model, backend
        self.k = count("num_speculative_tokens", num_speculative_tokens, 1)
        self.block_size = count("block_size (tokens per block)", block_size, 1)
        self.manager = BlockSpaceManager(count("num_blocks (draft pool)", num_blocks, 1), self.block_size)
        self.cache = PagedKVCache(draft_model.cfg, num_blocks, self.block_size, dtype=draft_model.dtype,
                                  device=draft_model.device)
        self._ids: dict[Hashable, int] = {}          # caller's seq_id -> the manager's id
        self._next_id = itertools.count()
        self._tokens: dict[int, list[int]] = {}      # manager id -> tokens whose K/V are cached

    # --- the protocol ---------------------------------------------------------------------
    def propose(self, token_ids: Sequence[int], limit: int | None = None, *, seq_id=None) -> list[int]:
        """The draft model's greedy continuation of ``token_ids``: ``min(k, limit)`` tokens, fewer
        only where the model's ``max_seq_len`` stops them (drafts sit at positions ``T ..
        max_seq_len - 1``); ``[]`` for ``limit <= 0``, without touching the cache.

        Raises:
            PromptError: an empty history, or token ids that are not ints in ``0 .. V - 1``.
            BlockError: ``seq_id`` not a str/int.
            OutOfBlocksError: the pool cannot hold the history and the drafts (the message gives
                the blocks needed, held and free; nothing changes).
        """
        tokens, _ = self._run(token_ids, limit, seq_id, None, None)
        return tokens

    def propose_with_probs(self, token_ids: Sequence[int], limit: int | None = None, *, seq_id=None,
                           params: SamplingParams | None = None,
                           generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor]:
        """The draft and its distributions: ``(tokens, probs [k, V] fp32)``, row ``i`` the
        distribution token ``i`` was drawn from (:func:`~paged_kv.model.sampling.probabilities`
        under ``params``), the ``q`` of the rejection rule
        (:func:`~paged_kv.model.rejection_sampler.rejection_sample`).  Greedy (``params`` None or
        temperature 0): the tokens of :meth:`propose` and one-hot rows.  Otherwise each token is
        drawn by :func:`~paged_kv.model.sampling.sample` from ``generator``.  ``probs`` is
        ``[0, V]`` for an empty draft.

        Raises:
            as :meth:`propose`; ConfigError: sampling without a generator.
        """
        params = params or SamplingParams(temperature=0.0)
        if not params.greedy and generator is None:
            raise ConfigError("drafting by sampling needs a torch.Generator")
        return self._run(token_ids, limit, seq_id, params, generator)

    def release(self, seq_id=None) -> list[int]:
        """Drop ``seq_id``'s cache (``None``: the scratch sequence); returns the freed block ids.
        A sequence the proposer never saw (or already released) frees nothing."""
        key = self._key(seq_id, create=False)
        self._tokens.pop(key, None)
        if seq_id is not None:
            self._ids.pop(check_seq_id(seq_id), None)
        return self.manager.free(key) if key is not None and key in self.manager else []

    def cached_tokens(self, seq_id=None) -> list[int]:
        """The tokens whose K/V the draft's cache holds for ``seq_id`` (history plus drafts)."""
        key = self._key(seq_id, create=False)
        return list(self._tokens.get(key, []))

    # --- the work -------------------------------------------------------------------------
    def _key(self, seq_id, create: bool) -> int | None:
        if seq_id is None:
            return _SCRATCH
        seq_id = check_seq_id(seq_id)
        if seq_id not in self._ids and create:
            self._ids[seq_id] = next(self._next_id)
        return self._ids.get(seq_id)

    def _history(self, token_ids) -> list[int]:
        tokens = list(token_ids)
        if not tokens:
            raise PromptError("the history to draft after is empty")
        V = self.model.cfg.vocab_size
        if any(type(t) is not int or not 0 <= t < V for t in tokens):
            bad = next(t for t in tokens if type(t) is not int or not 0 <= t < V)
            raise PromptError(f"token ids must be ints in 0..{V - 1}, got {bad!r}")
        return tokens

    def _run(self, token_ids, limit, seq_id, params, generator):
        tokens = self._history(token_ids)
        k = self.k if limit is None else min(self.k, limit)
        k = min(k, self.model.cfg.max_seq_len - len(tokens))
        V = self.model.cfg.vocab_size
        if k <= 0:
            return [], torch.zeros(0, V)
        if seq_id is not None:
            check_seq_id(seq_id)
        key = self._key(seq_id, create=True)
        cached = self._tokens.get(key, [])
        keep = 0
        for a, b in zip(cached, tokens[:-1]):      # the last history token is always run
            if a != b:
                break
            keep += 1
        held = len(self.manager.block_table(key)) if key in self.manager else 0
        needed = blocks_needed(len(tokens) + k - 1, self.block_size)
        if needed > held + self.manager.num_free_blocks:
            raise OutOfBlocksError(needed, held + self.manager.num_free_blocks,
                                   f"the draft's pool ({self.manager.num_blocks} blocks of {self.block_size} tokens), "
                                   f"sequence {seq_id!r} of {len(tokens)} tokens + {k - 1} drafts holding {held} "
                                   f"(release finished sequences or give the proposer more blocks)")
        try:
            logits = self._prefill(key, tokens, keep)                       # (1, V)
            drafts, rows = [], []
            for i in range(k):
                tok, q = self._choose(logits, params, generator)
                drafts.append(tok)
                rows.append(q)
                if i < k - 1:                                               # the last draft is never fed
                    self.manager.append_slot(key)
                    logits = self._forward(key, [tok], "decode")
            self._tokens[key] = tokens + drafts[:-1]
        except BaseException:
            self._tokens.pop(key, None)                                     # never a half-written cache
            if key in self.manager:
                self.manager.free(key)
            raise
        return drafts, torch.cat(rows).float()

    def _prefill(self, key: int, tokens: list[int], keep: int) -> torch.Tensor:
        """Roll ``key`` back to ``keep`` tokens and run the rest of ``tokens`` as one chunk."""
        if keep == 0:
            if key in self.manager:
                self.manager.free(key)
            self.manager.allocate(key, len(tokens))
        else:
            self.manager.truncate(key, keep)
            self.manager.append_slots(key, len(tokens) - keep)
        return self._forward(key, tokens[keep:], "prefill")

    def _forward(self, key: int, new: list[int], phase: str) -> torch.Tensor:
        return run_from_manager(self.model, self.cache, self.manager, [key], [new], phase, self.backend)

    @staticmethod
    def _choose(logits: torch.Tensor, params, generator) -> tuple[int, torch.Tensor]:
        """One draft token from ``logits [1, V]`` and the ``[1, V]`` distribution it came from."""
        if params is None or params.greedy:
            tok = int(logits[0].argmax())
            q = torch.zeros_like(logits, dtype=torch.float32)
            q[0, tok] = 1.0
            return tok, q
        return int(sample(logits, params, [generator])[0]), probabilities(logits, params).float()

    def __repr__(self) -> str:
        return (f"DraftModelProposer(k={self.k}, layers={self.model.cfg.num_layers}, "
                f"pool={self.manager.num_blocks}x{self.block_size})")
