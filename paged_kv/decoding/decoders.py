"""The decoders behind :func:`paged_kv.decoding.generate`: one small strategy object per cache mode.

Each has ``prefill(prompts) -> [B, V]`` logits and ``decode(new_tokens) -> [B, V]`` logits:

* :class:`RecomputeDecoder` (chapter 1): no cache; every step runs the model over the whole prefix
  again, so step t costs O(t) FLOPs per layer for the projections and O(t^2) for attention.
* :class:`ContiguousDecoder` (chapter 2): a :class:`~paged_kv.storage.ContiguousKVCache`; one
  prefill over the prompts, then each step feeds only the newest token and reads the cached K/V.
* :class:`PagedDecoder` (chapter 5): the same through blocks handed out on demand.  The two halves
  of vLLM meet here (vLLM paper §4.3): the :class:`~paged_kv.blocks.BlockSpaceManager`
  (bookkeeping) gives every prompt its blocks and every decode token a slot, and
  :func:`~paged_kv.storage.prepare_paged_batch` / :func:`~paged_kv.storage.run_paged_batch` turn
  its answers into the slot mapping and block tables the :class:`~paged_kv.storage.PagedKVCache` reads.

All three must give the same greedy tokens (``tests/decoding/test_generate.py``).

Legend: B batch, T tokens, V vocab, NB blocks, BS block size.
"""

from __future__ import annotations

import torch

from ..blocks import BlockSpaceManager, blocks_needed
from ..defaults import BLOCK_SIZE
from ..errors import ConfigError, OutOfBlocksError
from ..model.attention import AttentionMetadata
from ..model.llama import TinyLlama
from ..storage import (ContiguousKVCache, PagedKVCache, last_token_logits, padded_block_tables,
                       prepare_paged_batch, right_pad, run_paged_batch)
from ..validate import count

__all__ = ["CACHE_MODES", "ContiguousDecoder", "PagedDecoder", "RecomputeDecoder", "make_decoder"]

CACHE_MODES = ("recompute", "contiguous", "paged")


