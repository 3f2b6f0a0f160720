"""The decoders behind :func:`paged_kv.decoding.generate`: one small strategy object per cache mode.

Each has ``prefill(prompts) -> [B, V]`` logits and ``decode(new_tokens) -> [B, V]`` logits, where
the batch holds ``n`` sequences per prompt (parallel sampling; ``n = 1`` by default), sequence
``b = r * n + j`` being sample ``j`` of prompt ``r``:

* :class:`RecomputeDecoder` (chapter 1): no cache; every step runs the model over the whole prefix.
* :class:`ContiguousDecoder` (chapter 2): a :class:`~paged_kv.storage.ContiguousKVCache`; one
  prefill over the prompts, then each step feeds only the newest token and reads the cached K/V.
* :class:`PagedDecoder` (chapters 5 and 6): the same through blocks handed out on demand, where the
  two halves of vLLM meet (vLLM paper §4.3): the :class:`~paged_kv.blocks.BlockSpaceManager` gives
  out blocks and slots, :func:`~paged_kv.storage.run_from_manager` turns them into the slot mapping
  and block tables the :class:`~paged_kv.storage.PagedKVCache` reads.  With ``n > 1`` a prompt is
  prefilled once and its samples *fork* from it, sharing its blocks until they write
  (copy-on-write, §4.4); the other decoders run the prompt ``n`` times.

All three must give the same tokens (``tests/decoding/test_generate.py``,
``tests/decoding/test_parallel_sampling.py``).  A cache holds ``prompt + max_new_tokens - 1`` tokens per
sequence at the end: the last sampled token is returned, never fed back, so its K/V is never
written (:func:`stored_tokens`).

Legend: B batch, T tokens, V vocab, NB blocks, BS block size.
"""

from __future__ import annotations

import torch

from ..blocks import BlockHistory, BlockSpaceManager, blocks_needed, group_blocks_needed, stored_tokens
from ..defaults import BLOCK_SIZE
from ..errors import ConfigError, OutOfBlocksError
from ..model.attention import AttentionMetadata
from ..model.llama import TinyLlama
from ..storage import (ContiguousKVCache, PagedKVCache, last_token_logits, padded_block_tables, right_pad,
                       run_from_manager)
from ..validate import count

__all__ = ["CACHE_MODES", "ContiguousDecoder", "PagedDecoder", "RecomputeDecoder", "make_decoder"]

CACHE_MODES = ("recompute", "contiguous", "paged")


class RecomputeDecoder:
    """Chapter 1: no cache; every step re-runs the model over prompt + generated tokens."""

    cache_bytes = 0

    def __init__(self, model: TinyLlama, backend: str, n: int = 1) -> None:
        self.model, self.backend, self.n = model, backend, count("n", n, 1)
        self.seqs: list[list[int]] = []

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        self.seqs = [list(p) for p in prompts for _ in range(self.n)]
        return self._run()

    def decode(self, new_tokens: list[int]) -> torch.Tensor:
        for s, t in zip(self.seqs, new_tokens):
            s.append(t)
        return self._run()

    def _run(self) -> torch.Tensor:
        ids, lens = right_pad(self.seqs, self.model.device)
        meta = AttentionMetadata.for_prefill(lens, ids.shape[1])
        return last_token_logits(self.model(ids, meta, None, self.backend), lens)


