"""The block layer (chapter 5): which physical block holds which tokens of which sequence.

Bookkeeping only, pure Python (vLLM paper §4.2-4.4): the caches and kernels of
:mod:`paged_kv.storage` consume the block tables and slot mappings made here, so widgets, the
exercises and later the scheduler can drive the bookkeeping alone, fast.

* :mod:`~paged_kv.blocks.allocator`: :class:`BlockAllocator`, the free list with reference counts;
* :mod:`~paged_kv.blocks.free_block_queue`: :class:`FreeBlockQueue`, the free list as a doubly
  linked list (O(1) removal from the middle, for prefix-cache hits);
* :mod:`~paged_kv.blocks.prefix_cache`: :class:`PrefixCache`, chained block hashes
  (:func:`block_hashes`, :func:`sha256_block_hash`) and the token check (chapter 8);
* :mod:`~paged_kv.blocks.block_table`: :class:`BlockTable` (logical -> physical), :func:`blocks_needed`,
  :func:`stored_tokens` and :func:`group_blocks_needed` (the peak of ``n`` samples sharing a prompt);
* :mod:`~paged_kv.blocks.manager`: :class:`BlockSpaceManager` (allocate, append, fork with
  copy-on-write, truncate for speculative decoding's rollback (chapter 9), free);
* :mod:`~paged_kv.blocks.history`: :class:`BlockHistory`, plain-data snapshots for figures,
  :func:`paper_trace` (the paper's Figures 6-7), :func:`paper_sampling_trace` (Figure 8),
  :func:`paper_beam_trace` (Figure 9);
* :mod:`~paged_kv.blocks.rows`: :class:`~paged_kv.blocks.rows.BatchRow` and
  :func:`~paged_kv.blocks.rows.read_rows`, a forward pass's rows read from a manager (the tensors
  are :mod:`paged_kv.storage.batch`'s).
"""

from .allocator import BlockAllocator
from .block_table import (BlockTable, blocks_needed, check_seq_id, group_blocks_held, group_blocks_needed,
                          stored_tokens)
from .free_block_queue import FreeBlockQueue
from .history import (PAPER_FREE_ORDER, BlockHistory, BlockState, Event, Snapshot, paper_beam_trace,
                      paper_sampling_trace, paper_trace, rename_sequences, snapshot)
from .manager import BlockSpaceManager
from .prefix_cache import CacheEntry, PrefixCache, block_hashes, sha256_block_hash

__all__ = ["BlockAllocator", "BlockHistory", "BlockSpaceManager", "BlockState", "BlockTable", "CacheEntry", "Event",
           "FreeBlockQueue", "PAPER_FREE_ORDER", "PrefixCache", "Snapshot", "block_hashes", "blocks_needed",
           "check_seq_id", "group_blocks_held", "group_blocks_needed", "paper_beam_trace", "sha256_block_hash", "stored_tokens",
           "paper_sampling_trace", "paper_trace", "rename_sequences", "snapshot"]
