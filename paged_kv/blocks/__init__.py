"""The block layer (chapter 5): which physical block holds which tokens of which sequence.

Bookkeeping only, pure Python (vLLM paper §4.2-4.4): the caches and kernels of
:mod:`paged_kv.storage` consume the block tables and slot mappings made here, so widgets, the
exercises and later the scheduler can drive the bookkeeping alone, fast.

* :mod:`~paged_kv.blocks.allocator`: :class:`BlockAllocator`, the free list with reference counts;
* :mod:`~paged_kv.blocks.block_table`: :class:`BlockTable` (logical -> physical), :func:`blocks_needed`;
* :mod:`~paged_kv.blocks.manager`: :class:`BlockSpaceManager` (allocate, append, fork with
  copy-on-write, free);
* :mod:`~paged_kv.blocks.history`: :class:`BlockHistory`, plain-data snapshots for figures,
  :func:`paper_trace` (the paper's Figures 6-7), :func:`paper_sampling_trace` (Figure 8),
  :func:`paper_beam_trace` (Figure 9).
"""

from .allocator import BlockAllocator
from .block_table import BlockTable, blocks_needed, check_seq_id
from .history import (PAPER_FREE_ORDER, BlockHistory, BlockState, Event, Snapshot, paper_beam_trace,
                      paper_sampling_trace, paper_trace, rename_sequences, snapshot)
from .manager import BlockSpaceManager

__all__ = ["BlockAllocator", "BlockHistory", "BlockSpaceManager", "BlockState", "BlockTable", "Event",
           "PAPER_FREE_ORDER", "Snapshot", "blocks_needed", "check_seq_id", "paper_beam_trace",
           "paper_sampling_trace", "paper_trace", "rename_sequences", "snapshot"]
