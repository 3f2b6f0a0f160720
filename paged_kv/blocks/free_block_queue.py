"""``FreeBlockQueue``: the free blocks in eviction order, as a doubly linked list over block ids.

Follows vLLM v1's ``FreeKVCacheBlockQueue`` (``vllm/v1/core/kv_cache_utils.py``; read as a map,
not copied): the head is the block handed out next, a freed block joins the tail (or, when it
caches nothing, the head: :meth:`FreeBlockQueue.appendleft`, vLLM's ``prepend_n``), and a block
in the middle can leave in O(1).  Pure Python; no tensors.

**Why not a ``deque``.**  With automatic prefix caching a freed block keeps its K/V and stays
findable by its hash (a *cached-free* block, ref count 0).  When a later request hits it, the
block must leave the free queue from wherever it sits, typically the middle.  A ``deque`` can do
``popleft`` and ``append`` in O(1) but ``remove(x)`` is a linear scan, O(NB) per hit; a prompt
of ``k`` cached blocks would cost O(k * NB) to admit.  Two arrays ``prev``/``next`` indexed by
block id make a doubly linked list whose links are found in O(1) from the id alone, so every
operation here (``popleft``, ``append``, ``appendleft``, ``remove``, membership) is O(1), and no
Python object is allocated per block.

Legend: NB blocks in the pool.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from ..errors import BlockError
from ..validate import count

__all__ = ["FreeBlockQueue"]

_NONE = -1   # "no neighbour" in the link arrays


class FreeBlockQueue:
    """A queue of free block ids with O(1) insertion at either end and O(1) removal from anywhere
    (vLLM v1's free block queue).

    Args:
        num_blocks: ids run ``0 .. num_blocks - 1``.
        order: the initial queue, head first (distinct ids in range).

    Raises:
        ConfigError: ``num_blocks`` not an int >= 0.
        BlockError: an id outside the pool, an id queued twice (``append``, ``appendleft`` or
            ``order``), ``remove`` of an id not queued, ``popleft`` of an empty queue.
    """

    def __init__(self, num_blocks: int, order: Iterable[int] = ()) -> None:
        num_blocks = count("num_blocks (blocks in the pool)", num_blocks, 0)
        self.num_blocks = num_blocks
        self._prev = [_NONE] * num_blocks
        self._next = [_NONE] * num_blocks
        self._in = [False] * num_blocks
        self._head = self._tail = _NONE
        self._len = 0
        for b in order:
            self.append(b)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, block_id: int) -> bool:
        return 0 <= block_id < self.num_blocks and self._in[block_id]

    def __iter__(self) -> Iterator[int]:
        """Head to tail: the order blocks will be handed out (and cached ones evicted)."""
        b = self._head
        while b != _NONE:
            yield b
            b = self._next[b]

    def append(self, block_id: int) -> None:
        """Put ``block_id`` at the tail (it is handed out last: the most recently freed)."""
        self._check(block_id)
        if self._in[block_id]:
            raise BlockError(f"block {block_id} is already on the free queue")
        self._prev[block_id], self._next[block_id] = self._tail, _NONE
        if self._tail == _NONE:
            self._head = block_id
        else:
            self._next[self._tail] = block_id
        self._tail = block_id
        self._in[block_id] = True
        self._len += 1

    def appendleft(self, block_id: int) -> None:
        """Put ``block_id`` at the head (it is handed out next: a freed block with no cached K/V,
        reused before any cached-free block is evicted)."""
        self._check(block_id)
        if self._in[block_id]:
            raise BlockError(f"block {block_id} is already on the free queue")
        self._prev[block_id], self._next[block_id] = _NONE, self._head
        if self._head == _NONE:
            self._tail = block_id
        else:
            self._prev[self._head] = block_id
        self._head = block_id
        self._in[block_id] = True
        self._len += 1

    def popleft(self) -> int:
        """Take the head: the block handed out next (the least recently freed, after any block put
        at the head)."""
        if self._head == _NONE:
            raise BlockError("the free queue is empty")
        block_id = self._head
        self.remove(block_id)
        return block_id

    def remove(self, block_id: int) -> None:
        """Unlink ``block_id`` from wherever it is, in O(1) (a cache hit reviving a cached-free block)."""
        self._check(block_id)
        if not self._in[block_id]:
            raise BlockError(f"block {block_id} is not on the free queue")
        p, n = self._prev[block_id], self._next[block_id]
        if p == _NONE:
            self._head = n
        else:
            self._next[p] = n
        if n == _NONE:
            self._tail = p
        else:
            self._prev[n] = p
        self._prev[block_id] = self._next[block_id] = _NONE
        self._in[block_id] = False
        self._len -= 1

    def _check(self, block_id: int) -> None:
        if not (type(block_id) is int and 0 <= block_id < self.num_blocks):
            raise BlockError(f"block id must be an int in 0..{self.num_blocks - 1}, got {block_id!r}")

    def __repr__(self) -> str:
        return f"FreeBlockQueue({list(self)!r:.80})"