class RecomputeDecoder:
    """Chapter 1: no cache; every step re-runs the model over prompt + generated tokens."""

    cache_bytes = 0

    def __init__(self, model: TinyLlama, backend: str) -> None:
        self.model, self.backend = model, backend
        self.seqs: list[list[int]] = []

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        self.seqs = [list(p) for p in prompts]
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
    """Chapter 2: one ``ContiguousKVCache`` row of ``max_len`` slots per sequence."""

    def __init__(self, model: TinyLlama, backend: str, batch_size: int, max_len: int) -> None:
        self.model, self.backend = model, backend
        self.cache = ContiguousKVCache(model.cfg, batch_size, max_len, dtype=model.dtype, device=model.device)
        self.cache_bytes = self.cache.nbytes
        self.seq_lens = torch.zeros(batch_size, dtype=torch.int32, device=model.device)

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        ids, lens = right_pad(prompts, self.model.device)
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

    Sequence ``b`` of the batch is sequence id ``b`` in :attr:`manager`.  A block is taken only
    when a sequence's last block is full, so at any time each sequence wastes fewer than
    ``block_size`` slots (the contiguous cache reserves ``max_len`` slots per sequence).

    Args:
        model: the :class:`~paged_kv.model.TinyLlama` (its dtype and device are the cache's).
        backend: ``"torch"`` or ``"triton"`` for the cache writes and the attention.
        prompts: the batch's prompt token ids (used to size the pool; :meth:`prefill` takes them).
        max_new_tokens: tokens each sequence will generate.
        block_size: tokens per block (BS), default :data:`paged_kv.defaults.BLOCK_SIZE` (16, vLLM's).
        num_blocks: blocks in the pool (NB); default: exactly what the batch can use,
            ``sum_b ceil((len(prompt_b) + max_new_tokens) / BS)``.

    Attributes:
        manager: the :class:`~paged_kv.blocks.BlockSpaceManager` (bookkeeping).
        cache: the :class:`~paged_kv.storage.PagedKVCache` (storage).
        cache_bytes: bytes the pool allocated (all layers, K and V).
        seq_lens: ``[B]`` int32, tokens cached per sequence after the last step.

    Raises:
        ConfigError: a non-positive block size or pool.
        OutOfBlocksError: the pool cannot hold the prompts (at prefill) or a new token (at decode).
    """

    def __init__(self, model: TinyLlama, backend: str, prompts: list[list[int]], max_new_tokens: int,
                 block_size: int = BLOCK_SIZE, num_blocks: int | None = None) -> None:
        block_size = count("block_size (tokens per block)", block_size, 1)
        max_new_tokens = count("max_new_tokens", max_new_tokens, 1)
        if num_blocks is None:
            num_blocks = sum(blocks_needed(len(p) + max_new_tokens, block_size) for p in prompts)
        self.model, self.backend = model, backend
        self.block_size = block_size
        self.manager = BlockSpaceManager(num_blocks, block_size)
        self.cache = PagedKVCache(model.cfg, num_blocks, block_size, dtype=model.dtype, device=model.device)
        self.cache_bytes = self.cache.nbytes
        self.seq_lens = torch.zeros(len(prompts), dtype=torch.int32, device=model.device)

    @property
    def seq_ids(self) -> list[int]:
        return list(range(self.seq_lens.shape[0]))

    def block_tables(self) -> torch.Tensor:
        """``[B, max_blocks]`` int32: each sequence's physical block ids, right-padded with 0
        (:func:`~paged_kv.storage.padded_block_tables`; padding is never read)."""
        return padded_block_tables(self.manager, self.seq_ids, device=self.model.device)

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Allocate each prompt's blocks, write its K/V, return ``[B, V]`` next-token logits."""
        needed = sum(blocks_needed(len(p), self.block_size) for p in prompts)
        if needed > self.manager.num_free_blocks:      # all or nothing, before any allocation
            raise OutOfBlocksError(needed, self.manager.num_free_blocks, f"{len(prompts)} prompts")
        for i, p in enumerate(prompts):
            self.manager.allocate(i, len(p))
        return self._run(prompts, "prefill")

    def decode(self, new_tokens: list[int]) -> torch.Tensor:
        """Give each sequence one slot (a new block only if its last is full), write the new
        tokens' K/V there, attend through the block tables; returns ``[B, V]`` logits."""
        needed = sum(self.manager.blocks_to_append(i) for i in self.seq_ids)
        if needed > self.manager.num_free_blocks:      # all or nothing, before any append
            raise OutOfBlocksError(needed, self.manager.num_free_blocks, "one decode token per sequence")
        for i in self.seq_ids:
            self.manager.append_slot(i)
        return self._run([[t] for t in new_tokens], "decode")

    def _run(self, new_tokens: list[list[int]], phase: str) -> torch.Tensor:
        batch = prepare_paged_batch(self.manager, self.seq_ids, new_tokens, phase, self.model.device)
        self.seq_lens = torch.tensor([self.manager.num_tokens(i) for i in self.seq_ids], dtype=torch.int32,
                                     device=self.model.device)
        return run_paged_batch(self.model, self.cache, batch, self.backend)

    def free(self) -> None:
        """Return every sequence's blocks to the pool."""
        for i in self.seq_ids:
            if i in self.manager:
                self.manager.free(i)


def make_decoder(model: TinyLlama, cache: str, backend: str, prompts: list[list[int]], max_new_tokens: int,
                 block_size: int = BLOCK_SIZE):
    """The decoder object for a cache mode (a small strategy object with prefill/decode).

    ``block_size`` (tokens per block) is used by ``cache="paged"`` only.
    """
    if cache == "recompute":
        return RecomputeDecoder(model, backend)
    if cache == "contiguous":
        return ContiguousDecoder(model, backend, len(prompts), max(map(len, prompts)) + max_new_tokens)
    if cache == "paged":
        return PagedDecoder(model, backend, prompts, max_new_tokens, block_size=block_size)
    raise ConfigError(f"cache must be one of {CACHE_MODES}, got {cache!r}")
