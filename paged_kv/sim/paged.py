"""Paging in the simulator: fixed-size blocks of KV slots allocated on demand (vLLM paper §4.2).

A request holds ``ceil(L / BS)`` blocks, a new one only when its last is full, and admission
keeps vLLM's 1% watermark of blocks free.  The same interface as the Orca baselines
(:mod:`paged_kv.sim.contiguous`), so the simulator's scheduler is the same for all of them.

Token timing is the base class's (:mod:`paged_kv.sim.memory_policy`).  Legend: BS block size,
NB number of blocks, L tokens of a request.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..defaults import BLOCK_SIZE, MAX_SEQ_LEN, WATERMARK
from ..errors import BlockError, ConfigError, OutOfBlocksError
from ..validate import count, real
from .memory_policy import MemoryPolicy

__all__ = ["PagedPolicy"]


class PagedPolicy(MemoryPolicy):
    """Blocks of ``block_size`` slots allocated on demand, as vLLM's block manager (paper §4.2).

    A request holds ``ceil(L / BS)`` blocks, so at most ``BS - 1`` of its slots hold no token.
    Physical block ids come from a FIFO free list (as :class:`paged_kv.blocks.BlockAllocator`).
    Slots past the last whole block (``pool_slots % BS``) can never be used: they count as
    external fragmentation.

    Why not drive :class:`paged_kv.blocks.BlockSpaceManager` (chapter 5) itself: it is exact but
    per token.  Its ``can_append`` + ``append_slot`` are two Python calls per token per request
    (~1.7 us each here), and the 10,000-request ShareGPT-like benchmark generates ~3.4 million
    tokens: over 10 s of calls alone.  Here a step costs O(1) plus one operation per *new block*:
    running requests are bucketed by the step residue (mod BS) at which their last block fills,
    ``(admit_step - prompt_len) % BS``, so a step touches only the bucket needing a block now.
    The block counts, tables and bound are the same (the tests check the bound at every step).

    Args:
        block_size: slots per block (BS), default 16 as in vLLM.
        watermark: fraction of blocks admission keeps free (vLLM's default 0.01), so running
            requests can grow without being preempted at once.
    """

    name = "paged"

    def __init__(self, pool_slots: int, max_seq_len: int = MAX_SEQ_LEN, block_size: int = BLOCK_SIZE,
                 watermark: float = WATERMARK) -> None:
        super().__init__(pool_slots, max_seq_len)
        self.block_size = count("block_size", block_size)
        if self.block_size > self.pool_slots:
            raise ConfigError(f"block_size must be an int in [1, pool_slots={self.pool_slots}], got {block_size!r}")
        watermark = real("watermark", watermark, 0.0, 1.0, high_open=True)
        self.num_blocks = self.pool_slots // self.block_size
        self.leftover = self.pool_slots - self.num_blocks * self.block_size
        self.watermark_blocks = int(watermark * self.num_blocks)
        self._free: deque[int] = deque(range(self.num_blocks))
        self.tables: dict[int, list[int]] = {}  # rid -> block table (logical -> physical id)
        self._bucket: list[set[int]] = [set() for _ in range(self.block_size)]

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def fits(self, prompt_len, output_len):
        return (prompt_len + output_len <= self.max_seq_len
                and self.blocks_for(prompt_len + output_len) <= self.num_blocks
                and self.blocks_for(prompt_len + 1) <= self.num_blocks - self.watermark_blocks)

    def admission_need(self, prompt_len, output_len, rid=None):
        return self.blocks_for(prompt_len + 1) * self.block_size

    def can_admit(self, prompt_len, output_len, rid=None):
        return len(self._free) - self.blocks_for(prompt_len + 1) >= self.watermark_blocks

    def shortfall(self, step):
        return max(0, len(self._bucket[step % self.block_size]) - len(self._free))

    def admit(self, rid, prompt_len, output_len, step):
        n = self.blocks_for(prompt_len + 1)
        if n > len(self._free):
            raise OutOfBlocksError(n, len(self._free), f"request {rid}")
        self._add(rid, prompt_len, output_len, step, n * self.block_size)
        self.tables[rid] = [self._free.popleft() for _ in range(n)]
        self._bucket[(step - prompt_len) % self.block_size].add(rid)

    def append(self, step):
        bs, seqs, free = self.block_size, self._seqs, self._free
        bucket = self._bucket[step % bs]
        if len(bucket) > len(free):
            raise OutOfBlocksError(len(bucket), len(free), f"step {step} (preempt first)")
        for rid in bucket:
            table = self.tables[rid]
            table.append(free.popleft())
            final, alloc = seqs[rid][1], len(table) * bs
            self.sum_alloc += bs
            self.sum_cap += min(alloc, final) - min(alloc - bs, final)
        super().append(step)

    def free(self, rid):
        if rid not in self.tables:
            raise BlockError(f"request {rid} is not running")
        p, _, s0 = self._seqs[rid]
        table = self.tables.pop(rid)
        self._remove(rid, len(table) * self.block_size)
        self._bucket[(s0 - p) % self.block_size].discard(rid)
        self._free.extend(table)

    def split_free(self, head_need):
        return self.leftover, len(self._free) * self.block_size

    def owned_slots(self):
        bs = self.block_size
        off = np.arange(bs, dtype=np.int64)
        return {rid: (np.asarray(t, np.int64)[:, None] * bs + off).reshape(-1) for rid, t in self.tables.items()}

    def free_runs(self, head_need):
        bs = self.block_size
        runs = [(b * bs, bs, False) for b in self._free]
        if self.leftover:
            runs.append((self.num_blocks * bs, self.leftover, True))
        return runs

    def borders(self):
        """Every block's first slot, and the unusable tail's."""
        return np.arange(0, self.pool_slots, self.block_size, dtype=np.int64)

    def check(self, head_need=None):
        """As :meth:`MemoryPolicy.check`, plus: each request wastes at most ``BS - 1`` slots."""
        super().check(head_need)
        for rid, table in self.tables.items():
            waste = len(table) * self.block_size - self.length(rid)
            if not 0 <= waste <= self.block_size - 1:
                raise BlockError(f"request {rid} holds {len(table)} blocks for {self.length(rid)} "
                                 f"tokens: {waste} empty slots, bound is {self.block_size - 1}")
