"""From the block manager's state to one forward pass: the one place where bookkeeping meets storage.

vLLM calls this step "preparing the inputs" (its model runner): the scheduler and the block
manager decided *which* tokens run and *where* their K/V live; this module turns that into the
tensors the model and the paged cache read, and runs the pass.  :class:`~paged_kv.decoding.PagedDecoder`,
the live block panel (:class:`~paged_kv.engine.LiveRequests`) and the serving engine all call it,
so the order of operations below is written once.

Order of operations for one step over a paged cache:

1. **room** (the caller): the :class:`~paged_kv.blocks.BlockSpaceManager` gives every new token
   a slot: ``allocate(seq, n)`` for a prompt, ``append_slot(seq)`` for a decode token (a new block
   only when the last is full; a copy of the last block when it is shared, copy-on-write);
2. **prepare** (:func:`prepare_paged_batch`): read the manager: each new token's position and
   slot (the slot mapping, ``-1`` for padding), every sequence's block table padded into one int32
   tensor, the sequence lengths, as one :class:`~paged_kv.model.AttentionMetadata`; and *take* the
   copy-on-write copies the manager queued in step 1;
3. **copy** (:func:`run_paged_batch`): apply those copies to the cache *before* anything is
   written, so a sequence's new token lands in its own copy and the copy carries the shared tokens;
4. **forward**: each layer writes the new K/V at their slots, then attends through the tables
   (vLLM paper §4.1-4.3);
5. **logits**: each sequence's last new token's logits, ``[B, V]``.

With prefix caching (chapter 8) nothing here changes: a prompt whose first blocks were found in
the cache is simply run from ``starts[b]`` = the cached tokens, as a prefill chunk whose context is
those blocks, so only its uncached suffix goes through the model (the paged prefill kernel, or its
torch reference), attending to the cached K/V through the block table.

Legend: B sequences, T new tokens per sequence (right-padded), V vocab, NB blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

import torch

from ..blocks import BlockSpaceManager
from ..errors import ConfigError, PromptError
from ..model.attention import AttentionMetadata

__all__ = ["PagedBatch", "last_token_logits", "padded_block_tables", "prepare_paged_batch", "right_pad",
           "run_paged_batch"]


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


def padded_block_tables(manager: BlockSpaceManager, seq_ids: Sequence[Hashable], pad: int = 0,
                        device=None) -> torch.Tensor:
    """Block tables of ``seq_ids`` as one ``[B, max_blocks]`` int32 tensor, rows right-padded with
    ``pad``.  vLLM pads with 0, a valid block id that no kernel reads: ``seq_lens`` stops it first."""
    tables = [manager.block_table(s).block_ids for s in seq_ids]
    width = max((len(t) for t in tables), default=0)
    out = torch.full((len(tables), width), pad, dtype=torch.int32)   # (B, max_blocks)
    for b, t in enumerate(tables):
        out[b, :len(t)] = torch.tensor(t, dtype=torch.int32)
    return out.to(device)


@dataclass
class PagedBatch:
    """One forward pass over a paged cache, ready to run.

    Attributes:
        seq_ids: the batch's sequences, row ``b`` = ``seq_ids[b]``.
        input_ids: ``[B, T]`` int64, each sequence's new tokens, right-padded with 0.
        metadata: phase, positions ``[B, T]``, seq_lens ``[B]`` int32, slot mapping ``[B, T]`` int64
            (``-1`` = padding), block tables ``[B, max_blocks]`` int32.
        num_new: ``[B]`` int32, new tokens per row (the last real one gives the row's logits).
        copies: copy-on-write ``(src, dst)`` block copies to apply before the pass writes.
    """

    seq_ids: list
    input_ids: torch.Tensor
    metadata: AttentionMetadata
    num_new: torch.Tensor
    copies: list[tuple[int, int]] = field(default_factory=list)


def prepare_paged_batch(manager: BlockSpaceManager, seq_ids: Sequence[Hashable],
                        new_tokens: Sequence[Sequence[int]], phase: str, device=None,
                        starts: Sequence[int] | None = None) -> PagedBatch:
    """Read ``manager`` into the tensors of one step: steps 2 of the module's order of operations.

    ``new_tokens[b]`` are the token ids of sequence ``seq_ids[b]`` that this pass runs, at positions
    ``starts[b] .. starts[b] + len(new_tokens[b]) - 1``, whose slots the manager has already given
    (``allocate`` / ``append_slot``).  By default they are the sequence's *last* tokens
    (``starts[b] = num_tokens - len``); the serving engine passes ``starts`` because it allocates a
    whole prompt at admission and then runs it chunk by chunk.  The copy-on-write copies the manager
    queued are taken (the queue is emptied) into :attr:`PagedBatch.copies`.

    Args:
        phase: ``"prefill"``: a prompt, or a chunk of it, per sequence: its new tokens attend to
            the tokens cached before them (the first ``starts[b]``) and causally to each other
            (chunked prefill starts a chunk anywhere, even inside a block); ``"decode"``: exactly
            one new token per sequence.
        starts: the position of each row's first new token (tokens).

    Raises:
        ConfigError: an unknown phase; a decode row without exactly one token.
        PromptError: an empty batch, or a row with no tokens or tokens past what its sequence holds.
        BlockError: (from the manager) an unknown sequence id.
    """
    if phase not in ("prefill", "decode"):
        raise ConfigError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    seq_ids = list(seq_ids)
    if not seq_ids or len(seq_ids) != len(new_tokens):
        raise PromptError(f"need one token list per sequence: {len(seq_ids)} sequences, "
                          f"{len(new_tokens)} token lists")
    lens = [manager.num_tokens(s) for s in seq_ids]               # tokens each sequence holds now
    counts = [len(t) for t in new_tokens]
    if starts is None:
        starts = [n - k for n, k in zip(lens, counts)]
    elif len(starts) != len(seq_ids):
        raise PromptError(f"need one start per sequence: {len(seq_ids)} sequences, {len(starts)} starts")
    starts = [int(x) for x in starts]
    for s, n, k, x in zip(seq_ids, lens, counts, starts):
        if k < 1 or x < 0 or x + k > n:
            raise PromptError(f"sequence {s!r} holds {n} tokens; cannot run {k} new ones from position {x}")
        if phase == "decode" and k != 1:
            raise ConfigError(f"a decode step runs one token per sequence; sequence {s!r} has {k}")
    ids, num_new = right_pad(new_tokens)                                  # (B, T), (B,)
    B, T = ids.shape
    positions = torch.zeros(B, T, dtype=torch.long)                       # (B, T)
    slots = torch.full((B, T), -1, dtype=torch.int64)                     # (B, T), -1 = padding
    for b, (s, k, x) in enumerate(zip(seq_ids, counts, starts)):
        positions[b, :k] = torch.arange(x, x + k)
        positions[b, k:] = x + k - 1           # padding: a valid position, never written or read
        slots[b, :k] = torch.tensor(manager.slot_mapping(s, x, x + k), dtype=torch.int64)
    ends = torch.tensor([x + k for x, k in zip(starts, counts)], dtype=torch.int32)
    seq_lens = num_new if phase == "prefill" else ends
    context = torch.tensor(starts, dtype=torch.int32) if phase == "prefill" else None
    meta = AttentionMetadata(phase, positions.to(device), seq_lens.to(device), slot_mapping=slots.to(device),
                             block_tables=padded_block_tables(manager, seq_ids, device=device),
                             context_lens=None if context is None else context.to(device))
    return PagedBatch(seq_ids, ids.to(device), meta, num_new.to(device), manager.take_copies())


@torch.no_grad()
def run_paged_batch(model, cache, batch: PagedBatch, backend: str = "torch") -> torch.Tensor:
    """Steps 3-5 of the module's order of operations: apply the batch's copy-on-write copies to
    ``cache`` (a :class:`~paged_kv.storage.PagedKVCache`), run ``model`` (a
    :class:`~paged_kv.model.TinyLlama`) on the new tokens, return each sequence's next-token
    logits ``[B, V]`` (fp32).

    Raises whatever the cache and model raise (``CacheError``, ``TensorError``, ``PromptError``).
    """
    cache.copy_blocks(batch.copies, backend)
    logits = model(batch.input_ids, batch.metadata, cache, backend)      # (B, T, V)
    return last_token_logits(logits, batch.num_new)
