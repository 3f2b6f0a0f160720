"""The block space manager: gives each sequence a block table over one shared pool of blocks.

Bookkeeping only (pure Python, no tensors), following the vLLM paper §4.2-4.3: a new physical
block is taken only when a sequence's last one is full (on-demand allocation), so a sequence
wastes at most ``block_size - 1`` slots.  The paged cache and kernels read the tables and slot
mappings made here (``slot = physical_id * block_size + offset``, vLLM's ``slot_mapping``).

Fork and copy-on-write (§4.4, used for parallel sampling and beam search):
:meth:`BlockSpaceManager.fork` lets a child share all its parent's blocks (ref counts go up, no
copy); the first append into a *shared, partly filled* last block copies that block to a fresh
one, and the ``(src, dst)`` copy is queued for the cache (:meth:`BlockSpaceManager.take_copies`).

Legend: BS block size (tokens per block), NB blocks in the pool.
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Iterable

from ..errors import BlockError, OutOfBlocksError
from ..validate import count
from .allocator import BlockAllocator
from .block_table import BlockTable, blocks_needed, check_seq_id

__all__ = ["BlockSpaceManager"]


class BlockSpaceManager:
    """Gives each sequence a :class:`BlockTable` over one shared pool of physical blocks.

    "Can I?" is apart from "do it" (as in vLLM and nano-vllm), so a scheduler reads as policy:
    ``can_allocate``/``allocate`` for a prompt, ``can_append``/``append_slot`` for a decode token.
    Every change either completes or raises *before* touching any state.

    Args:
        num_blocks: physical blocks in the pool (NB).
        block_size: token slots per block (BS).
        free_order: initial free-list order (see :class:`BlockAllocator`); replays a trace.

    Raises:
        ConfigError: bad ``num_blocks``/``block_size``/``free_order``.
        OutOfBlocksError: ``(needed, free)`` in blocks, when the pool cannot serve a request.
        BlockError: unknown or duplicate sequence id, a prompt of < 1 token, a double free.
    """

    def __init__(self, num_blocks: int, block_size: int, free_order: Iterable[int] | None = None) -> None:
        block_size = count("block_size (tokens per block)", block_size, minimum=1)
        self.allocator = BlockAllocator(num_blocks, free_order)
        self.num_blocks, self.block_size = self.allocator.num_blocks, block_size
        self._tables: dict[Hashable, BlockTable] = {}
        self._copies: list[tuple[int, int]] = []   # copy-on-write (src, dst) not yet applied

    # --- queries ------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    @property
    def seq_ids(self) -> list:
        """Sequences holding blocks, in the order they were allocated (or forked)."""
        return list(self._tables)

    def __contains__(self, seq_id) -> bool:
        try:
            return check_seq_id(seq_id) in self._tables
        except BlockError:          # not a valid id (e.g. a list): certainly not held
            return False

    def block_table(self, seq_id) -> BlockTable:
        """A copy of ``seq_id``'s block table (mutating it does not change the manager)."""
        return self._table(seq_id).copy()

    def num_tokens(self, seq_id) -> int:
        return self._table(seq_id).num_tokens

    def slot_mapping(self, seq_id, start: int = 0, end: int | None = None) -> list[int]:
        """Physical slots of tokens ``start .. end - 1`` of ``seq_id`` (default: all of them).

        ``slot = block_ids[p // block_size] * block_size + p % block_size`` for position ``p``:
        the flat index of the token's row in a cache viewed as ``[NB * BS, Hkv, D]``.
        """
        table = self._table(seq_id)
        end = table.num_tokens if end is None else end
        if not 0 <= start <= end <= table.num_tokens:
            raise BlockError(f"slot range [{start}, {end}) outside sequence {seq_id!r}'s {table.num_tokens} tokens")
        return [table.slot(p) for p in range(start, end)]

    def wasted_slots(self, seq_id) -> int:
        """Reserved but empty slots of ``seq_id`` (internal fragmentation): at most ``BS - 1``."""
        table = self._table(seq_id)
        return len(table) * self.block_size - table.num_tokens

    # --- prompts ------------------------------------------------------------------------------
    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a prompt of ``num_tokens`` tokens fits in the free blocks now."""
        return blocks_needed(self._check_tokens(num_tokens), self.block_size) <= self.num_free_blocks

    def allocate(self, seq_id, num_tokens: int) -> BlockTable:
        """Give a new sequence the ``ceil(num_tokens / BS)`` blocks its prompt fills; returns its table.

        Raises:
            BlockError: ``seq_id`` is not a str/int or already holds blocks, or ``num_tokens < 1``.
            OutOfBlocksError: fewer free blocks than needed (nothing is allocated).
        """
        seq_id = check_seq_id(seq_id)
        if seq_id in self._tables:
            raise BlockError(f"sequence {seq_id!r} already holds blocks; free it first")
        num_tokens = self._check_tokens(num_tokens)
        needed = blocks_needed(num_tokens, self.block_size)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(needed, self.num_free_blocks, f"a {num_tokens}-token prompt")
        table = BlockTable(self.block_size, [self.allocator.allocate() for _ in range(needed)], num_tokens)
        self._tables[seq_id] = table
        return table.copy()

    # --- decode tokens ------------------------------------------------------------------------
    def blocks_to_append(self, seq_id) -> int:
        """Free blocks the next ``append_slot(seq_id)`` takes: 1 if the last block is full (a new
        block) or shared and partly filled (its copy), else 0."""
        table = self._table(seq_id)
        if table.num_tokens == len(table) * self.block_size:
            return 1
        return 1 if self.allocator.ref_count(table.block_ids[-1]) > 1 else 0

    def blocks_to_append_all(self, seq_ids) -> int:
        """Free blocks that one more token for *each* of ``seq_ids`` takes (appended one after the
        other, as a decode step does): a new block for every full last block; and for a shared,
        partly filled last block held by ``rc`` tables, ``h`` of them appending, ``min(h, rc - 1)``
        copies: every appender copies while the block is still shared, and the last holder then
        writes in place (vLLM paper §4.4).  Summing :meth:`blocks_to_append` instead would count a
        copy for every holder and refuse steps that fit.

        Raises:
            BlockError: an unknown sequence, or one named twice.
        """
        seq_ids = [check_seq_id(s) for s in seq_ids]
        if len(set(seq_ids)) != len(seq_ids):
            raise BlockError(f"a sequence is named twice: {seq_ids}")
        needed, sharers = 0, Counter()
        for s in seq_ids:
            table = self._table(s)
            if table.num_tokens == len(table) * self.block_size:
                needed += 1
            elif self.allocator.ref_count(table.block_ids[-1]) > 1:
                sharers[table.block_ids[-1]] += 1
        return needed + sum(min(h, self.allocator.ref_count(b) - 1) for b, h in sharers.items())

    def can_append(self, seq_id) -> bool:
        """Whether one more token of ``seq_id`` fits now."""
        return self.blocks_to_append(seq_id) <= self.num_free_blocks

    def append_slot(self, seq_id) -> int:
        """Make room for one decode token of ``seq_id``; returns the slot it goes to.

        A new block is taken only when the last one is full, never in advance.  If the
        last block is shared (after a fork) and not full, it is copied first
        (copy-on-write): the sequence gets a fresh block, and ``(src, dst)`` is queued
        for :meth:`take_copies`.

        Raises:
            OutOfBlocksError: a block is needed and none is free (nothing changes).
        """
        table = self._table(seq_id)
        needed = self.blocks_to_append(seq_id)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(needed, self.num_free_blocks,
                                   f"a decode token of sequence {seq_id!r}")
        if table.num_tokens == len(table) * self.block_size:   # last block full: new one
            table.block_ids.append(self.allocator.allocate())
        elif needed:                                   # shared and partly filled: copy it
            src = table.block_ids[-1]
            dst = self.allocator.allocate()
            self.allocator.free(src)                   # one holder fewer, never 0 here
            table.block_ids[-1] = dst
            self._copies.append((src, dst))
        table.num_tokens += 1
        return table.slot(table.num_tokens - 1)

    @property
    def pending_copies(self) -> tuple[tuple[int, int], ...]:
        """Copy-on-write copies ``(src, dst)`` queued and not yet taken (a read-only view, for
        observers such as :class:`~paged_kv.blocks.BlockHistory`; :meth:`take_copies` empties it)."""
        return tuple(self._copies)

    def take_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write block copies ``(src, dst)`` queued since the last call (the cache must copy
        ``src``'s K/V into ``dst`` before it writes this step's tokens); clears the queue."""
        copies, self._copies = self._copies, []
        return copies

    # --- sharing and freeing ------------------------------------------------------------------
    def fork(self, parent_id, child_id) -> BlockTable:
        """Start ``child_id`` as a copy of ``parent_id`` that *shares* all its blocks (ref counts +1).

        No block is allocated, so a fork never runs out of memory; copies happen later, on write.

        Raises:
            BlockError: unknown parent, or ``child_id`` already holds blocks.
        """
        parent = self._table(parent_id)
        child_id = check_seq_id(child_id)
        if child_id in self._tables:
            raise BlockError(f"sequence {child_id!r} already holds blocks; cannot fork into it")
        for block_id in parent.block_ids:
            self.allocator.share(block_id)
        self._tables[child_id] = parent.copy()
        return parent.copy()

    def free(self, seq_id) -> list[int]:
        """Release all of ``seq_id``'s blocks; returns the ids that went back to the free list.

        Blocks are released last logical block first (as vLLM does), so with a FIFO free list
        a sequence's tail blocks are reused before its head blocks.  Shared blocks only lose a
        holder.  A copy-on-write copy still queued for one of the freed blocks is dropped: the block
        may be handed to another sequence before the cache applies the queue, and a stale copy
        must never land in it.  Raises ``BlockError`` for an unknown (e.g. already freed) sequence.
        """
        table = self._table(seq_id)
        del self._tables[check_seq_id(seq_id)]
        freed = [b for b in reversed(table.block_ids) if self.allocator.free(b) == 0]
        if self._copies and freed:
            gone = set(freed)
            self._copies = [(src, dst) for src, dst in self._copies if dst not in gone]
        return freed

    # --- invariants ---------------------------------------------------------------------------
    def check(self) -> None:
        """Verify every invariant; raise ``BlockError`` naming the first breach.

        The allocator's own (:meth:`BlockAllocator.check`), then: each table holds exactly
        ``ceil(num_tokens / BS)`` distinct blocks; each block's ref count equals the number of
        tables holding it (so no table holds a free block, and no block is leaked); a shared block
        holds the same number of tokens in every table (shared blocks are never written); every
        queued copy-on-write copy goes into a block some table holds.
        """
        self.allocator.check()
        holders: Counter[int] = Counter()
        fill: dict[int, set[int]] = {}
        for seq_id, table in self._tables.items():
            if table.num_tokens < 1 or len(table) != blocks_needed(table.num_tokens, self.block_size):
                raise BlockError(f"sequence {seq_id!r} holds {len(table)} blocks for {table.num_tokens} tokens")
            if len(set(table.block_ids)) != len(table):
                raise BlockError(f"sequence {seq_id!r} holds a block twice: {table.block_ids}")
            holders.update(table.block_ids)
            for logical, block_id, filled in table.entries():
                fill.setdefault(block_id, set()).add(filled)
        for block_id in range(self.num_blocks):
            if self.allocator.ref_count(block_id) != holders[block_id]:
                raise BlockError(f"block {block_id} has ref count {self.allocator.ref_count(block_id)} "
                                 f"but {holders[block_id]} block tables hold it")
        uneven = {b: sorted(f) for b, f in fill.items() if len(f) > 1}
        if uneven:
            raise BlockError(f"shared blocks hold different token counts in different tables: {uneven}")
        stale = [(src, dst) for src, dst in self._copies if holders[dst] == 0]
        if stale:
            raise BlockError(f"queued copy-on-write copies into blocks no table holds: {stale}")

    # --- helpers ------------------------------------------------------------------------------
    def _table(self, seq_id) -> BlockTable:
        try:
            return self._tables[check_seq_id(seq_id)]
        except KeyError:
            raise BlockError(f"unknown sequence {seq_id!r} (known: {list(self._tables)!r:.80})") from None

    @staticmethod
    def _check_tokens(num_tokens: int) -> int:
        try:
            return count("num_tokens", num_tokens, minimum=1, error=BlockError)
        except BlockError as e:
            raise BlockError(f"a prompt needs >= 1 token: {e}") from None

    def __repr__(self) -> str:
        return (f"BlockSpaceManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"sequences={len(self._tables)}, free={self.num_free_blocks})")
