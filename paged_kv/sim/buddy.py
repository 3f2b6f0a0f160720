"""Where a contiguous region goes: a binary buddy allocator, and the first-/best-fit hole list.

The vLLM paper's Orca baselines place each request's region with the buddy algorithm (§6.1: "we
assume Orca uses the buddy allocation algorithm to determine the memory address to store KV
cache"; §6.5 discusses the consequence).  :class:`BuddyAllocator` is that algorithm (Knowlton
1965; Knuth, TAOCP vol. 1 §2.5): every block is a power of two of slots and starts at a multiple
of its size; a request of ``n`` slots takes a block of ``next_pow2(n)``, split off a larger free
block by halving; a freed block merges with its *buddy* (the other half of its parent,
``start ^ size``) whenever that is free too.  The largest block is the pool's largest region
(the model's maximum length, rounded up to a power of two); a pool that is not a whole number of
such blocks ends in smaller roots (its binary expansion), which never merge with each other.

:class:`HoleList` is the alternative the chapter calls "stronger than the paper's baseline": a
region takes exactly ``n`` slots in a hole of a sorted, coalesced free list (first-fit or best-fit).

Both answer the same questions, so :class:`paged_kv.sim.ContiguousPolicy` can use either:
``block_for(n)`` (slots a region of ``n`` really occupies), ``largest_block`` (the biggest block
that can ever exist), ``can_place(n)``, ``place(n) -> (start, block)``, ``release(start)`` and
``free_runs()``.  All sizes and addresses are in slots.
"""

from __future__ import annotations

import bisect

from ..errors import BlockError, ConfigError, OutOfBlocksError
from ..validate import count

__all__ = ["BuddyAllocator", "HoleList", "PLACEMENTS", "next_pow2"]

PLACEMENTS = ("buddy", "first-fit", "best-fit")


def next_pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 << max(0, int(n) - 1).bit_length()


class BuddyAllocator:
    """A binary buddy allocator over ``pool_slots`` slots whose largest block is ``max_block``.

    ``max_block`` is rounded up to a power of two and capped at the largest power of two that fits
    in the pool.  The pool is cut, from address 0, into *roots*: as many ``max_block`` blocks as
    fit, then the binary expansion of the rest (largest first), so every root starts at a multiple
    of its size.  Free blocks are kept per order (``size = 2**order``) in sets: there are at most
    a few dozen, and the lowest address of an order is taken (``min``), which makes placement
    deterministic.  Why buddy at all: splitting and merging are O(log pool) with no search over
    holes, at the price of rounding every region up to a power of two (up to ~2x).

    Raises:
        ConfigError: ``pool_slots`` or ``max_block`` not an int >= 1.
    """

    name = "buddy"

    def __init__(self, pool_slots: int, max_block: int) -> None:
        self.pool_slots = count("pool_slots", pool_slots)
        top = next_pow2(count("max_block", max_block))
        self.largest_block = min(top, 1 << (self.pool_slots.bit_length() - 1))
        self.roots: list[tuple[int, int]] = []  # (start, size), by address
        start = 0
        while start < self.pool_slots:
            size = min(self.largest_block, 1 << ((self.pool_slots - start).bit_length() - 1))
            self.roots.append((start, size))
            start += size
        self._root_starts = [s for s, _ in self.roots]
        self.free_sets: dict[int, set[int]] = {}  # size -> starts of free blocks of that size
        for s, size in self.roots:
            self.free_sets.setdefault(size, set()).add(s)
        self.allocated: dict[int, int] = {}  # start -> size of each allocated block

    def block_for(self, n: int) -> int:
        """Slots a region of ``n`` slots occupies: ``next_pow2(n)``."""
        return next_pow2(n)

    def _root_size(self, start: int) -> int:
        return self.roots[bisect.bisect_right(self._root_starts, start) - 1][1]

    def _smallest_free(self, size: int) -> int:
        """The smallest free block size ``>= size``, or 0."""
        return min((s for s, starts in self.free_sets.items() if s >= size and starts), default=0)

    def can_place(self, n: int) -> bool:
        return self._smallest_free(self.block_for(n)) > 0

    def place(self, n: int) -> tuple[int, int]:
        """Allocate a block for ``n`` slots; returns ``(start, block size)``.

        Takes the lowest-addressed free block of the smallest size that fits and halves it until
        it is ``next_pow2(n)``, freeing the upper half at each cut.

        Raises:
            OutOfBlocksError: no free block is large enough (``needed``/``free`` in slots:
                the block size and the largest free block); nothing changes.
        """
        want = self.block_for(count("n (slots)", n))
        size = self._smallest_free(want)
        if not size:
            raise OutOfBlocksError(want, self.largest_free(), "a buddy block (largest free block, in slots)")
        start = min(self.free_sets[size])
        self.free_sets[size].discard(start)
        while size > want:  # split: keep the lower half, free the upper half (its buddy)
            size //= 2
            self.free_sets.setdefault(size, set()).add(start + size)
        self.allocated[start] = size
        return start, size

    def release(self, start: int) -> None:
        """Free the block at ``start`` and merge it with its buddy while the buddy is free.

        Raises:
            BlockError: no allocated block starts at ``start``.
        """
        if start not in self.allocated:
            raise BlockError(f"no allocated buddy block starts at slot {start!r}")
        size = self.allocated.pop(start)
        limit = self._root_size(start)
        while size < limit and (start ^ size) in self.free_sets.get(size, ()):
            self.free_sets[size].discard(start ^ size)
            start, size = min(start, start ^ size), 2 * size
        self.free_sets.setdefault(size, set()).add(start)

    def largest_free(self) -> int:
        return max((s for s, starts in self.free_sets.items() if starts), default=0)

    def free_runs(self) -> list[tuple[int, int]]:
        """Free blocks as ``(start, size)``, by address (two neighbours that are not buddies stay apart)."""
        return sorted((s, size) for size, starts in self.free_sets.items() for s in starts)

    def check(self) -> None:
        """Every invariant of a buddy system, or a :class:`BlockError` naming the first broken one:
        blocks are powers of two aligned to their size inside one root; free and allocated blocks
        tile the pool exactly; no two free buddies are left unmerged."""
        blocks = sorted([(s, n, "free") for s, n in self.free_runs()] +
                        [(s, n, "allocated") for s, n in self.allocated.items()])
        pos = 0
        for s, n, what in blocks:
            if n & (n - 1) or s % n:
                raise BlockError(f"{what} block [{s}, {s + n}) is not a power of two aligned to its size")
            if s != pos:
                raise BlockError(f"{what} block at {s}: slots [{min(s, pos)}, {max(s, pos)}) are "
                                 f"{'lost' if s > pos else 'in two blocks'}")
            if n > self._root_size(s) or s + n > self._root_starts[bisect.bisect_right(self._root_starts, s) - 1] + self._root_size(s):
                raise BlockError(f"{what} block [{s}, {s + n}) crosses a root of the pool")
            pos = s + n
        if pos != self.pool_slots:
            raise BlockError(f"blocks cover {pos} slots, the pool has {self.pool_slots}")
        for size, starts in self.free_sets.items():
            for s in starts:
                if size < self._root_size(s) and (s ^ size) in starts:
                    raise BlockError(f"free buddies [{s}, {s + size}) and [{s ^ size}, {(s ^ size) + size}) not merged")


