"""The Orca baselines of the vLLM paper (§6.1): one contiguous region of KV slots per request.

A *slot* holds one token's keys and values for every layer (OPT-13B in fp16: 819,200 bytes).
The three baselines differ only in the region they reserve at admission: the model's maximum
length (:class:`OrcaMax`), the prompt plus the next power of two of the true output length
(:class:`OrcaPow2`), or exactly prompt + output (:class:`OrcaOracle`, which knows the future).
Regions are placed by a real allocator (:mod:`paged_kv.sim.buddy`): by default the binary buddy
allocator the paper assumes for Orca, or exact-size first-fit/best-fit over a hole list (stronger
than the paper's baseline), so external fragmentation happens as it would.  The paged policy
they are compared with is :mod:`paged_kv.sim.paged`; the classification of memory (the paper's
Fig. 2) is the base class's, :class:`~paged_kv.sim.memory_policy.MemoryPolicy`.
"""

from __future__ import annotations

import numpy as np

from ..defaults import MAX_SEQ_LEN
from ..errors import BlockError, ConfigError
from .buddy import PLACEMENTS, BuddyAllocator, HoleList, next_pow2
from .memory_policy import MemoryPolicy

__all__ = ["ORCA_POLICIES", "ContiguousPolicy", "OrcaMax", "OrcaOracle", "OrcaPow2"]


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


ORCA_POLICIES = {"max": OrcaMax, "pow2": OrcaPow2, "oracle": OrcaOracle}