class ContiguousDecoder:
    """Chapter 2: one ``ContiguousKVCache`` row of ``max_len`` slots per sequence (``n`` rows per
    prompt: a contiguous cache cannot share)."""

    def __init__(self, model: TinyLlama, backend: str, batch_size: int, max_len: int, n: int = 1) -> None:
        self.model, self.backend, self.n = model, backend, count("n", n, 1)
        self.cache = ContiguousKVCache(model.cfg, batch_size * self.n, max_len, dtype=model.dtype,
                                       device=model.device)
        self.cache_bytes = self.cache.nbytes
        self.seq_lens = torch.zeros(batch_size * self.n, dtype=torch.int32, device=model.device)

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        ids, lens = right_pad([p for p in prompts for _ in range(self.n)], self.model.device)
        meta = AttentionMetadata.for_prefill(lens, ids.shape[1])
        self.seq_lens = lens.clone()
        return last_token_logits(self.model(ids, meta, self.cache, self.backend), lens)

    def decode(self, new_tokens: list[int]) -> torch.Tensor:
        self.seq_lens = self.seq_lens + 1
        ids = torch.tensor(new_tokens, dtype=torch.long, device=self.model.device)[:, None]
        meta = AttentionMetadata.for_decode(self.seq_lens)
        return self.model(ids, meta, self.cache, self.backend)[:, 0]


