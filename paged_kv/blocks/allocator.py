"""``BlockAllocator``: the pool of physical KV blocks, as a free list with reference counts.

Bookkeeping only (no tensors): a physical block is just an id ``0 .. num_blocks - 1``; the
tensors it names live in the paged cache.  Follows the vLLM paper, §4.2-4.3 (the "KV block
manager" hands out fixed-size physical blocks), §4.4 (reference counts make sharing possible),
and vLLM v1's ``FreeKVCacheBlockQueue`` (``vllm/v1/core/kv_cache_utils.py``) for the free list
(:class:`~paged_kv.blocks.free_block_queue.FreeBlockQueue`).  With a
:class:`~paged_kv.blocks.prefix_cache.PrefixCache` attached (chapter 8), a freed block keeps its
cache entry (*cached-free*, ref count 0) until it is handed out again, and free blocks that cache
nothing are handed out first (vLLM v1's ``BlockPool.free_blocks``, ``vllm/v1/core/block_pool.py``).
"""

from __future__ import annotations

import operator
from typing import Iterable

from ..errors import BlockError, ConfigError, OutOfBlocksError
from ..validate import count
from .free_block_queue import FreeBlockQueue
from .prefix_cache import PrefixCache

__all__ = ["BlockAllocator"]


class BlockAllocator:
    """Hands out physical block ids from a free list; counts the block tables holding each.

    Args:
        num_blocks: blocks in the pool (NB), >= 1.
        free_order: the initial order of the free list, a permutation of
            ``range(num_blocks)``; default ``0, 1, 2, ...``.  Which physical id a request
            gets depends only on this order and on the sequence of ``allocate``/``free``
            calls (and, with a prefix cache, on which freed blocks are cached), so a trace
            (e.g. the paper's Figures 6-7, where the first blocks handed out are 7, 1, 3,
            ...) replays with the same ids given the same order.

    **Why a FIFO free list with a ref-count array.**
    ``allocate`` takes the id at the *head*; a block whose count drops to zero goes to
    the *tail*.  Both are O(1), and a ref count lookup is an O(1) list index, which is
    all a decode step needs (one allocation per sequence at most).  The alternatives
    cost more or say less: scanning a bitmap for the lowest free id is O(NB) per
    allocation; a ``set`` has no order a reader (or a test) can predict; a stack (vLLM
    v0's ``free_blocks.pop()``) hands the block freed a moment ago straight back out,
    which keeps a few ids hot (vLLM v1 does that with prefix caching off, for GPU cache
    locality) but, with prefix caching, would destroy the freshest cached K/V first.
    FIFO is what vLLM v1 does with cached blocks: a freed block still holds valid K/V,
    and reusing the *least recently* freed block first keeps recently freed contents
    around longest (LRU eviction).  Without a cache this allocator stays FIFO: with
    nothing cached no order saves prefill, and "free longest, handed out first" is the
    order the book's traces (chapter 5) are read by.  A ``deque`` would do for FIFO
    alone; but a cache hit must pull a block out of the *middle* of the queue in O(1), so
    the list is a doubly linked :class:`~paged_kv.blocks.free_block_queue.FreeBlockQueue`,
    as in vLLM v1 (a deque would no longer do: its ``remove`` is O(NB)).

    Prefix caching (:attr:`cache`, set by the manager): a freed block whose K/V is cached
    keeps its entry and joins the tail (*cached-free*); a freed block that caches nothing
    (a partial last block, a block never registered) joins the *head*, so the free list
    is always the empty blocks, then the cached-free ones, least recently freed first,
    and a cached entry is evicted only when no empty block is free.  Appended like the
    rest, an empty block would wait behind cached ones, and a one-token request would
    destroy cached K/V to spare a block that holds nothing.  vLLM v1 does the same
    (``BlockPool.free_blocks``: blocks without a hash are prepended, those with one
    appended); SGLang's radix cache likewise evicts tree nodes only for what its free pool
    lacks (``evict_from_tree_cache``, ``python/sglang/srt/mem_cache/common.py``).
    :meth:`allocate` evicts the head's entry *before* handing the block out, so no entry
    ever names a block that holds other tokens; :meth:`touch` revives a cached-free block
    (a hit) by unlinking it from the middle of the list.

    Ref counts: ``allocate`` sets a block's count to 1; :meth:`share` adds a holder (a
    forked sequence); :meth:`free` removes one.  A block is free exactly when its count
    is 0.

    Raises:
        ConfigError: ``num_blocks < 1`` or a ``free_order`` that is not a permutation.
        OutOfBlocksError: ``allocate`` with an empty free list (state unchanged).
        BlockError: ``free``/``share`` of a free block (never allocated, or freed
            already) or of an id outside the pool.
    """

    def __init__(self, num_blocks: int, free_order: Iterable[int] | None = None) -> None:
        num_blocks = count("num_blocks", num_blocks, minimum=1)
        given = list(range(num_blocks)) if free_order is None else list(free_order)
        try:
            order = [count("a free_order entry", b, minimum=0) for b in given]
        except ConfigError:
            order = []
        if sorted(order) != list(range(num_blocks)):
            raise ConfigError(f"free_order must be a permutation of range({num_blocks}), got {given!r:.120}")
        self.num_blocks = num_blocks
        self._free = FreeBlockQueue(num_blocks, order)   # head = next block handed out
        self.cache: PrefixCache | None = None      # prefix cache whose entries name our blocks
        self._refs: list[int] = [0] * num_blocks   # holders of each block; 0 = free
        self._ever: list[bool] = [False] * num_blocks   # handed out at least once (for errors)

    # --- queries ------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free list (ref count 0)."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one block table (ref count >= 1)."""
        return self.num_blocks - len(self._free)

    def ref_count(self, block_id: int) -> int:
        """How many block tables hold ``block_id`` (0 = free). Raises ``BlockError`` if out of range."""
        return self._refs[self._check_id(block_id)]

    def free_list(self) -> list[int]:
        """The free block ids in the order ``allocate`` will hand them out: least recently freed
        first; with a prefix cache, the blocks that cache nothing first (the most recently freed
        of them first), then the cached-free ones, least recently freed first (their eviction
        order)."""
        return list(self._free)

    def cached_free(self) -> list[int]:
        """Free blocks that still hold cached K/V (ref count 0, entry kept), in eviction order: the
        end of :meth:`free_list`, behind every free block that caches nothing."""
        if self.cache is None:
            return []
        return [b for b in self._free if b in self.cache]

    # --- changes ------------------------------------------------------------------------------
    def allocate(self) -> int:
        """Take the block at the head of the free list; its ref count becomes 1.

        Raises:
            OutOfBlocksError: no free block (``needed=1, free=0``); nothing changes.
        """
        if not len(self._free):
            raise OutOfBlocksError(1, 0, "one block")
        block_id = self._free.popleft()
        if self.cache is not None:
            self.cache.evict(block_id)             # its entry goes before the block is reused
        self._refs[block_id] = 1
        self._ever[block_id] = True
        return block_id

    def share(self, block_id: int) -> int:
        """Add a holder to an allocated block (a fork); returns its new ref count.

        Raises:
            BlockError: the block is free (sharing it would hand out memory nobody owns).
        """
        block_id = self._check_id(block_id)
        if self._refs[block_id] == 0:
            raise BlockError(f"cannot share block {block_id}: it is free")
        self._refs[block_id] += 1
        return self._refs[block_id]

    def touch(self, block_id: int) -> int:
        """Add a holder to a block found in the prefix cache; returns its new ref count.  A
        cached-free block (count 0) leaves the free list from wherever it sits, in O(1).

        Raises:
            BlockError: no prefix cache, or the block caches nothing (it may hold other tokens).
        """
        block_id = self._check_id(block_id)
        if self.cache is None or block_id not in self.cache:
            raise BlockError(f"block {block_id} holds no cached prefix: only a cache hit is touched")
        if self._refs[block_id] == 0:
            self._free.remove(block_id)
        self._refs[block_id] += 1
        return self._refs[block_id]

    def free(self, block_id: int) -> int:
        """Remove one holder of ``block_id``; at zero the block goes to the tail of the free list,
        or, with a prefix cache and no entry for it, to the head (reused before any cached-free
        block is evicted).

        Returns the remaining ref count (0 = the block is free again).

        Raises:
            BlockError: ``block_id`` is free: either it was never allocated ("not allocated"),
                or it was and has been freed already ("double free"); or it is outside the
                pool.  The count never goes negative and a block never sits twice on the list.
        """
        block_id = self._check_id(block_id)
        if self._refs[block_id] == 0 and not self._ever[block_id]:
            raise BlockError(f"block {block_id} is not allocated: it was never handed out, so "
                             f"there is nothing to free")
        if self._refs[block_id] == 0:
            raise BlockError(f"double free: block {block_id} is already free")
        self._refs[block_id] -= 1
        if self._refs[block_id] == 0:
            if self.cache is not None and block_id not in self.cache:
                self._free.appendleft(block_id)
            else:
                self._free.append(block_id)
        return self._refs[block_id]

    # --- invariants ---------------------------------------------------------------------------
    def check(self) -> None:
        """Verify the free list and ref counts agree; raise ``BlockError`` naming the first breach.

        Invariants, in the order checked: no ref count is negative; free + used = ``num_blocks``
        (used = blocks with a count >= 1; a leaked block, free by count but missing from the list,
        breaks this); no id sits twice on the free list; the free list holds exactly the blocks
        whose count is 0; with a prefix cache, no cached-free block sits ahead of one that caches
        nothing (it would be evicted while an empty block is free).
        """
        negative = [b for b, r in enumerate(self._refs) if r < 0]
        if negative:
            raise BlockError(f"negative ref count on blocks {negative}")
        used = sum(1 for r in self._refs if r > 0)
        if len(self._free) + used != self.num_blocks:
            raise BlockError(f"free ({len(self._free)}) + used ({used}) blocks != pool size {self.num_blocks}")
        free = list(self._free)
        if len(set(free)) != len(free):
            raise BlockError(f"a block appears twice on the free list: {free}")
        zero = {b for b, r in enumerate(self._refs) if r == 0}
        if set(self._free) != zero:
            raise BlockError(f"free list {sorted(self._free)} differs from the blocks with ref count 0 {sorted(zero)}")
        if self.cache is not None:
            cached = [b for b in free if b in self.cache]
            if cached and any(b not in self.cache for b in free[free.index(cached[0]):]):
                raise BlockError(f"cached-free block {cached[0]} sits ahead of a free block that caches "
                                 f"nothing in the free list {free}")

    def _check_id(self, block_id: int) -> int:
        if type(block_id) is int and 0 <= block_id < self.num_blocks:   # the common case
            return block_id
        try:
            ok = not isinstance(block_id, bool) and 0 <= operator.index(block_id) < self.num_blocks
        except TypeError:
            ok = False
        if not ok:
            raise BlockError(f"block id must be an int in 0..{self.num_blocks - 1}, got {block_id!r}")
        return operator.index(block_id)

    def __repr__(self) -> str:
        return f"BlockAllocator(num_blocks={self.num_blocks}, free={self.num_free_blocks})"
