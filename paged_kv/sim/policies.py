"""KV memory policies for the simulator: how a serving system hands out KV-cache slots.

A *slot* holds one token's keys and values for every layer (OPT-13B in fp16: 819,200 bytes); the
pool holds ``pool_slots`` of them.  Four policies share one interface, so the scheduler in
:mod:`paged_kv.sim.simulator` is the same for all and only the memory policy differs:

* :class:`OrcaMax`, :class:`OrcaPow2`, :class:`OrcaOracle`: one contiguous region per request,
  reserved at admission for the model's maximum length, for the prompt plus the next power of two
  of the true output length, or for exactly prompt + output (vLLM paper §6.1, the Orca baselines).
  Regions are placed by a real allocator (:mod:`paged_kv.sim.buddy`): by default the binary buddy
  allocator the paper assumes for Orca (§6.1), or exact-size first-fit/best-fit over a free list of
  holes (stronger than the paper's baseline), so external fragmentation happens as it would.
* :class:`PagedPolicy`: fixed-size blocks of ``block_size`` slots allocated on demand, a new block
  only when the last one is full (vLLM paper §4.2), admission gated by vLLM's 1% watermark.

Memory is classified as in the paper's Fig. 2 (token states, reserved, internal and external
fragmentation, free) by the shared base class, :class:`paged_kv.sim.MemoryPolicy`
.

Token timing: a request admitted at step ``s0`` holds ``prompt + 1`` tokens after that step (its
prefill writes the prompt, and the first generated token gets its slot), and one more after each
later step, until it holds ``F`` and is freed.  Legend: BS block size, NB number of blocks.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..defaults import BLOCK_SIZE, MAX_SEQ_LEN, WATERMARK
from ..errors import BlockError, ConfigError, OutOfBlocksError
from ..validate import count, real
from .buddy import PLACEMENTS, BuddyAllocator, HoleList, next_pow2
from .policy import MemoryPolicy

__all__ = ["ContiguousPolicy", "OrcaMax", "OrcaPow2", "OrcaOracle", "PagedPolicy", "POLICIES", "make_policy"]


class ContiguousPolicy(MemoryPolicy):
    """One contiguous region per request, sized by :meth:`reservation`, placed by an allocator.

    Args:
        placement: ``"buddy"`` (the default: a binary buddy allocator whose largest block is
            ``max_seq_len`` rounded up to a power of two, as the paper assumes for Orca, §6.1),
            ``"first-fit"`` (lowest-address hole that fits) or ``"best-fit"`` (smallest hole that
            fits): both exact-size and so *stronger* than the paper's baseline.  See
            :mod:`paged_kv.sim.buddy`.

    With buddy placement a region of ``R`` slots occupies a block of ``next_pow2(R)``; the
    ``block - R`` slots past the reservation hold no token and belong to no request's plan: they
    count as *external fragmentation* (the paper's Fig. 2 puts them under "external fragmentation
    & others", and shows Orca (Oracle) with no internal fragmentation).  Free blocks smaller than
    the block the head of the queue needs count as external too.

    Raises:
        ConfigError: an unknown placement.
    """

    def __init__(self, pool_slots: int, max_seq_len: int = MAX_SEQ_LEN, placement: str = "buddy") -> None:
        super().__init__(pool_slots, max_seq_len)
        if placement not in PLACEMENTS:
            raise ConfigError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        self.placement = placement
        self.space = (BuddyAllocator(self.pool_slots, self.max_seq_len) if placement == "buddy"
                      else HoleList(self.pool_slots, placement))
        self.regions: dict[int, tuple[int, int]] = {}  # rid -> (start, reserved size)
        self.blocks: dict[int, int] = {}  # rid -> slots its block occupies (>= reserved size)
        self.slack = 0  # sum over regions of block - reserved size
        self._memo: tuple = (None, None)

    @property
    def holes(self) -> list[list[int]]:
        """The hole list (first-/best-fit placement only)."""
        return self.space.holes

    def reservation(self, prompt_len: int, output_len: int) -> int:
        raise NotImplementedError

    def fits(self, prompt_len, output_len):
        return (prompt_len + output_len <= self.max_seq_len
                and self.space.block_for(self.reservation(prompt_len, output_len)) <= self.space.largest_block)

    def admission_need(self, prompt_len, output_len, rid=None):
        return self.reservation(prompt_len, output_len)

    def can_admit(self, prompt_len, output_len, rid=None):
        return self.space.can_place(self.reservation(prompt_len, output_len))

    def admit(self, rid, prompt_len, output_len, step):
        if rid in self.regions:
            raise BlockError(f"request {rid} is already running")
        size = self.reservation(prompt_len, output_len)
        start, block = self.space.place(size)  # raises OutOfBlocksError before any change
        self._add(rid, prompt_len, output_len, step, size)
        self.regions[rid], self.blocks[rid] = (start, size), block
        self.slack += block - size
        self._memo = (None, None)

    def free(self, rid):
        if rid not in self.regions:
            raise BlockError(f"request {rid} is not running")
        start, size = self.regions.pop(rid)
        self._remove(rid, size)
        self.slack -= self.blocks.pop(rid) - size
        self.space.release(start)
        self._memo = (None, None)

    def split_free(self, head_need):
        if self._memo[0] == head_need and self._memo[1] is not None:
            return self._memo[1]
        runs = self.space.free_runs()
        total = sum(n for _, n in runs)
        need = None if head_need is None else self.space.block_for(head_need)
        ext = 0 if need is None else sum(n for _, n in runs if n < need)
        self._memo = (head_need, (self.slack + ext, total - ext))
        return self._memo[1]

    def owned_slots(self):
        return {rid: np.arange(s, s + n, dtype=np.int64) for rid, (s, n) in self.regions.items()}

    def free_runs(self, head_need):
        need = None if head_need is None else self.space.block_for(head_need)
        runs = [(s, n, need is not None and n < need) for s, n in self.space.free_runs()]
        slack = [(s + n, self.blocks[rid] - n, True) for rid, (s, n) in self.regions.items()
                 if self.blocks[rid] > n]
        return sorted(runs + slack)

    def check(self, head_need=None):
        """As :meth:`MemoryPolicy.check`, plus the allocator's own invariants (``space.check()``)."""
        super().check(head_need)
        self.space.check()

    def borders(self):
        """Where a region, a buddy block's unused tail, or a free block (a hole) starts."""
        starts = {s for s, _ in self.space.free_runs()} | {0}
        for rid, (s, n) in self.regions.items():
            starts.add(s)
            if self.blocks[rid] > n:
                starts.add(s + n)
        return np.array(sorted(starts), np.int64)


class OrcaMax(ContiguousPolicy):
    """Reserve the model's maximum sequence length for every request (Orca (Max), paper §6.1)."""

    name = "Orca (Max)"

    def reservation(self, prompt_len, output_len):
        return self.max_seq_len


class OrcaPow2(ContiguousPolicy):
    """Reserve prompt + the next power of two of the true output length, at most ``max_seq_len``.

    The paper's Orca (Pow2): "over-reserves the space by at most 2x", e.g. 32 slots for an output
    of 25 tokens (§6.1).
    """

    name = "Orca (Pow2)"

    def reservation(self, prompt_len, output_len):
        return min(self.max_seq_len, prompt_len + next_pow2(output_len))


class OrcaOracle(ContiguousPolicy):
    """Reserve exactly prompt + output: knows the future, the upper bound for contiguous (§6.1)."""

    name = "Orca (Oracle)"

    def reservation(self, prompt_len, output_len):
        return prompt_len + output_len


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


POLICIES = {"max": OrcaMax, "pow2": OrcaPow2, "oracle": OrcaOracle, "paged": PagedPolicy}


def make_policy(name: str, pool_slots: int, max_seq_len: int = MAX_SEQ_LEN, **kwargs) -> MemoryPolicy:
    """A fresh policy by short name: ``"max"``, ``"pow2"``, ``"oracle"`` or ``"paged"``.

    ``kwargs`` go to the class (``placement=`` for contiguous, ``block_size=``/``watermark=`` for
    paged).

    Raises:
        ConfigError: unknown name (the message lists the known ones) or bad arguments.
    """
    if not isinstance(name, str):
        raise ConfigError(f"policy name must be a string, one of {sorted(POLICIES)}; got {name!r}")
    key = name.lower().replace("orca", "").strip(" -_()")
    if key not in POLICIES:
        raise ConfigError(f"unknown policy {name!r}; known: {sorted(POLICIES)}")
    try:
        return POLICIES[key](pool_slots, max_seq_len, **kwargs)
    except TypeError as e:
        raise ConfigError(f"bad arguments for policy {name!r}: {e}") from None
