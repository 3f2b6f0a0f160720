"""Format bridges: one block manager's state written the way three real engines take it.

All three store K/V per layer as ``[NB, BS, Hkv, D]`` (block-major, token-major within a block),
the layout of :class:`~paged_kv.storage.PagedKVCache`; they differ only in how they say
*which* blocks a sequence owns and how full they are:

* **vLLM** (paper §4.3; ``vllm/attention/backends``, v1 ``vllm/v1/worker/block_table.py``):
  a padded ``block_tables [B, max_blocks]`` int32 plus ``seq_lens [B]`` for reading, and a flat
  ``slot_mapping [T]`` int64 (``block_id * BS + offset``) saying where each *new* token is written.
* **FlashInfer** (``flashinfer.page``, "CSR" page table): ``kv_indptr [B + 1]`` int32 prefix sums
  of pages per sequence, ``kv_indices [sum pages]`` int32 page ids laid end to end, and
  ``kv_last_page_len [B]`` int32, the tokens in each sequence's last page (1 .. BS, never 0).
* **FlashAttention** (``flash_attn_with_kvcache(..., block_table=, cache_seqlens=)``):
  ``block_table [B, max_blocks]`` int32 and ``cache_seqlens [B]`` int32, like vLLM's read side.
  Upstream flash-attn 2 requires a block size divisible by 256; vLLM ships a fork that accepts 16.

Each layout has ``token_locations()``, which decodes the tensors alone (no manager) into, per
sequence, the ``(physical block, offset)`` of every token, so a test can show that all three
describe the same tokens as the manager itself (:func:`token_locations`).

Legend: B sequences, BS block size, NB blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..blocks import BlockSpaceManager
from .batch import padded_block_tables

__all__ = ["FlashAttnLayout", "FlashInferLayout", "VLLMLayout", "all_layouts", "flash_attn_layout",
           "flashinfer_layout", "token_locations", "vllm_layout"]

Locations = list[list[tuple[int, int]]]   # per sequence, per token: (physical block, offset)


def _seq_ids(manager: BlockSpaceManager, seq_ids: Sequence | None) -> list:
    return manager.seq_ids if seq_ids is None else list(seq_ids)


def token_locations(manager: BlockSpaceManager, seq_ids: Sequence | None = None) -> Locations:
    """The ground truth from the manager: ``(physical block, offset)`` of each token of each sequence."""
    out = []
    for s in _seq_ids(manager, seq_ids):
        table = manager.block_table(s)
        out.append([(table[p // table.block_size], p % table.block_size) for p in range(table.num_tokens)])
    return out


@dataclass
class VLLMLayout:
    """vLLM's metadata. ``block_tables [B, max_blocks]`` int32 (rows right-padded with ``pad``, never
    read past ``ceil(seq_lens / BS)``), ``seq_lens [B]`` int32 (tokens incl. the new ones), and
    ``slot_mapping [sum(query_lens)]`` int64: the slots of each sequence's last ``query_lens[b]``
    tokens (the ones this step writes), sequences laid end to end."""

    block_size: int
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_lens: torch.Tensor
    slot_mapping: torch.Tensor

    def token_locations(self) -> Locations:
        """Decode ``block_tables`` + ``seq_lens`` into ``(block, offset)`` per token."""
        return [[(int(self.block_tables[b, p // self.block_size]), p % self.block_size) for p in range(int(n))]
                for b, n in enumerate(self.seq_lens.tolist())]

    def written_locations(self) -> Locations:
        """Decode ``slot_mapping`` alone: ``(slot // BS, slot % BS)`` of each sequence's new tokens."""
        ends = torch.cumsum(self.query_lens, 0).tolist()
        starts = [0] + ends[:-1]
        return [[divmod(int(s), self.block_size) for s in self.slot_mapping[a:e].tolist()] for a, e in zip(starts, ends)]


def vllm_layout(manager: BlockSpaceManager, seq_ids: Sequence | None = None,
                new_tokens: int | Sequence[int] | None = None, pad: int = 0) -> VLLMLayout:
    """The state as vLLM passes it to attention.

    Args:
        new_tokens: how many of each sequence's last tokens this step writes (``slot_mapping``):
            ``None`` = all of them (a prefill of everything), ``1`` = a decode step, or one count
            per sequence.
        pad: value in unused ``block_tables`` entries (vLLM pads with 0, a valid id the kernels
            never read because ``seq_lens`` stops them first).
    """
    seq_ids = _seq_ids(manager, seq_ids)
    lens = [manager.num_tokens(s) for s in seq_ids]
    if new_tokens is None:
        q = lens
    elif isinstance(new_tokens, int):
        q = [min(new_tokens, n) for n in lens]
    else:
        q = [int(x) for x in new_tokens]
    slots = [slot for s, n, k in zip(seq_ids, lens, q) for slot in manager.slot_mapping(s, n - k, n)]
    return VLLMLayout(manager.block_size, padded_block_tables([manager.block_ids(s) for s in seq_ids], pad),
                      torch.tensor(lens, dtype=torch.int32), torch.tensor(q, dtype=torch.int32),
                      torch.tensor(slots, dtype=torch.int64))


@dataclass
class FlashInferLayout:
    """FlashInfer's CSR page table: sequence ``b`` owns pages ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``
    and holds ``(pages - 1) * BS + kv_last_page_len[b]`` tokens.  All int32."""

    page_size: int
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor

    def token_locations(self) -> Locations:
        out = []
        for b, last in enumerate(self.kv_last_page_len.tolist()):
            pages = self.kv_indices[int(self.kv_indptr[b]):int(self.kv_indptr[b + 1])].tolist()
            n = (len(pages) - 1) * self.page_size + int(last)
            out.append([(pages[p // self.page_size], p % self.page_size) for p in range(n)])
        return out


def flashinfer_layout(manager: BlockSpaceManager, seq_ids: Sequence | None = None) -> FlashInferLayout:
    """The state as FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper.plan`` takes it."""
    tables = [manager.block_table(s) for s in _seq_ids(manager, seq_ids)]
    indptr = [0]
    for t in tables:
        indptr.append(indptr[-1] + len(t))
    return FlashInferLayout(manager.block_size, torch.tensor(indptr, dtype=torch.int32),
                            torch.tensor([b for t in tables for b in t.block_ids], dtype=torch.int32),
                            torch.tensor([t.filled(len(t) - 1) for t in tables], dtype=torch.int32))


@dataclass
class FlashAttnLayout:
    """FlashAttention's ``block_table [B, max_blocks]`` int32 and ``cache_seqlens [B]`` int32."""

    block_size: int
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor

    def token_locations(self) -> Locations:
        return [[(int(self.block_table[b, p // self.block_size]), p % self.block_size) for p in range(int(n))]
                for b, n in enumerate(self.cache_seqlens.tolist())]


def flash_attn_layout(manager: BlockSpaceManager, seq_ids: Sequence | None = None, pad: int = 0) -> FlashAttnLayout:
    """The state as ``flash_attn_with_kvcache`` takes it (``cache_seqlens`` = tokens already cached)."""
    seq_ids = _seq_ids(manager, seq_ids)
    return FlashAttnLayout(manager.block_size, padded_block_tables([manager.block_ids(s) for s in seq_ids], pad),
                           torch.tensor([manager.num_tokens(s) for s in seq_ids], dtype=torch.int32))


def all_layouts(manager: BlockSpaceManager, seq_ids: Sequence | None = None) -> dict[str, object]:
    """The three layouts of one state, keyed ``"vLLM"``, ``"FlashInfer"``, ``"FlashAttention"``."""
    return {"vLLM": vllm_layout(manager, seq_ids), "FlashInfer": flashinfer_layout(manager, seq_ids),
            "FlashAttention": flash_attn_layout(manager, seq_ids)}
