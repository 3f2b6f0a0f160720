"""The storage layer: tensors that hold K and V, and the one place that turns the block manager's
state into a forward pass over them.

* :mod:`~paged_kv.storage.contiguous_cache`: :class:`ContiguousKVCache`, one row of ``max_seq_len``
  slots per sequence (chapter 2);
* :mod:`~paged_kv.storage.paged_cache`: :class:`PagedKVCache`, one pool of blocks per layer, read and
  written through block tables and slot mappings (chapter 5);
* :mod:`~paged_kv.storage.batch`: :func:`prepare_paged_batch` and :func:`run_paged_batch`, the order of
  operations of one step (slots, copy-on-write copies, tensors and metadata, forward);
* :mod:`~paged_kv.storage.formats`: the same block state as vLLM, FlashInfer and FlashAttention take it.

Storage never decides which sequence owns which block: :mod:`paged_kv.blocks` does (vLLM paper §4.3).
"""

from .batch import (BatchRow, PagedBatch, last_token_logits, padded_block_tables, prepare_paged_batch, read_rows,
                    right_pad, run_from_manager, run_paged_batch)
from .contiguous_cache import ContiguousKVCache
from .formats import (FlashAttnLayout, FlashInferLayout, VLLMLayout, all_layouts, flash_attn_layout,
                      flashinfer_layout, token_locations, vllm_layout)
from .paged_cache import KV_DTYPE_NAMES, PagedKVCache

__all__ = ["ContiguousKVCache", "FlashAttnLayout", "FlashInferLayout", "KV_DTYPE_NAMES", "PagedBatch",
           "PagedKVCache", "VLLMLayout", "all_layouts", "flash_attn_layout", "flashinfer_layout",
           "BatchRow", "last_token_logits", "padded_block_tables", "prepare_paged_batch", "read_rows", "right_pad",
           "run_from_manager", "run_paged_batch",
           "token_locations", "vllm_layout"]
