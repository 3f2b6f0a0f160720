"""Greedy speculative decoding's KV side, replayed exactly without a model (chapter 9).

For greedy decoding the verified output *is* the target's greedy continuation (Leviathan et al.,
"Fast Inference from Transformers via Speculative Decoding", ICML 2023, §2.3 with temperature 0):
given that continuation, recorded once, every step of speculation follows from the proposer and
the block manager alone.  :func:`replay_speculation` runs those steps through a real
:class:`~paged_kv.blocks.BlockSpaceManager`:

1. **propose**: the proposer drafts ``k`` tokens after the sequence so far, at most one fewer
   than the tokens still to emit (the pass's own token is the last);
2. **verify**: the pass feeds the tokens whose K/V is not yet written (the whole prompt at the
   first step, then the last emitted token) and the ``k`` drafts; the manager appends a slot for
   each (the drafts' *lookahead slots*, vLLM's term), taking new blocks where they cross a block
   boundary;
3. **accept/reject**: the longest draft prefix equal to the target's next tokens is kept
   (:func:`~paged_kv.spec_decode.acceptance.accept_greedy`), plus the target's own token;
4. **rollback**: :meth:`~paged_kv.blocks.BlockSpaceManager.truncate` takes back the rejected
   drafts' slots; blocks wholly past the cut go back to the free queue.

Each step is recorded as a frozen :class:`SpecStep` (plain data: ints and tuples), so the static
book draws it with no live objects (:mod:`paged_kv.viz.spec_decode`).  The target passes and
counts equal :func:`paged_kv.decoding.speculative_greedy`'s, which runs the model
(``tests/spec_decode/test_replay.py`` checks it on the tiny model).

Slot convention (vLLM's): a sequence holds slots for the tokens whose K/V is written; the last
emitted token has none until the next pass feeds it.  A full replay of a ``P``-token prompt and
``N`` target tokens therefore peaks at ``P + N - 1`` slots (the last pass), and needs
``ceil((P + N - 1) / BS)`` blocks whatever the proposer drafts.

Legend: P prompt tokens, N target tokens, k draft tokens, BS block size.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Sequence

from ..blocks import BlockSpaceManager, blocks_needed
from ..errors import BlockError, ConfigError, OutOfBlocksError, PromptError
from ..validate import count
from .acceptance import accept_greedy

__all__ = ["PHASES", "SlotState", "SpecStep", "SpeculationTrace", "replay_speculation"]

SEQ_ID = 0
PHASES = ("propose", "verify", "accept", "rollback")   # a step's four moments, in order


class SlotState(str, Enum):
    """What a slot of a block table holds at one phase of a step (a ``str``, so plain data
    compares with ``"verified"`` as well).

    ``VERIFIED``: K/V of a verified token (prompt or output); ``DRAFT``: K/V of a draft token not
    yet checked; ``ACCEPTED``: a draft the target agreed with (kept); ``REJECTED``: a draft the
    target disagreed with (its K/V written, then rolled back); ``FREE``: a slot of a held block
    that holds nothing (the next tokens go there).
    """

    VERIFIED = "verified"
    DRAFT = "draft"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    FREE = "free"


@dataclass(frozen=True)
class SpecStep:
    """One target pass: propose, verify, accept/reject, rollback.

    Attributes:
        index: the step, from 0; ``passes == index + 1``.
        num_computed: tokens whose K/V was written before the pass (slots held, tokens).
        num_fed: verified tokens the pass feeds before the drafts (the prompt at step 0, then 1).
        drafted: the ``k`` draft token ids (``k >= 0``).
        accepted: how many of them the target kept (``0 <= accepted <= k``).
        emitted: the tokens the step adds to the output: ``drafted[:accepted]`` and the target's
            own token (``accepted + 1`` of them).
        table_before, table_verify, table_after: the block table (physical ids, logical order)
            before the pass, after the lookahead slots are appended, after the rollback.
        new_blocks: ids taken from the free queue for the pass, in logical order.
        written_slots: physical slots written by the pass, in position order (``num_fed + k``).
        discarded_slots: the rejected drafts' slots, written and then rolled back (``k - accepted``).
        freed_blocks: ids the rollback sent back to the free queue, in the order they went (the
            last logical block first, :meth:`BlockSpaceManager.truncate`).
        free_queue: the free queue after the rollback, in the order the pool hands blocks out.
        passes: target passes so far, this one included.
    """

    index: int
    num_computed: int
    num_fed: int
    drafted: tuple[int, ...]
    accepted: int
    emitted: tuple[int, ...]
    table_before: tuple[int, ...]
    table_verify: tuple[int, ...]
    table_after: tuple[int, ...]
    new_blocks: tuple[int, ...]
    written_slots: tuple[int, ...]
    discarded_slots: tuple[int, ...]
    freed_blocks: tuple[int, ...]
    free_queue: tuple[int, ...]
    passes: int
    block_size: int

    @property
    def rejected(self) -> int:
        """Draft tokens the target disagreed with (their slots rolled back)."""
        return len(self.drafted) - self.accepted

    @property
    def num_kept(self) -> int:
        """Slots held after the rollback: the verified tokens with K/V written."""
        return self.num_computed + self.num_fed + self.accepted

    @property
    def freed_positions(self) -> tuple[int, ...]:
        """Where each freed block now sits in :attr:`free_queue` (0: handed out next)."""
        return tuple(self.free_queue.index(b) for b in self.freed_blocks)

    def slot_states(self, phase: str) -> tuple[tuple[SlotState, ...], ...]:
        """Per block of the phase's table, per offset, what the slot holds.

        ``"propose"``: :attr:`table_before` (verified and free slots); ``"verify"``:
        :attr:`table_verify` with the drafts unchecked; ``"accept"``: the same table, each draft
        accepted or rejected; ``"rollback"``: :attr:`table_after`, the accepted drafts kept (as
        ``ACCEPTED``) and the rolled-back slots free again.

        Raises:
            ConfigError: ``phase`` not one of :data:`PHASES`.
        """
        if phase not in PHASES:
            raise ConfigError(f"phase must be one of {PHASES}, got {phase!r}")
        bs, k = self.block_size, len(self.drafted)
        verified = self.num_computed + (0 if phase == "propose" else self.num_fed)
        draft_end = verified + (self.accepted if phase == "rollback" else k if phase != "propose" else 0)
        table = {"propose": self.table_before, "rollback": self.table_after}.get(phase, self.table_verify)

        def state(p: int) -> SlotState:
            if p < verified:
                return SlotState.VERIFIED
            if p >= draft_end:
                return SlotState.FREE
            if phase == "verify":
                return SlotState.DRAFT
            return SlotState.ACCEPTED if p - verified < self.accepted else SlotState.REJECTED

        return tuple(tuple(state(i * bs + o) for o in range(bs)) for i in range(len(table)))


@dataclass(frozen=True)
class SpeculationTrace:
    """A replay of greedy speculative decoding: its steps and totals.

    Attributes:
        prompt_ids: the prompt (P tokens).
        output_ids: the tokens emitted, in order (a prefix of the target's continuation; all of it
            unless ``max_steps`` stopped the replay).
        steps: one :class:`SpecStep` per target pass.
        block_size, num_blocks: the pool (tokens per block, blocks).
    """

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    steps: tuple[SpecStep, ...]
    block_size: int
    num_blocks: int

    @property
    def passes(self) -> int:
        """Target passes (plain greedy decoding needs one per output token)."""
        return len(self.steps)

    @property
    def drafted(self) -> int:
        return sum(len(s.drafted) for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def rolled_back(self) -> int:
        """Draft slots written and then discarded (``drafted - accepted``)."""
        return sum(len(s.discarded_slots) for s in self.steps)

    @property
    def acceptance_rate(self) -> float | None:
        """``accepted / drafted``; ``None`` when nothing was drafted (a rate of nothing)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_pass(self) -> float:
        """Output tokens per target pass (1 without speculation, at most ``k + 1``)."""
        return len(self.output_ids) / self.passes if self.steps else 0.0

    @property
    def blocks_freed(self) -> int:
        """Blocks taken for draft slots and given back at rollback, over all steps."""
        return sum(len(s.freed_blocks) for s in self.steps)


