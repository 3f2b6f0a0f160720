"""``PagedDecoder``: the tiny model decodes a batch through a paged KV cache (chapter 5).

The two halves of vLLM meet here (vLLM paper §4.3): the :class:`~paged_kv.blocks.BlockSpaceManager`
(bookkeeping, no tensors) gives every prompt its blocks and every decode token a slot, and this
decoder turns its answers into tensors -- the **slot mapping** ``[B, T]`` int64 (where each new
token's K/V is written; ``-1`` for padding) and the **block tables** ``[B, max_blocks]`` int32
(where each sequence's tokens are read) -- for the :class:`~paged_kv.paged_cache.PagedKVCache`.

``generate(model, prompts, n, cache="paged")`` builds one through
:func:`paged_kv.generate.make_decoder`; it must give the same tokens as the contiguous cache
and as recomputing (``tests/test_paged_decoding.py``).

Legend: B batch, T tokens, NB blocks, BS block size.
"""

from __future__ import annotations

import torch

from .attention import AttentionMetadata
from .block_allocator import as_count
from .blocks import BlockSpaceManager, blocks_needed
from .errors import OutOfBlocksError
from .generate import _last_logits, _right_pad
from .model import TinyLlama
from .paged_cache import PagedKVCache


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
        block_size: tokens per block (BS), default 16 (vLLM's default on GPUs).
        num_blocks: blocks in the pool (NB); default: exactly what the batch can use,
            ``sum_b ceil((len(prompt_b) + max_new_tokens) / BS)``.

    Attributes:
        manager: the :class:`~paged_kv.blocks.BlockSpaceManager` (bookkeeping).
        cache: the :class:`~paged_kv.paged_cache.PagedKVCache` (storage).
        cache_bytes: bytes the pool allocated (all layers, K and V).
        seq_lens: ``[B]`` int32, tokens cached per sequence after the last step.

    Raises:
        ConfigError: a non-positive block size or pool.
        OutOfBlocksError: the pool cannot hold the prompts (at prefill) or a new token (at decode).
    """

    def __init__(self, model: TinyLlama, backend: str, prompts: list[list[int]], max_new_tokens: int,
                 block_size: int = 16, num_blocks: int | None = None) -> None:
        block_size = as_count("block_size (tokens per block)", block_size, minimum=1)
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
        """``[B, max_blocks]`` int32: each sequence's physical block ids, right-padded with 0.

        Padding entries are never read (the kernels stop at ``seq_lens[b]``).
        """
        tables = [list(self.manager.block_table(i)) for i in self.seq_ids]
        width = max(map(len, tables))
        rows = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(rows, dtype=torch.int32, device=self.model.device)

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Allocate each prompt's blocks, write its K/V, return ``[B, V]`` next-token logits."""
        needed = sum(blocks_needed(len(p), self.block_size) for p in prompts)
        if needed > self.manager.num_free_blocks:      # all or nothing, before any allocation
            raise OutOfBlocksError(needed, self.manager.num_free_blocks, f"{len(prompts)} prompts")
        for i, p in enumerate(prompts):
            self.manager.allocate(i, len(p))
        ids, lens = _right_pad(prompts, self.model.device)                   # (B, T), (B,)
        slots = torch.full(ids.shape, -1, dtype=torch.int64)                 # (B, T), -1 = padding
        for i, p in enumerate(prompts):
            slots[i, :len(p)] = torch.tensor(self.manager.slot_mapping(i, 0, len(p)))
        meta = AttentionMetadata.for_prefill(lens, ids.shape[1], slot_mapping=slots.to(self.model.device),
                                             block_tables=self.block_tables())
        self.seq_lens = lens.clone()
        return _last_logits(self.model(ids, meta, self.cache, self.backend), lens)

    def decode(self, new_tokens: list[int]) -> torch.Tensor:
        """Give each sequence one slot (a new block only if its last is full), write the new
        tokens' K/V there, attend through the block tables; returns ``[B, V]`` logits."""
        needed = sum(self.manager.blocks_to_append(i) for i in self.seq_ids)
        if needed > self.manager.num_free_blocks:      # all or nothing, before any append
            raise OutOfBlocksError(needed, self.manager.num_free_blocks, "one decode token per sequence")
        slots = [self.manager.append_slot(i) for i in self.seq_ids]
        self.cache.copy_blocks(self.manager.take_copies())   # copy-on-write (none without forks)
        self.seq_lens = self.seq_lens + 1
        ids = torch.tensor(new_tokens, dtype=torch.long, device=self.model.device)[:, None]  # (B, 1)
        meta = AttentionMetadata.for_decode(
            self.seq_lens, slot_mapping=torch.tensor(slots, dtype=torch.int64, device=self.model.device)[:, None],
            block_tables=self.block_tables())
        return self.model(ids, meta, self.cache, self.backend)[:, 0]

    def free(self) -> None:
        """Return every sequence's blocks to the pool."""
        for i in self.seq_ids:
            if i in self.manager:
                self.manager.free(i)