class HoleList:
    """Exact-size regions in a sorted, coalesced list of ``[start, size]`` holes.

    A list beats a tree here: there are at most running requests + 1 holes (tens), touched only
    at admission and completion, never per token.  ``"first-fit"`` takes the lowest-address hole
    that fits; ``"best-fit"`` the smallest (lowest address on ties).

    Raises:
        ConfigError: an unknown placement, or ``pool_slots`` not an int >= 1.
    """

    def __init__(self, pool_slots: int, placement: str = "first-fit") -> None:
        if placement not in ("first-fit", "best-fit"):
            raise ConfigError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        self.pool_slots = count("pool_slots", pool_slots)
        self.name = placement
        self.largest_block = self.pool_slots
        self.holes: list[list[int]] = [[0, self.pool_slots]]
        self._starts: dict[int, int] = {}  # start -> size of each region

    def block_for(self, n: int) -> int:
        return n

    def _find(self, size: int) -> int:
        best = -1
        for i, (_, hole) in enumerate(self.holes):
            if hole >= size:
                if self.name == "first-fit":
                    return i
                if best < 0 or hole < self.holes[best][1]:
                    best = i
        return best

    def can_place(self, n: int) -> bool:
        return self._find(n) >= 0

    def place(self, n: int) -> tuple[int, int]:
        """Take ``n`` slots from a hole; returns ``(start, n)``.

        Raises:
            OutOfBlocksError: no hole of ``n`` slots (``free`` = the largest hole); nothing changes.
        """
        i = self._find(n)
        if i < 0:
            raise OutOfBlocksError(n, self.largest_free(), "a region (largest hole, in slots)")
        start = self.holes[i][0]
        if self.holes[i][1] == n:
            del self.holes[i]
        else:
            self.holes[i] = [start + n, self.holes[i][1] - n]
        self._starts[start] = n
        return start, n

    def release(self, start: int) -> None:
        """Return the region at ``start`` to the list, merging it with the holes on either side.

        Raises:
            BlockError: no region starts at ``start``.
        """
        if start not in self._starts:
            raise BlockError(f"no region starts at slot {start!r}")
        size = self._starts.pop(start)
        i = bisect.bisect_left(self.holes, [start, 0])
        self.holes.insert(i, [start, size])
        if i + 1 < len(self.holes) and start + size == self.holes[i + 1][0]:  # merge right
            self.holes[i][1] += self.holes.pop(i + 1)[1]
        if i > 0 and self.holes[i - 1][0] + self.holes[i - 1][1] == start:  # merge left
            self.holes[i - 1][1] += self.holes.pop(i)[1]

    def largest_free(self) -> int:
        return max((h for _, h in self.holes), default=0)

    def free_runs(self) -> list[tuple[int, int]]:
        return [(s, n) for s, n in self.holes]

    def check(self) -> None:
        """Holes sorted, apart (coalesced), and with the regions tiling the pool."""
        runs = sorted([(s, n) for s, n in self.holes] + list(self._starts.items()))
        pos = 0
        for s, n in runs:
            if s != pos or n < 1:
                raise BlockError(f"run [{s}, {s + n}) does not start where the last ended ({pos})")
            pos = s + n
        if pos != self.pool_slots:
            raise BlockError(f"runs cover {pos} slots, the pool has {self.pool_slots}")
        for (a, n), (b, _) in zip(self.holes, self.holes[1:]):
            if a + n == b:
                raise BlockError(f"holes at {a} and {b} touch but were not merged")