class PagedDecoder:
    """Prefill and decode steps of a batch whose KV cache lives in blocks handed out on demand.

    Sequence ``b = r * n + j`` of the batch (sample ``j`` of prompt ``r``) is sequence id ``b`` in
    :attr:`manager`.  A block is taken only when a sequence's last block is full, so at any time
    each sequence wastes fewer than ``block_size`` slots (the contiguous cache reserves ``max_len``
    slots per sequence).  With ``n > 1``, prompt ``r`` is prefilled once as sequence ``r * n`` and
    the other samples fork from it (:meth:`~paged_kv.blocks.BlockSpaceManager.fork`): they share its
    blocks until they write, and the shared partial block is copied on write (vLLM paper §4.4).

    Args:
        model: the :class:`~paged_kv.model.TinyLlama` (its dtype and device are the cache's).
        backend: ``"torch"`` or ``"triton"`` for the cache writes and the attention.
        prompts: the batch's prompt token ids (used to size the pool; :meth:`prefill` takes them).
        max_new_tokens: tokens each sequence will generate.
        block_size: tokens per block (BS), default :data:`paged_kv.defaults.BLOCK_SIZE` (16, vLLM's).
        num_blocks: blocks in the pool (NB); default: exactly what the batch can use,
            ``sum_r group_blocks_needed(len(prompt_r), len(prompt_r) + max_new_tokens - 1, n, BS)``.
        n: samples per prompt.
        history: a :class:`~paged_kv.blocks.BlockHistory` (over a fresh manager) to drive the
            bookkeeping through, recording a snapshot of the pool after every event for figures;
            default: a non-recording one over a manager of ``num_blocks``.
        label: ``label(token_id) -> str``, the text a recorded slot shows (with ``history``).

    Attributes:
        manager: the :class:`~paged_kv.blocks.BlockSpaceManager` (bookkeeping).
        cache: the :class:`~paged_kv.storage.PagedKVCache` (storage).
        cache_bytes: bytes the pool allocated (all layers, K and V).
        seq_lens: ``[B]`` int32, tokens cached per sequence after the last step.

    Raises:
        ConfigError: a non-positive block size, pool or ``n``.
        OutOfBlocksError: the pool cannot hold the prompts (at prefill) or a new token (at decode).
    """

    def __init__(self, model: TinyLlama, backend: str, prompts: list[list[int]], max_new_tokens: int,
                 block_size: int = BLOCK_SIZE, num_blocks: int | None = None, n: int = 1,
                 history: BlockHistory | None = None, label=None) -> None:
        block_size = count("block_size (tokens per block)", block_size, 1)
        max_new_tokens = count("max_new_tokens", max_new_tokens, 1)
        self.n = count("n", n, 1)
        if num_blocks is None:
            num_blocks = sum(group_blocks_needed(len(p), stored_tokens(len(p), max_new_tokens), self.n, block_size)
                             for p in prompts)
        self.model, self.backend = model, backend
        self.block_size = block_size
        self.history = history or BlockHistory(BlockSpaceManager(num_blocks, block_size), record=False)
        self.manager = self.history.manager
        self.label = label or str
        self.cache = PagedKVCache(model.cfg, self.manager.num_blocks, block_size, dtype=model.dtype,
                                  device=model.device)
        self.cache_bytes = self.cache.nbytes
        self.seq_lens = torch.zeros(len(prompts) * self.n, dtype=torch.int32, device=model.device)

    @property
    def seq_ids(self) -> list[int]:
        return list(range(self.seq_lens.shape[0]))

    def block_tables(self) -> torch.Tensor:
        """``[B, max_blocks]`` int32: each sequence's physical block ids, right-padded with 0
        (:func:`~paged_kv.storage.padded_block_tables`; padding is never read)."""
        return padded_block_tables([self.manager.block_ids(s) for s in self.seq_ids], device=self.model.device)

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Allocate each prompt's blocks once, write its K/V, fork its other samples (no copy, no new
        block); return ``[B, V]`` next-token logits, one row per sequence."""
        needed = sum(blocks_needed(len(p), self.block_size) for p in prompts)
        if needed > self.manager.num_free_blocks:      # all or nothing, before any allocation
            raise OutOfBlocksError(needed, self.manager.num_free_blocks, f"{len(prompts)} prompts")
        heads = [r * self.n for r in range(len(prompts))]
        for seq, p in zip(heads, prompts):
            self.history.allocate(seq, [self.label(t) for t in p] if self.history.record else len(p))
        logits = self._run(heads, [list(p) for p in prompts], "prefill")          # (R, V)
        for seq in heads:
            for j in range(1, self.n):
                self.history.fork(seq, seq + j)
        self._refresh_lens()
        return logits.repeat_interleave(self.n, dim=0)                              # (R * n, V)

    def decode(self, new_tokens: list[int]) -> torch.Tensor:
        """Give each sequence one slot (a new block if its last is full, a copy if it is shared and
        partly filled), write the new tokens' K/V there, attend through the block tables; returns
        ``[B, V]`` logits."""
        needed = self.manager.blocks_to_append_all(self.seq_ids)
        if needed > self.manager.num_free_blocks:      # all or nothing, before any append
            raise OutOfBlocksError(needed, self.manager.num_free_blocks, "one decode token per sequence")
        for i, t in zip(self.seq_ids, new_tokens):
            self.history.append(i, self.label(t))
        logits = self._run(self.seq_ids, [[t] for t in new_tokens], "decode")
        self._refresh_lens()
        return logits

    def _run(self, seqs: list[int], new_tokens: list[list[int]], phase: str) -> torch.Tensor:
        return run_from_manager(self.model, self.cache, self.manager, seqs, new_tokens, phase, self.backend)

    def _refresh_lens(self) -> None:
        self.seq_lens = torch.tensor([self.manager.num_tokens(i) for i in self.seq_ids], dtype=torch.int32,
                                     device=self.model.device)

    def free(self) -> None:
        """Return every sequence's blocks to the pool."""
        for i in self.seq_ids:
            if i in self.manager:
                self.history.free(i)


def make_decoder(model: TinyLlama, cache: str, backend: str, prompts: list[list[int]], max_new_tokens: int,
                 block_size: int = BLOCK_SIZE, n: int = 1):
    """The decoder object for a cache mode (a small strategy object with prefill/decode), for ``n``
    samples per prompt.  ``block_size`` (tokens per block) is used by ``cache="paged"`` only.

    Raises:
        ConfigError: an unknown cache mode.
    """
    if cache == "recompute":
        return RecomputeDecoder(model, backend, n=n)
    if cache == "contiguous":
        longest = max(map(len, prompts))   # rows hold what is written: the last token is never fed back
        return ContiguousDecoder(model, backend, len(prompts), stored_tokens(longest, max_new_tokens), n=n)
    if cache == "paged":
        return PagedDecoder(model, backend, prompts, max_new_tokens, block_size=block_size, n=n)
    raise ConfigError(f"cache must be one of {CACHE_MODES}, got {cache!r}")
