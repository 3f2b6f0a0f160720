"""Sharing in the simulator (vLLM paper §4.4 and §6.3): requests that run several sequences,
``n`` parallel samples or ``k`` beams, the blocks they share, the paper's Figure 15 metric
(:func:`memory_saving`), and the two policies that let :func:`paged_kv.sim.simulate` serve them:
:class:`SharedPagedPolicy` (the paged pool, with sharing) and :class:`GroupContiguousPolicy` (the
Orca baselines, a region per sequence).

Every sequence of a request has the same length ``L`` (prompt ``P`` + tokens generated so far).
How many physical blocks of ``BS`` slots the request holds (:func:`group_blocks`):

* **no sharing** (each sequence its own copy of everything, as a contiguous cache must):
  ``width * ceil(L / BS)``;
* **parallel sampling**: the prompt's *full* blocks are shared by all ``n``; once the samples
  write (``L > P``), each owns its blocks from the prompt's partial block on (the partial one is
  copied on each write but the last holder's): ``P // BS + n * (ceil(L / BS) - P // BS)``; before
  any write the whole prompt is shared, ``ceil(P / BS)``;
* **beam search**: beams *coalesce*: at any step all ``k`` beams descend from one beam a few
  tokens back, so they share every full block of their common prefix ``c = max(P, L - d)`` and own
  the rest: ``c // BS + k * (ceil(L / BS) - c // BS)``.  ``d``, the divergence depth, is a model
  (the true beam tree is random, and its depth varies with the model and the request): chapter 6
  measures it on the tiny model's beam search and borrows it for OPT-13B, an assumption it tests
  by running other depths.

Both sharing formulas are :func:`~paged_kv.blocks.group_blocks_held`, the block layer's one formula.

Legend: P prompt tokens, L tokens per sequence, BS block size, n/k (``width``) sequences per
request, d divergence depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks.block_table import group_blocks_held
from ..defaults import BLOCK_SIZE, MAX_SEQ_LEN, WATERMARK
from ..errors import BlockError, ConfigError, OutOfBlocksError
from ..validate import count, real
from .contiguous import ORCA_POLICIES, ContiguousPolicy
from .memory_policy import MemoryPolicy
from .traces import Trace

__all__ = ["MODES", "PAPER_SHARING", "GroupContiguousPolicy", "SharedPagedPolicy", "Sharing", "group_blocks",
           "memory_saving"]

MODES = ("none", "parallel", "beam")

# What the vLLM paper prints about sharing (§6.3, OPT-13B on one A100-40GB).  Cited facts, not
# results of this package.  "saving": the text's range for each row (Alpaca and ShareGPT), whose
# ends are the smallest and the largest width.  "fig15": Fig. 15 (Alpaca only) prints the value of
# each bar, widths 2, 4 and 6; its ends round to the text's range.
PAPER_SHARING = {
    "citation": "Kwon et al., SOSP 2023, §6.3 and Figs. 14-15",
    "saving": {("Alpaca-like", "parallel"): (0.061, 0.098), ("Alpaca-like", "beam"): (0.376, 0.552),
               ("ShareGPT-like", "parallel"): (0.162, 0.305), ("ShareGPT-like", "beam"): (0.443, 0.663)},
    "fig15": {("Alpaca-like", "parallel"): (0.0609, 0.0853, 0.0979),
              ("Alpaca-like", "beam"): (0.3756, 0.5313, 0.5516)},
    "widths": (2, 4, 6),
    # Fig. 14, Alpaca: vLLM's gain over Orca (Oracle) in sustainable request rate.
    "gain_over_oracle": {"basic sampling": 1.3, "beam search, k = 6": 2.3},
}


@dataclass(frozen=True)
class Sharing:
    """How the sequences of every request of a run share blocks.

    Attributes:
        mode: ``"parallel"`` (n samples of one prompt), ``"beam"`` (k beams), or ``"none"`` (the
            same ``width`` sequences, nothing shared).
        width: sequences per request (n or k), >= 1.
        divergence: beams only: tokens at the end of the beams that they do not all share (d).
    """

    mode: str = "parallel"
    width: int = 1
    divergence: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {self.mode!r}")
        object.__setattr__(self, "width", count("width (sequences per request)", self.width, 1))
        object.__setattr__(self, "divergence", count("divergence (tokens)", self.divergence, 0))

    def unshared(self) -> "Sharing":
        """The same sequences with nothing shared."""
        return Sharing("none", self.width)

    def common_prefix(self, prompt_len, length):
        """``c``, the tokens all sequences have in common (parallel: the prompt; beams:
        ``max(P, L - d)``), whose full blocks they share; broadcasts over numpy arrays."""
        return prompt_len if self.mode == "parallel" else np.maximum(prompt_len, length - self.divergence)


def group_blocks(prompt_len, length, sharing: Sharing, block_size: int) -> np.ndarray:
    """Blocks a request holds when each of its ``sharing.width`` sequences has ``length`` tokens
    (the module docstring's formulas, by :func:`~paged_kv.blocks.group_blocks_held`);
    ``prompt_len`` and ``length`` broadcast (numpy arrays)."""
    bs = count("block_size", block_size, 1)
    P = np.asarray(prompt_len, dtype=np.int64)
    L = np.asarray(length, dtype=np.int64)
    if np.any(L < P) or np.any(P < 1):
        raise ConfigError("lengths must be >= their prompts >= 1 token")
    if sharing.mode == "none" or sharing.width == 1:
        return sharing.width * -(-L // bs)
    return group_blocks_held(sharing.common_prefix(P, L), L, sharing.width, bs)


def memory_saving(trace: Trace, sharing: Sharing, block_size: int = BLOCK_SIZE) -> float:
    """The vLLM paper's Figure 15 metric on ``trace``, "the number of blocks we saved by sharing
    divided by the number of total blocks without sharing": 1 - (blocks held with sharing) /
    (blocks held without), summed over every step of every request, from the step a request is
    admitted (``P + 1`` tokens per sequence) to its last (``P + O``).  Each step weighs the same
    (the ratio of time averages when steps take equal time).
    """
    if not isinstance(trace, Trace):
        raise ConfigError(f"trace must be a paged_kv.sim.Trace, got {type(trace).__name__}")
    P, O = trace.prompt_len.astype(np.int64), trace.output_len.astype(np.int64)
    prompts = np.repeat(P, O)                                            # one entry per step
    steps = np.arange(O.sum()) - np.repeat(np.cumsum(O) - O, O)          # 0 .. O-1 within a request
    lengths = prompts + 1 + steps
    with_sharing = group_blocks(prompts, lengths, sharing, block_size).sum()
    without = group_blocks(prompts, lengths, sharing.unshared(), block_size).sum()
    return float(1.0 - with_sharing / without)


class SharedPagedPolicy(MemoryPolicy):
    """The paged pool serving requests of ``sharing.width`` sequences that share blocks.

    Block counts follow :func:`group_blocks`; a step costs O(1) plus one operation per request
    whose block count changes at it (requests are bucketed by the step residue, mod BS, at which
    they need new blocks and, for beams, at which a block becomes common to all beams), as
    :class:`~paged_kv.sim.PagedPolicy` does.  Token accounting: ``token_states`` counts the slots
    holding a token (a shared slot once; ``reserved`` is 0, ``internal`` the empty slots of the
    blocks held); :meth:`read_tokens` counts what attention reads, every sequence its whole context
    (shared blocks are read once per sequence); a prompt is prefilled once.  A request the
    simulator preempts comes back with the same sharing structure (as swapping a group out and in
    keeps it), counted from the prompt it first arrived with.  No slot-by-slot layout.
    :meth:`admit` and :meth:`append` raise :class:`~paged_kv.errors.OutOfBlocksError` before any
    change when the free blocks do not suffice.
    """

    def __init__(self, pool_slots: int, max_seq_len: int = MAX_SEQ_LEN, block_size: int = BLOCK_SIZE,
                 sharing: Sharing = Sharing(), watermark: float = WATERMARK) -> None:
        super().__init__(pool_slots, max_seq_len)
        if not isinstance(sharing, Sharing):
            raise ConfigError(f"sharing must be a Sharing, got {sharing!r}")
        self.sharing, self.block_size = sharing, count("block_size", block_size, 1)
        self.name = f"paged ({sharing.mode} x{sharing.width})" if sharing.mode != "none" else f"paged (x{sharing.width})"
        self.num_blocks = self.pool_slots // self.block_size
        self.watermark_blocks = int(real("watermark", watermark, 0.0, 1.0, high_open=True) * self.num_blocks)
        self.free_blocks = self.num_blocks
        self.prompt0: dict[int, int] = {}      # rid -> the prompt it first arrived with
        self.blocks: dict[int, int] = {}
        self.sum_read = 0
        self._grow = [set() for _ in range(self.block_size)]
        self._merge = [set() for _ in range(self.block_size)]

    # --- the formulas, for one request ---------------------------------------------------------
    # Plain-int forms of :func:`group_blocks` and :meth:`Sharing.common_prefix` (the simulator
    # calls them a few times per step and request; through numpy scalars they took 80% of a run).
    # ``tests/sim/test_sim_sharing.py`` checks them against :func:`group_blocks` over a grid.
    def _common(self, p0: int, length: int) -> int:
        return p0 if self.sharing.mode == "parallel" else max(p0, length - self.sharing.divergence)

    def _blocks(self, p0: int, length: int) -> int:
        w, bs = self.sharing.width, self.block_size
        if self.sharing.mode == "none" or w == 1:
            return w * -(-length // bs)
        return group_blocks_held(self._common(p0, length), length, w, bs)

    def _stored(self, p0: int, length: int) -> int:
        """Slots holding a token: the shared full blocks' tokens once, the rest per sequence."""
        w, bs, mode = self.sharing.width, self.block_size, self.sharing.mode
        if mode == "none" or w == 1:
            return w * length
        shared = self._common(p0, length) // bs * bs
        return shared + w * (length - shared)

    def _buckets(self, rid: int) -> tuple[int, int]:
        """Step residues (mod BS) at which ``rid`` may take new blocks, and (beams) merge one."""
        p, _, s0 = self._seqs[rid]
        return (s0 - p) % self.block_size, (s0 - p - 1 + self.sharing.divergence) % self.block_size

    # --- "can I?" ------------------------------------------------------------------------------
    def fits(self, prompt_len, output_len):
        return (prompt_len + output_len <= self.max_seq_len
                and self._blocks(prompt_len, prompt_len + output_len) <= self.num_blocks
                and self._blocks(prompt_len, prompt_len + 1) <= self.num_blocks - self.watermark_blocks)

    def admission_need(self, prompt_len, output_len, rid=None):
        return self._blocks(self.prompt0.get(rid, prompt_len), prompt_len + 1) * self.block_size

    def can_admit(self, prompt_len, output_len, rid=None):
        need = self._blocks(self.prompt0.get(rid, prompt_len), prompt_len + 1)
        return self.free_blocks - need >= self.watermark_blocks

    def _step_deltas(self, step: int) -> dict[int, int]:
        """Blocks each touched request takes (> 0) or gives back (< 0) growing at ``step``."""
        r = step % self.block_size
        out = {}
        for rid in self._grow[r] | self._merge[r]:
            p, _, s0 = self._seqs[rid]
            old = p + 1 + (step - 1) - s0                 # tokens per sequence before this step
            p0 = self.prompt0[rid]
            out[rid] = self._blocks(p0, old + 1) - self._blocks(p0, old)
        return out

    def shortfall(self, step):
        return max(0, sum(self._step_deltas(step).values()) - self.free_blocks)

    # --- "do it" -------------------------------------------------------------------------------
    def prefill_tokens(self, prompt_len: int) -> int:
        return prompt_len                      # one prefill serves every sequence of the request

    def read_tokens(self) -> int:
        return self.sum_read

    def admit(self, rid, prompt_len, output_len, step):
        p0 = self.prompt0.setdefault(rid, prompt_len)
        n = self._blocks(p0, prompt_len + 1)
        if n > self.free_blocks:
            raise OutOfBlocksError(n, self.free_blocks, f"request {rid}")
        self._add(rid, prompt_len, output_len, step, n * self.block_size)
        self.sum_len += self._stored(p0, prompt_len + 1) - (prompt_len + 1)   # _add counted one sequence
        self.sum_cap = self.sum_len
        self.sum_read += self.sharing.width * (prompt_len + 1)
        self.free_blocks -= n
        self.blocks[rid] = n
        grow, merge = self._buckets(rid)
        self._grow[grow].add(rid)
        if self.sharing.mode == "beam" and self.sharing.width > 1:
            self._merge[merge].add(rid)

    def append(self, step):
        deltas = self._step_deltas(step)
        need = sum(deltas.values())
        if need > self.free_blocks:
            raise OutOfBlocksError(need, self.free_blocks, f"step {step} (preempt first)")
        before = {rid: self._stored(self.prompt0[rid], self.length(rid)) for rid in deltas}
        self._now = step                        # every sequence grows by one token
        w = self.sharing.width
        self.sum_len += w * (self.num_seqs - len(deltas))          # untouched: their tails grow
        self.sum_len += sum(self._stored(self.prompt0[rid], self.length(rid)) - before[rid] for rid in deltas)
        self.sum_cap = self.sum_len
        self.sum_read += w * self.num_seqs
        for rid, d in deltas.items():
            self.blocks[rid] += d
            self.free_blocks -= d
            self.sum_alloc += d * self.block_size

    def free(self, rid):
        if rid not in self.blocks:
            raise BlockError(f"request {rid} is not running")
        grow, merge = self._buckets(rid)
        L = self.length(rid)
        stored = self._stored(self.prompt0[rid], L)
        n = self.blocks.pop(rid)
        self._remove(rid, n * self.block_size)
        self.sum_len += L - stored              # _remove took off one sequence's tokens
        self.sum_cap = self.sum_len
        self.sum_read -= self.sharing.width * L
        self.free_blocks += n
        self._grow[grow].discard(rid)
        self._merge[merge].discard(rid)

    # --- reading -------------------------------------------------------------------------------
    def split_free(self, head_need):
        return self.pool_slots - self.num_blocks * self.block_size, self.free_blocks * self.block_size

    def owned_slots(self):
        raise ConfigError("SharedPagedPolicy keeps block counts, not a slot-by-slot layout")

    def free_runs(self, head_need):
        raise ConfigError("SharedPagedPolicy keeps block counts, not a slot-by-slot layout")

    def check(self, head_need=None):
        """Block counts agree with the formulas; free + used = the pool; the sums did not drift
        (a :class:`~paged_kv.errors.BlockError` names the first disagreement)."""
        for rid in self._seqs:
            expect = self._blocks(self.prompt0[rid], self.length(rid))
            if self.blocks[rid] != expect:
                raise BlockError(f"request {rid} holds {self.blocks[rid]} blocks, expected {expect}")
        used = sum(self.blocks.values())
        if self.free_blocks + used != self.num_blocks or self.sum_alloc != used * self.block_size:
            raise BlockError(f"free {self.free_blocks} + used {used} blocks != {self.num_blocks}")
        stored = sum(self._stored(self.prompt0[r], self.length(r)) for r in self._seqs)
        read = self.sharing.width * sum(self.length(r) for r in self._seqs)
        if (stored, read) != (self.sum_len, self.sum_read):
            raise BlockError(f"running sums drifted: stored {self.sum_len} vs {stored}, read {self.sum_read} vs {read}")


class GroupContiguousPolicy(ContiguousPolicy):
    """An Orca baseline serving requests of ``width`` sequences: each sequence reserves its own
    region by the rule of ``base`` (``"max"``, ``"pow2"`` or ``"oracle"``), nothing is shared, and
    each sequence prefills its own copy of the prompt.  The ``width`` regions of a request are
    placed as one region of ``width`` times the size (the same slots reserved; placement may differ
    from ``width`` separate holes).  No slot-by-slot layout of the tokens.
    """

    def __init__(self, pool_slots: int, max_seq_len: int = MAX_SEQ_LEN, base: str = "oracle", width: int = 1,
                 placement: str = "first-fit") -> None:
        if base not in ("max", "pow2", "oracle"):
            raise ConfigError(f"base must be 'max', 'pow2' or 'oracle', got {base!r}")
        super().__init__(pool_slots, max_seq_len, placement=placement)
        self.width = count("width (sequences per request)", width, 1)
        self.rule = ORCA_POLICIES[base](pool_slots, max_seq_len)
        self.name = f"{self.rule.name} x{self.width}"

    def reservation(self, prompt_len, output_len):
        return self.width * self.rule.reservation(prompt_len, output_len)

    def fits(self, prompt_len, output_len):
        return prompt_len + output_len <= self.max_seq_len and self.reservation(prompt_len, output_len) <= self.pool_slots

    def prefill_tokens(self, prompt_len: int) -> int:
        return self.width * prompt_len

    def _add(self, rid, p, o, step, alloc):
        super()._add(rid, p, o, step, alloc)
        w = self.width
        self.sum_len += (w - 1) * (p + 1)
        self.sum_cap += min(alloc, w * (p + o)) - min(alloc, p + o)

    def _remove(self, rid, alloc):
        p, final, _ = self._seqs[rid]
        L, w = self.length(rid), self.width
        super()._remove(rid, alloc)
        self.sum_len -= (w - 1) * L
        self.sum_cap -= min(alloc, w * final) - min(alloc, final)

    def append(self, step):
        super().append(step)
        self.sum_len += (self.width - 1) * self.num_seqs

    def owned_slots(self):
        raise ConfigError("GroupContiguousPolicy keeps region sizes, not where each token is")
