"""The block space manager: gives each sequence a block table over one shared pool of blocks.

Bookkeeping only (pure Python, no tensors), following the vLLM paper §4.2-4.3: a new physical
block is taken only when a sequence's last one is full (on-demand allocation), so a sequence
wastes at most ``block_size - 1`` slots.  The paged cache and kernels read the tables and slot
mappings made here (``slot = physical_id * block_size + offset``, vLLM's ``slot_mapping``).

Swapping (§4.5): with a CPU pool (``num_cpu_blocks``), :meth:`BlockSpaceManager.swap_out` moves a
preempted group's blocks to CPU blocks and :meth:`BlockSpaceManager.swap_in` brings them back,
each shared block moved once; the manager hands over the ``(src, dst)`` block mapping and the
cache copies the bytes.

Fork and copy-on-write (§4.4, used for parallel sampling and beam search):
:meth:`BlockSpaceManager.fork` lets a child share all its parent's blocks (ref counts go up, no
copy); the first append into a *shared, partly filled* last block copies that block to a fresh
one, and the ``(src, dst)`` copy is queued for the cache (:meth:`BlockSpaceManager.take_copies`).

Rollback (chapter 9, speculative decoding): :meth:`BlockSpaceManager.truncate` takes a sequence back
to its first ``n`` tokens (rejected draft slots), releasing the blocks past the cut as
:meth:`BlockSpaceManager.free` does; a shared tail stays shared and copy-on-write still guards it.

Automatic prefix caching (chapter 8; vLLM v1): with ``enable_prefix_caching`` a full block is
registered in a :class:`~paged_kv.blocks.prefix_cache.PrefixCache` by
:meth:`BlockSpaceManager.cache_full_blocks`, a new prompt starts from the blocks it hits
(:meth:`BlockSpaceManager.cache_hit`, then ``allocate(..., cached=hits)``), and a freed block
stays cached with ref count 0 until the pool hands it out again (LRU).  Three rules:

1. the last sampled token, whose K/V is not yet written, is never part of a cached block (only
   tokens computed by the end of the step are registered, and a hit stops before a prompt's last
   token, so at least one token always runs through the model);
2. a block's hash is registered when the step that fills it is scheduled, during a prefill or a
   decode (vLLM v1's ``allocate_slots`` -> ``cache_blocks``), so a request admitted later in the
   same step can hit it; the step writes a block's K/V before any chunk of it reads them (the
   runner's order), and if the part that was to write it fails, its entry is dropped
   (:meth:`BlockSpaceManager.discard_cached`) before anyone can hit it in a later step;
3. a freed block with a hash stays cached (ref count 0, on the free list) until the pool needs
   it, after every free block without one; its entry is removed before it is reused.

Legend: BS block size (tokens per block), NB blocks in the pool.
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Iterable

from ..errors import BlockError, OutOfBlocksError
from ..validate import count
from .allocator import BlockAllocator
from .block_table import BlockTable, blocks_needed, check_seq_id
from .prefix_cache import PrefixCache

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
        num_cpu_blocks: blocks of the CPU swap pool (0: no swapping).
        enable_prefix_caching: keep full blocks findable by their prefix (vLLM's
            ``enable_prefix_caching``); off by default.
        hash_fn: the prefix cache's block hash, ``"sha256"`` or a function
            ``(parent, token_ids, extra_key) -> hashable`` (see :class:`PrefixCache`).

    Raises:
        ConfigError: bad ``num_blocks``/``block_size``/``free_order``.
        OutOfBlocksError: ``(needed, free)`` in blocks, when the pool cannot serve a request.
        BlockError: unknown or duplicate sequence id, a prompt of < 1 token, a double free.
    """

    def __init__(self, num_blocks: int, block_size: int, free_order: Iterable[int] | None = None,
                 num_cpu_blocks: int = 0, enable_prefix_caching: bool = False,
                 hash_fn="sha256") -> None:
        block_size = count("block_size (tokens per block)", block_size, minimum=1)
        self.allocator = BlockAllocator(num_blocks, free_order)
        self.num_blocks, self.block_size = self.allocator.num_blocks, block_size
        num_cpu_blocks = count("num_cpu_blocks", num_cpu_blocks, 0)
        self.cpu_allocator = BlockAllocator(num_cpu_blocks) if num_cpu_blocks else None
        self._tables: dict[Hashable, BlockTable] = {}
        self._swapped: dict[Hashable, BlockTable] = {}   # tables of swapped sequences: CPU block ids
        self._copies: list[tuple[int, int]] = []   # copy-on-write (src, dst) not yet applied
        self.cache = PrefixCache(block_size, hash_fn) if enable_prefix_caching else None
        self.allocator.cache = self.cache
        self._cached_upto: dict[Hashable, int] = {}    # per sequence: leading blocks registered
        self._short_tail: set = set()   # sequences truncated into a shared last block (see truncate)

    # --- queries ------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    @property
    def seq_ids(self) -> list:
        """Sequences holding blocks, in the order they were allocated (or forked)."""
        return list(self._tables)

    @property
    def swapped_ids(self) -> list:
        """Sequences whose blocks are in the CPU pool (swapped out)."""
        return list(self._swapped)

    def __contains__(self, seq_id) -> bool:
        try:
            seq_id = check_seq_id(seq_id)
        except BlockError:          # not a valid id (e.g. a list): certainly not held
            return False
        return seq_id in self._tables or seq_id in self._swapped

    def block_table(self, seq_id) -> BlockTable:
        """A copy of ``seq_id``'s block table (mutating it does not change the manager)."""
        return self._table(seq_id).copy()

    def block_ids(self, seq_id) -> tuple[int, ...]:
        """``seq_id``'s physical block ids in logical order, as a tuple (what a step sends the model
        runner; cheaper than :meth:`block_table`'s checked copy)."""
        return tuple(self._table(seq_id).block_ids)

    def swapped_table(self, seq_id) -> BlockTable:
        """A copy of a swapped-out sequence's block table: its ids are CPU block ids.

        Raises:
            BlockError: ``seq_id`` is not swapped out.
        """
        seq_id = check_seq_id(seq_id)
        if seq_id not in self._swapped:
            raise BlockError(f"sequence {seq_id!r} is not swapped out (swapped: {list(self._swapped)!r:.80})")
        return self._swapped[seq_id].copy()

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

    def allocate(self, seq_id, num_tokens: int, cached=()) -> BlockTable:
        """Give a new sequence the ``ceil(num_tokens / BS)`` blocks its prompt fills; returns its table.

        ``cached``: block ids of a prefix-cache hit (:meth:`cache_hit`), the table's first blocks;
        they gain a holder (a cached-free one leaves the free list) and only the rest are new.

        Raises:
            BlockError: ``seq_id`` is not a str/int or already holds blocks, ``num_tokens < 1``, or
                ``cached`` names a block that caches nothing or more blocks than the prompt fills.
            OutOfBlocksError: fewer free blocks than needed (nothing is allocated).
        """
        seq_id = check_seq_id(seq_id)
        if seq_id in self._tables:
            raise BlockError(f"sequence {seq_id!r} already holds blocks; free it first")
        num_tokens = self._check_tokens(num_tokens)
        cached = list(cached)
        if cached and (self.cache is None or any(b not in self.cache for b in cached)
                       or len(cached) * self.block_size > num_tokens):
            raise BlockError(f"cached blocks {cached} are not a prefix-cache hit of a {num_tokens}-token prompt")
        needed = self.blocks_to_allocate(num_tokens, cached)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(needed, self.num_free_blocks, f"a {num_tokens}-token prompt")
        for b in cached:                               # first: a touched block cannot be evicted below
            self.allocator.touch(b)
        new = [self.allocator.allocate() for _ in range(blocks_needed(num_tokens, self.block_size) - len(cached))]
        table = BlockTable(self.block_size, cached + new, num_tokens)
        self._tables[seq_id] = table
        self._cached_upto[seq_id] = len(cached)
        return table.copy()

    def blocks_to_allocate(self, num_tokens: int, cached=()) -> int:
        """Free blocks a ``num_tokens`` prompt takes when its first blocks are the hit ``cached``:
        its new blocks, plus each hit block that is cached-free (it leaves the free list too)."""
        num_tokens = self._check_tokens(num_tokens)
        revived = sum(1 for b in cached if self.allocator.ref_count(b) == 0)
        return blocks_needed(num_tokens, self.block_size) - len(cached) + revived

    # --- prefix caching -----------------------------------------------------------------------
    def cache_hit(self, token_ids, extra_key=None, hashes: list | None = None) -> list[int]:
        """Block ids of the longest cached prefix of ``token_ids`` (full blocks, stored tokens
        checked), stopping before the last token (rule 1: it must run to give logits), so at most
        ``(len - 1) // BS`` blocks.  ``[]`` without prefix caching.  Changes nothing."""
        if self.cache is None or not token_ids:
            return []
        return self.cache.lookup(token_ids, extra_key, hashes, max_blocks=(len(token_ids) - 1) // self.block_size)

    def cache_full_blocks(self, seq_id, token_ids, num_computed: int, extra_key=None,
                          hashes: list | None = None) -> list[int]:
        """Register ``seq_id``'s full blocks whose tokens are all computed (rule 2: as soon as a block
        fills, prompt or decode); returns the block ids newly registered.  ``token_ids``: the
        sequence's tokens; ``num_computed``: how many have their K/V written, or will have once the
        step being scheduled has run (the scheduler registers then, as vLLM v1 does; the last sampled
        token never has, rule 1).  A block already cached (a hit, or shared) is skipped.  Each new
        entry stores the block's own ``BS`` tokens and, as its parent, the entry of the block before it.
        Registration stops before a block another sequence holds fewer tokens of (it was cut
        inside it, shared, by :meth:`truncate`): once that sequence is its last holder it writes
        into it in place, so the block must not be findable by these tokens; a later call goes on
        once that sequence has copied or freed it.

        Raises:
            BlockError: unknown sequence, or ``num_computed`` past the tokens the table holds.
        """
        table = self._table(seq_id)
        if self.cache is None:
            return []
        seq_id = check_seq_id(seq_id)
        if not 0 <= num_computed <= min(len(token_ids), table.num_tokens):
            raise BlockError(f"num_computed={num_computed} outside sequence {seq_id!r}'s "
                             f"{min(len(token_ids), table.num_tokens)} tokens")
        full = num_computed // self.block_size
        start = self._cached_upto.get(seq_id, 0)
        if full <= start:
            return []
        hashes = self.cache.hashes(token_ids[:full * self.block_size], extra_key, hashes)
        added, bs = [], self.block_size
        parent = self.cache.entry(table.block_ids[start - 1]) if start else None
        if start and parent is None:                   # held blocks are never evicted: a broken invariant
            raise BlockError(f"block {table.block_ids[start - 1]} of sequence {seq_id!r} lost its cache entry")
        short = {self._tables[s].block_ids[-1] for s in self._short_tail if s in self._tables}
        for i in range(start, full):
            b = table.block_ids[i]
            if b in short:                             # another holder may still write into it
                full = i
                break
            entry = self.cache.entry(b)
            if entry is None:                          # the parent link: the entry of block i - 1
                entry = self.cache.register(b, hashes[i], token_ids[i * bs:(i + 1) * bs], extra_key, parent)
                added.append(b)
            parent = entry
        self._cached_upto[seq_id] = full
        return added

    def discard_cached(self, seq_id, block_ids) -> None:
        """Drop the cache entries of ``block_ids``, blocks of ``seq_id`` registered for a step whose
        part that was to write their K/V failed or did not run (rule 2): nobody may hit them in a
        later step.  Not evictions; ``seq_id`` counts as registered up to the first of them.  Every
        sequence holding one of them must be freed (or recomputed) by the caller: its table would
        hold blocks whose K/V were never written.  vLLM has the same hazard (its PR #43569 proposes
        rolling back eager registrations of a request freed before its step committed).

        Raises:
            BlockError: an unknown sequence, or a block it does not hold or that caches nothing.
        """
        table = self._table(seq_id)
        block_ids = list(block_ids)
        if self.cache is None or not block_ids:
            return
        where = [table.block_ids.index(b) if b in table.block_ids else -1 for b in block_ids]
        bad = [b for b, i in zip(block_ids, where) if i < 0 or b not in self.cache]
        if bad:
            raise BlockError(f"blocks {bad} are not cached blocks of sequence {seq_id!r}: nothing to discard")
        for b in block_ids:
            self.cache.discard(b)
        seq_id = check_seq_id(seq_id)
        self._cached_upto[seq_id] = min(self._cached_upto.get(seq_id, 0), min(where))

    # --- decode tokens ------------------------------------------------------------------------
    def blocks_to_append(self, seq_id) -> int:
        """Free blocks the next ``append_slot(seq_id)`` takes: 1 if the last block is full (a new
        block) or shared and partly filled (its copy), else 0."""
        table = self._table(seq_id)
        if table.num_tokens == len(table) * self.block_size:
            return 1
        return 1 if self.allocator.ref_count(table.block_ids[-1]) > 1 else 0

    def blocks_to_append_all(self, seq_ids, num_tokens=1) -> int:
        """Free blocks that ``num_tokens`` more tokens for *each* of ``seq_ids`` take (appended one
        sequence after the other, as a step does): the new blocks each table grows by; and for a
        shared, partly filled last block held by ``rc`` tables, ``h`` of them appending,
        ``min(h, rc - 1)`` copies: every appender copies while the block is still shared, and the
        last holder then writes in place (vLLM paper §4.4).  Summing :meth:`blocks_to_append`
        instead would count a copy for every holder and refuse steps that fit.

        Args:
            seq_ids: the appending sequences.
            num_tokens: tokens per sequence: one int for all (default 1, a decode step) or one
                per sequence (a chunk of a prefill that grows the table).

        Raises:
            BlockError: an unknown sequence, one named twice, or a token count that is not an
                int >= 0 (or not one per sequence).
        """
        seq_ids = [check_seq_id(s) for s in seq_ids]
        if len(set(seq_ids)) != len(seq_ids):
            raise BlockError(f"a sequence is named twice: {seq_ids}")
        counts = self._token_counts(seq_ids, num_tokens)
        needed, sharers = 0, Counter()
        for s, k in zip(seq_ids, counts):
            table = self._table(s)
            if k == 0:
                continue
            needed += blocks_needed(table.num_tokens + k, self.block_size) - len(table)
            if table.num_tokens < len(table) * self.block_size and self.allocator.ref_count(table.block_ids[-1]) > 1:
                sharers[table.block_ids[-1]] += 1
        return needed + sum(min(h, self.allocator.ref_count(b) - 1) for b, h in sharers.items())

    @staticmethod
    def _token_counts(seq_ids: list, num_tokens) -> list[int]:
        if isinstance(num_tokens, (list, tuple)):
            if len(num_tokens) != len(seq_ids):
                raise BlockError(f"{len(num_tokens)} token counts for {len(seq_ids)} sequences")
            return [count("num_tokens", k, 0, error=BlockError) for k in num_tokens]
        return [count("num_tokens", num_tokens, 0, error=BlockError)] * len(seq_ids)

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
        if self._short_tail:                           # its last block is now its own or written
            self._short_tail.discard(check_seq_id(seq_id))
        table.num_tokens += 1
        return table.slot(table.num_tokens - 1)

    def append_slots(self, seq_id, num_tokens: int) -> list[int]:
        """Make room for ``num_tokens`` more tokens of ``seq_id`` (a decode token, or a chunk that
        re-prefills a sequence's own tokens after a fork); returns their slots.  All or nothing:
        the blocks are counted first (:meth:`blocks_to_append_all`), so a shortfall raises before
        any state changes.

        Raises:
            BlockError: unknown sequence, ``num_tokens`` not an int >= 0.
            OutOfBlocksError: the free blocks cannot hold them (nothing changes).
        """
        num_tokens = count("num_tokens", num_tokens, 0, error=BlockError)
        needed = self.blocks_to_append_all([seq_id], num_tokens)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(needed, self.num_free_blocks,
                                   f"{num_tokens} tokens of sequence {seq_id!r}")
        return [self.append_slot(seq_id) for _ in range(num_tokens)]

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

    # --- rollback (speculative decoding, chapter 9) ------------------------------------------
    def truncate(self, seq_id, num_tokens: int) -> list[int]:
        """Roll ``seq_id`` back to its first ``num_tokens`` tokens; returns the block ids that went
        back to the free list (their ref count reached 0), in the order they went: last logical
        block first, as :meth:`free` returns them.

        Speculative decoding (Leviathan et al., "Fast Inference from Transformers via Speculative
        Decoding", ICML 2023) writes K/V for ``k`` draft tokens, verifies them in one target pass
        and keeps the accepted ones; the rejected slots are taken back here.  vLLM v1 rolls back
        in its scheduler (``Scheduler.update_from_output``: ``num_computed_tokens -= num_rejected``)
        and keeps the request's blocks for the next step's tokens to overwrite; we also release
        the blocks wholly past the new length, so the free count says what a sequence really
        holds (at most ``BS - 1`` wasted slots, as after any append).

        What changes: the table keeps ``ceil(num_tokens / BS)`` blocks; a partly used last block
        is kept (its slots past the cut are free to be written again); each block past it loses
        this table as a holder, and one whose count reaches 0 goes back to the free list exactly
        as :meth:`free` sends it (:meth:`BlockAllocator.free`): without a prefix cache to the
        *tail*, the last logical block first, so they are handed out again behind every block
        already free, the last logical block first (FIFO: the pool's order does not depend on
        whether a block held a draft); with a prefix cache, a block that caches nothing (a draft
        block is never registered) goes to the *head*, the last logical block first, so the
        first dropped block ends at the very head and the next allocation, typically the next
        draft, takes it back (nothing is evicted for it); a registered block stays cached-free
        at the tail.  Truncating to the current length changes nothing and returns ``[]``.

        Forks: a dropped block still held by another table only loses a holder, and no slot is
        written, so the other sequences' tokens never change.  A cut inside a *shared* last block
        leaves it shared, this table holding fewer of its tokens than the others: no copy now (a
        rollback never needs a free block), and copy-on-write still guards it, since the next
        :meth:`append_slot` into a shared, partly filled block copies it first
        (:meth:`check` allows the uneven count for such a sequence only).  A queued copy-on-write
        copy into a block freed here is dropped, as :meth:`free` does (the block may be handed
        out before the cache applies the queue); a copy into the kept last block stays (it
        carries the sequence's own earlier tokens).

        Prefix caching: the sequence counts as registered up to its kept full blocks.  A dropped
        registered block keeps its entry (its K/V are still those of its verified prefix).  A cut
        *inside* a registered block is refused: a registered block holds only verified tokens
        (the engine registers nothing unverified), which a rollback never takes back, and a kept
        partial block must not stay findable by a hash of tokens the table no longer holds.  A
        shared block cut into here is not registered by the other holders while this sequence
        holds it short (:meth:`cache_full_blocks`): as its last holder it would write in place.

        Args:
            seq_id: a sequence on the GPU.
            num_tokens: tokens to keep, ``1 <= num_tokens <=`` its current length.  Not 0: a
                sequence holds at least one token (every table does, :meth:`check`); dropping
                them all is :meth:`free`.

        Raises:
            BlockError: ``seq_id`` not a str/int, unknown, or swapped out; ``num_tokens`` not an
                int, below 1 or above the sequence's length; a cut inside a registered block.
                Nothing changes.
        """
        if check_seq_id(seq_id) in self._swapped:
            raise BlockError(f"sequence {seq_id!r} is swapped out: swap it in before truncating it")
        table = self._table(seq_id)
        seq_id = check_seq_id(seq_id)
        try:
            n = count("num_tokens (tokens to keep)", num_tokens, 1, error=BlockError)
        except BlockError as e:
            raise BlockError(f"{e}; a sequence keeps >= 1 token (free() drops them all)") from None
        if n > table.num_tokens:
            raise BlockError(f"cannot truncate sequence {seq_id!r} to {n} tokens: it holds {table.num_tokens}")
        if n == table.num_tokens:
            return []
        bs, keep = self.block_size, blocks_needed(n, self.block_size)
        if self.cache is not None and n % bs and table.block_ids[keep - 1] in self.cache:
            raise BlockError(f"cannot truncate sequence {seq_id!r} to {n} tokens: the cut falls inside block "
                             f"{table.block_ids[keep - 1]} (logical {keep - 1}), registered in the prefix cache; "
                             f"a registered block holds verified tokens, never rolled back")
        dropped = table.block_ids[keep:]
        del table.block_ids[keep:]
        table.num_tokens = n
        freed = [b for b in reversed(dropped) if self.allocator.free(b) == 0]
        if seq_id in self._cached_upto:
            self._cached_upto[seq_id] = min(self._cached_upto[seq_id], n // bs)
        if n % bs and self.allocator.ref_count(table.block_ids[-1]) > 1:
            self._short_tail.add(seq_id)
        else:
            self._short_tail.discard(seq_id)
        if self._copies and freed:
            gone = set(freed)
            self._copies = [(src, dst) for src, dst in self._copies if dst not in gone]
        return freed

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
        if check_seq_id(parent_id) in self._short_tail:          # the same fill as its parent
            self._short_tail.add(child_id)
        if self.cache is not None:
            self._cached_upto[child_id] = self._cached_upto.get(check_seq_id(parent_id), 0)
        return parent.copy()

    def free(self, seq_id) -> list[int]:
        """Release all of ``seq_id``'s blocks; returns the ids that went back to the free list.

        Blocks are released last logical block first (as vLLM does), so with a FIFO free list
        a sequence's tail blocks are reused before its head blocks.  Shared blocks only lose a
        holder.  A copy-on-write copy still queued for one of the freed blocks is dropped: the block
        may be handed to another sequence before the cache applies the queue, and a stale copy
        must never land in it.  Raises ``BlockError`` for an unknown (e.g. already freed) sequence.
        """
        self._short_tail.discard(check_seq_id(seq_id))
        if check_seq_id(seq_id) in self._swapped:               # its blocks are in the CPU pool
            table = self._swapped.pop(check_seq_id(seq_id))
            for b in table.block_ids:
                self.cpu_allocator.free(b)
            return []
        table = self._table(seq_id)
        del self._tables[check_seq_id(seq_id)]
        self._cached_upto.pop(check_seq_id(seq_id), None)
        freed = [b for b in reversed(table.block_ids) if self.allocator.free(b) == 0]
        if self._copies and freed:
            gone = set(freed)
            self._copies = [(src, dst) for src, dst in self._copies if dst not in gone]
        return freed

    # --- swapping (preemption by swap, vLLM paper §4.5) ---------------------------------------
    def _group_blocks(self, seq_ids, tables: dict, where: str) -> list[int]:
        """Distinct blocks of ``seq_ids`` (all in ``tables``), first-seen order; none may be held
        by a sequence outside the group (it would lose its K/V)."""
        ids = [check_seq_id(s) for s in seq_ids]
        missing = [s for s in ids if s not in tables]
        if missing:
            raise BlockError(f"sequences {missing!r} are not {where}")
        blocks = list(dict.fromkeys(b for s in ids for b in tables[s].block_ids))
        inside = Counter(b for s in ids for b in tables[s].block_ids)
        alloc = self.allocator if tables is self._tables else self.cpu_allocator
        shared_out = [b for b in blocks if alloc.ref_count(b) != inside[b]]
        if shared_out:
            raise BlockError(f"blocks {shared_out} are also held outside {ids!r}: swap the whole group")
        return blocks

    def can_swap_out(self, seq_ids) -> bool:
        """Whether the CPU pool has a block for every distinct block of the group ``seq_ids``."""
        blocks = self._group_blocks(seq_ids, self._tables, "on the GPU")
        return self.cpu_allocator is not None and len(blocks) <= self.cpu_allocator.num_free_blocks

    def can_swap_in(self, seq_ids, watermark_blocks: int = 0) -> bool:
        """Whether the GPU pool can take the group back, keeping ``watermark_blocks`` free."""
        blocks = self._group_blocks(seq_ids, self._swapped, "swapped out")
        return len(blocks) + watermark_blocks <= self.num_free_blocks

    def swap_out(self, seq_ids) -> list[tuple[int, int]]:
        """Move every block of the group ``seq_ids`` to the CPU pool, each shared block once (its ref
        count travels with it); returns the ``(gpu, cpu)`` block mapping the cache must copy before
        the GPU blocks are reused.

        Raises:
            BlockError: no CPU pool, a sequence not on the GPU, a block also held outside the group,
                or copy-on-write copies still queued (apply them first).
            OutOfBlocksError: the CPU pool is too small (nothing changes).
        """
        return self._move(seq_ids, self._tables, self._swapped, self.allocator, self.cpu_allocator, "on the GPU")

    def swap_in(self, seq_ids) -> list[tuple[int, int]]:
        """Bring the group ``seq_ids`` back from the CPU pool; returns the ``(cpu, gpu)`` mapping.

        Raises:
            BlockError: a sequence not swapped out, a block also held outside the group.
            OutOfBlocksError: too few free GPU blocks (nothing changes).
        """
        return self._move(seq_ids, self._swapped, self._tables, self.cpu_allocator, self.allocator, "swapped out")

    def _move(self, seq_ids, src_tables, dst_tables, src_alloc, dst_alloc, where) -> list[tuple[int, int]]:
        if self.cpu_allocator is None:
            raise BlockError("this manager has no CPU pool (num_cpu_blocks=0): it cannot swap")
        if self._copies:
            raise BlockError(f"copy-on-write copies {self._copies} are queued: the cache must apply them first")
        ids = [check_seq_id(s) for s in seq_ids]
        blocks = self._group_blocks(ids, src_tables, where)
        if len(blocks) > dst_alloc.num_free_blocks:
            raise OutOfBlocksError(len(blocks), dst_alloc.num_free_blocks, f"swapping {ids!r}")
        mapping = {}
        for b in blocks:
            new = dst_alloc.allocate()
            for _ in range(src_alloc.ref_count(b) - 1):
                dst_alloc.share(new)                   # the ref count travels with the block
            mapping[b] = new
        for b in blocks:
            while src_alloc.free(b):
                pass
        for s in ids:
            self._cached_upto.pop(s, None)             # new block ids: registered again as they fill
            table = src_tables.pop(s)
            table.block_ids = [mapping[b] for b in table.block_ids]
            dst_tables[s] = table
        return list(mapping.items())

    # --- invariants ---------------------------------------------------------------------------
    def check(self) -> None:
        """Verify every invariant; raise ``BlockError`` naming the first breach.

        The allocator's own (:meth:`BlockAllocator.check`), then: each table holds exactly
        ``ceil(num_tokens / BS)`` distinct blocks; each block's ref count equals the number of
        tables holding it (so no table holds a free block, and no block is leaked); with prefix
        caching, the cache's own (:meth:`PrefixCache.check`), and a cached block a table holds is
        full, sits at its entry's depth, and its parent link names the entry of the table's
        previous block (held blocks are never evicted, so a table's cached blocks are one chain);
        a shared block holds the same number of tokens in every table (shared blocks are never
        written), except that a sequence :meth:`truncate` cut inside its shared last block may hold
        fewer (it copies before it writes); every queued copy-on-write copy goes into a block some table holds.
        """
        self.allocator.check()
        holders: Counter[int] = Counter()
        fill: dict[int, dict] = {}                     # block -> {seq_id: tokens it holds there}
        for seq_id, table in self._tables.items():
            if table.num_tokens < 1 or len(table) != blocks_needed(table.num_tokens, self.block_size):
                raise BlockError(f"sequence {seq_id!r} holds {len(table)} blocks for {table.num_tokens} tokens")
            if len(set(table.block_ids)) != len(table):
                raise BlockError(f"sequence {seq_id!r} holds a block twice: {table.block_ids}")
            holders.update(table.block_ids)
            for logical, block_id, filled in table.entries():
                fill.setdefault(block_id, {})[seq_id] = filled
        for block_id in range(self.num_blocks):
            if self.allocator.ref_count(block_id) != holders[block_id]:
                raise BlockError(f"block {block_id} has ref count {self.allocator.ref_count(block_id)} "
                                 f"but {holders[block_id]} block tables hold it")
        if self.cache is not None:
            self.cache.check()
            for seq_id, table in self._tables.items():
                before = None                          # the entry of the previous logical block
                for logical, block_id in enumerate(table.block_ids):
                    e = self.cache.entry(block_id)
                    if e is not None and e.depth != logical:
                        raise BlockError(f"cached block {block_id} is block {e.depth} of its prefix but "
                                         f"logical block {logical} of sequence {seq_id!r}")
                    if e is not None and table.filled(logical) != self.block_size:
                        raise BlockError(f"cached block {block_id} is not full in sequence {seq_id!r}")
                    if e is not None and logical and (before is None or e.parent != before.prefix_id):
                        raise BlockError(f"cached block {block_id} of sequence {seq_id!r} does not follow "
                                         f"its previous block {table.block_ids[logical - 1]} in the cache")
                    before = e
        uneven = {b: sorted(set(f.values())) for b, f in fill.items()
                  if any(k < max(f.values()) and s not in self._short_tail for s, k in f.items())}
        if uneven:
            raise BlockError(f"shared blocks hold different token counts in different tables: {uneven}")
        if self.cpu_allocator is not None:
            self.cpu_allocator.check()
            cpu_holders = Counter(b for t in self._swapped.values() for b in t.block_ids)
            for b in range(self.cpu_allocator.num_blocks):
                if self.cpu_allocator.ref_count(b) != cpu_holders[b]:
                    raise BlockError(f"CPU block {b} has ref count {self.cpu_allocator.ref_count(b)} but "
                                     f"{cpu_holders[b]} swapped tables hold it")
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
