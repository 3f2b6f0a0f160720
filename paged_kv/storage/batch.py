"""From a step's block state to one forward pass: the one place where bookkeeping meets storage.

vLLM's model runner calls this "preparing the inputs".  The bookkeeping decides *which* tokens run
and *where* their K/V go, as rows (token ids, first position, slot mapping, block table: a
:class:`BatchRow`, or a scheduler chunk, which has the same fields); this module turns the rows
into the tensors the model and the paged cache read, and runs the pass.  The engine's runner takes
its rows from the scheduler's output; drivers that own a block manager (the paged decoder, beam
search, the live block panel) read them with :func:`read_rows` (pure bookkeeping, with
:class:`BatchRow` at home in :mod:`paged_kv.blocks.rows`), and :func:`run_from_manager` is their
whole step.  Either way, a step is, in order:

1. **room** (the bookkeeping): every new token has a slot; a shared, partly filled last block is
   copied first (copy-on-write, vLLM paper §4.4);
2. **copy**: those copies are applied to the cache *before* anything is written, so a new token
   lands in its sequence's own copy and the copy carries the shared tokens;
3. **prepare** (:func:`prepare_paged_batch`): positions, slot mapping, padded block tables and
   lengths as one :class:`~paged_kv.model.AttentionMetadata` (the shapes: :class:`PagedBatch`);
4. **forward** (:func:`run_paged_batch`): each layer writes the new K/V at their slots, then attends
   through the tables (vLLM paper §4.1-4.3).

A row may start past position 0 (a later chunk of a prompt, or the uncached suffix after a
prefix-cache hit): its tokens attend to the ``start`` cached tokens before them through the block
table and causally to each other.

Legend: B rows (sequences), T new tokens per row (right-padded), V vocab, NB blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import torch

from ..blocks import BlockSpaceManager
from ..blocks.rows import BatchRow, read_rows
from ..errors import ConfigError, PromptError
from ..model.attention import AttentionMetadata

__all__ = ["BatchRow", "PagedBatch", "last_token_logits", "padded_block_tables", "prepare_paged_batch",
           "read_rows", "right_pad", "run_from_manager", "run_paged_batch"]


def right_pad(seqs: Sequence[Sequence[int]], device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of B sequences as one ``[B, T_max]`` int64 tensor, right-padded with 0, and their
    ``[B]`` int32 lengths.  Padding is never attended to (the metadata's lengths stop there)."""
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    ids = torch.zeros(len(seqs), int(lens.max()), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(list(s), dtype=torch.long)
    return ids.to(device), lens.to(device)


def last_token_logits(logits: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """``logits [B, T, V]`` of right-padded rows -> ``[B, V]``, row ``b`` at position ``lens[b] - 1``
    (the logits that choose each sequence's next token)."""
    return logits[torch.arange(logits.shape[0], device=logits.device), lens.long() - 1]


def padded_block_tables(tables: Sequence[Sequence[int]], pad: int = 0, device=None) -> torch.Tensor:
    """Block tables as one ``[B, max_blocks]`` int32 tensor, rows right-padded with ``pad``.  vLLM
    pads with 0, a valid block id that no kernel reads: ``seq_lens`` stops it first."""
    width = max((len(t) for t in tables), default=0)
    out = torch.full((len(tables), width), pad, dtype=torch.int32)   # (B, max_blocks)
    for b, t in enumerate(tables):
        out[b, :len(t)] = torch.tensor(list(t), dtype=torch.int32)
    return out.to(device)


@dataclass
class PagedBatch:
    """One forward pass over a paged cache, ready to run.

    Attributes:
        input_ids: ``[B, T]`` int64, each row's new tokens, right-padded with 0.
        metadata: phase, positions ``[B, T]``, ``query_lens [B]`` and ``seq_lens [B]`` int32, slot
            mapping ``[B, T]`` int64 (``-1`` = padding), block tables ``[B, max_blocks]`` int32.
    """

    input_ids: torch.Tensor
    metadata: AttentionMetadata

    @property
    def num_new(self) -> torch.Tensor:
        """``[B]`` int32, new tokens per row (the last real one gives the row's logits)."""
        return self.metadata.query_lens


def prepare_paged_batch(rows: Sequence[BatchRow], phase: str, device=None) -> PagedBatch:
    """The tensors of one pass from its rows (:class:`BatchRow` or scheduler chunks): step 3 of the
    module's order.

    Args:
        phase: ``"prefill"``: each row's tokens attend to the ``start`` tokens cached before them
            and causally to each other (chunked prefill starts a row anywhere, even inside a
            block); ``"decode"``: exactly one new token per row.

    Raises:
        ConfigError: an unknown phase, or a decode row of more than one token.
        PromptError: no rows, an empty row, or a row whose tokens and slots differ in number.
    """
    if phase not in ("prefill", "decode"):
        raise ConfigError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    if not rows:
        raise PromptError("a forward pass needs at least one row")
    for r in rows:
        if len(r.token_ids) < 1 or len(r.slot_mapping) != len(r.token_ids):
            raise PromptError(f"a row runs {len(r.token_ids)} tokens into {len(r.slot_mapping)} slots")
        if phase == "decode" and len(r.token_ids) != 1:
            raise ConfigError(f"a decode step runs one token per sequence; a row has {len(r.token_ids)}")
    ids, query_lens = right_pad([r.token_ids for r in rows])               # (B, T), (B,)
    B, T = ids.shape
    positions = torch.zeros(B, T, dtype=torch.long)                        # (B, T)
    slots = torch.full((B, T), -1, dtype=torch.int64)                      # (B, T), -1 = padding
    for b, r in enumerate(rows):
        k = len(r.token_ids)
        positions[b, :k] = torch.arange(r.start, r.start + k)
        positions[b, k:] = r.start + k - 1     # padding: a valid position, never written or read
        slots[b, :k] = torch.tensor(list(r.slot_mapping), dtype=torch.int64)
    seq_lens = torch.tensor([r.start + len(r.token_ids) for r in rows], dtype=torch.int32)
    meta = AttentionMetadata(phase, positions.to(device), seq_lens.to(device), query_lens=query_lens.to(device),
                             slot_mapping=slots.to(device),
                             block_tables=padded_block_tables([r.block_table for r in rows], device=device))
    return PagedBatch(ids.to(device), meta)


@torch.no_grad()
def run_paged_batch(model, cache, batch: PagedBatch, backend: str = "torch", reduction=None,
                    all_positions: bool = False) -> torch.Tensor:
    """Step 4 of the module's order: run ``model`` (a :class:`~paged_kv.model.TinyLlama`) on the
    batch over ``cache`` (a :class:`~paged_kv.storage.PagedKVCache`); returns each row's
    next-token logits ``[B, V]`` (fp32), or with ``all_positions`` the logits after every new token
    ``[B, T, V]`` (right-padded rows: row ``b`` is valid up to its own length; speculative
    decoding's verify pass reads one distribution per draft).  The step's copy-on-write copies
    must be applied first.
    ``reduction``: the order of the pass's sums (:class:`~paged_kv.model.reduction.ReductionOrder`).

    Raises whatever the cache and model raise (``CacheError``, ``TensorError``, ``PromptError``,
    ``ConfigError``).
    """
    logits = model(batch.input_ids, batch.metadata, cache, backend, reduction)      # (B, T, V)
    return logits if all_positions else last_token_logits(logits, batch.metadata.query_lens)


def run_from_manager(model, cache, manager: BlockSpaceManager, seq_ids: Sequence[Hashable],
                     new_tokens: Sequence[Sequence[int]], phase: str, backend: str = "torch",
                     starts: Sequence[int] | None = None) -> torch.Tensor:
    """The whole step for a driver that owns a block manager (steps 2-4): apply the copies the
    manager queued, read the rows (:func:`read_rows`), prepare, run.  Returns logits ``[B, V]``."""
    cache.copy_blocks(manager.take_copies(), backend)
    rows = read_rows(manager, seq_ids, new_tokens, starts)
    return run_paged_batch(model, cache, prepare_paged_batch(rows, phase, model.device), backend)