def _token_ids(name: str, ids) -> tuple[int, ...]:
    try:
        out = tuple(ids)
    except TypeError:
        raise PromptError(f"{name} must be a sequence of token ids, got {ids!r:.60}") from None
    if not out:
        raise PromptError(f"{name} is empty")
    bad = [t for t in out if not isinstance(t, int) or isinstance(t, bool) or t < 0]
    if bad:
        raise PromptError(f"{name} must hold ints >= 0, got {bad[:4]!r}")
    return out


def replay_speculation(prompt_ids: Sequence[int], target_ids: Sequence[int], proposer, *, block_size: int,
                       num_blocks: int, max_steps: int | None = None,
                       free_order: Sequence[int] | None = None, draft_at_prefill: bool = False) -> SpeculationTrace:
    """Replay greedy speculative decoding of ``target_ids`` after ``prompt_ids`` through a block
    manager, step by step (see the module docstring for the four phases).

    Args:
        prompt_ids: the prompt's token ids (P >= 1).
        target_ids: the target model's greedy continuation (N >= 1 tokens): what plain greedy
            decoding emits, and so what greedy speculation emits too.
        proposer: anything with ``propose(token_ids, limit=...) -> list[int]``, e.g.
            :class:`~paged_kv.spec_decode.ngram.NgramProposer`; asked with ``limit`` = the tokens
            still to emit minus one.
        block_size: tokens per block (BS).
        num_blocks: blocks in the pool; a full replay needs ``ceil((P + N - 1) / BS)``.
        max_steps: stop after this many target passes (default: until all N tokens are out).
        free_order: the pool's initial free-queue order (:class:`~paged_kv.blocks.BlockAllocator`).
        draft_at_prefill: whether the first pass, the prompt's prefill, carries drafts too.  Off by
            default, as the engine (:class:`~paged_kv.scheduling.Scheduler` drafts for decoding
            sequences only) and vLLM v1 run it: the prefill samples one token, drafts start with
            the second pass.  On, it replays :func:`~paged_kv.decoding.speculative_greedy`, the
            no-cache loop whose every pass, the first included, runs the sequence and a draft.

    Returns:
        a :class:`SpeculationTrace`.

    Raises:
        PromptError: an empty prompt or target, or ids that are not ints >= 0.
        ConfigError: a bad ``block_size``/``num_blocks``/``max_steps``/``free_order``/``draft_at_prefill``;
            a proposer without ``propose``, or one that returns more than ``limit`` tokens or non-int ids.
        BlockError: the pool cannot hold a pass's slots (the message names the step, the slots
            and the blocks needed and held).
    """
    prompt = _token_ids("prompt_ids", prompt_ids)
    target = _token_ids("target_ids", target_ids)
    if not callable(getattr(proposer, "propose", None)):
        raise ConfigError(f"proposer must have a propose(token_ids, limit=...) method, got {proposer!r:.60}")
    max_steps = None if max_steps is None else count("max_steps", max_steps, 1)
    if not isinstance(draft_at_prefill, bool):
        raise ConfigError(f"draft_at_prefill must be True or False, got {draft_at_prefill!r}")
    manager = BlockSpaceManager(num_blocks, block_size, free_order=free_order)
    bs = manager.block_size
    seq, out, steps = list(prompt), [], []
    computed = 0                                      # tokens whose K/V is written (slots held)
    while len(out) < len(target) and (max_steps is None or len(steps) < max_steps):
        limit = len(target) - len(out) - 1
        draft = list(proposer.propose(list(seq), limit=limit)) if computed or draft_at_prefill else []
        if len(draft) > limit or any(not isinstance(t, int) or isinstance(t, bool) for t in draft):
            raise ConfigError(f"the proposer returned {draft[:8]!r} for limit {limit}: at most {limit} int ids")
        fed = len(seq) - computed                     # the prompt at step 0, then the last emitted token
        before = manager.block_ids(SEQ_ID) if computed else ()
        positions = fed + len(draft)
        try:
            if computed:
                manager.append_slots(SEQ_ID, positions)
            else:
                manager.allocate(SEQ_ID, positions)
        except OutOfBlocksError:
            need = blocks_needed(computed + positions, bs)
            raise BlockError(f"step {len(steps)}: {computed + positions} slots ({computed} held + {fed} fed + "
                             f"{len(draft)} drafts) need {need} blocks of {bs} tokens; the pool has {manager.num_blocks} "
                             f"(a full replay needs {blocks_needed(len(prompt) + len(target) - 1, bs)})") from None
        verify = manager.block_ids(SEQ_ID)
        slots = tuple(manager.slot_mapping(SEQ_ID, computed, computed + positions))
        truth = list(target[len(out):len(out) + len(draft) + 1])
        kept = accept_greedy(draft, truth)
        accepted = len(kept) - 1
        keep = computed + fed + accepted
        freed = tuple(manager.truncate(SEQ_ID, keep))
        steps.append(SpecStep(len(steps), computed, fed, tuple(draft), accepted, tuple(kept), tuple(before),
                              tuple(verify), manager.block_ids(SEQ_ID), tuple(b for b in verify if b not in before),
                              slots, slots[fed + accepted:], freed, tuple(manager.allocator.free_list()),
                              len(steps) + 1, bs))
        seq += kept
        out += kept
        computed = keep
    manager.check()
    return SpeculationTrace(prompt, tuple(out), tuple(steps), bs, manager.num_blocks)
