"""An event history of a block manager, with plain-data snapshots a figure can replay.

:class:`BlockHistory` drives a real :class:`~paged_kv.blocks.BlockSpaceManager` (allocate a
prompt, append a decode token, fork, truncate, free) and after every event records a :class:`Snapshot`:
per physical block its holders (sequence, logical index), tokens filled and ref count, plus every
block table and the free list.  Snapshots hold only ints, strings and tuples, so the static book
rebuilds its figures from them with no live objects (``paged_kv.viz.blocks``).

:func:`paper_trace` replays the vLLM paper's Figures 6 and 7 (§4.3) through the real manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Hashable, Sequence

from ..errors import BlockError
from ..validate import count
from .block_table import BlockTable
from .manager import BlockSpaceManager

# The free-list order under which the real manager hands out the figures' ids (see paper_trace).
PAPER_FREE_ORDER = (7, 1, 3, 5, 2, 0, 4, 6, 8)


@dataclass(frozen=True)
class BlockState:
    """One physical block at one moment.

    Attributes:
        block_id: physical id.
        ref_count: block tables holding it (0 = free).
        holders: ``(seq_id, logical index)`` of each table holding it (empty when free).
        filled: tokens stored in it (0 when free).
        labels: the text of those tokens, when the history knows it.
    """

    block_id: int
    ref_count: int
    holders: tuple[tuple[Hashable, int], ...] = ()
    filled: int = 0
    labels: tuple[str, ...] = ()

    @property
    def owner(self):
        """The first sequence holding the block, or ``None`` if it is free."""
        return self.holders[0][0] if self.holders else None

    @property
    def logical(self) -> int | None:
        return self.holders[0][1] if self.holders else None


@dataclass(frozen=True)
class Event:
    """What happened: ``kind`` is ``"start"``, ``"allocate"``, ``"append"``, ``"fork"``, ``"free"``,
    ``"preempt"`` (freed to be recomputed later) or ``"truncate"`` (rolled back to fewer tokens:
    speculative decoding's rejected draft slots taken back).

    ``new_blocks``: ids taken from the free list; ``freed_blocks``: ids returned to it;
    ``slots``: slots written; ``copies``: copy-on-write ``(src, dst)``; ``rolled_back``: the
    physical slots of the tokens a truncate dropped, in position order (slot ``// BS`` is the block,
    ``% BS`` the offset: a figure marks them; some lie in the kept last block, the rest in blocks
    it released); ``dropped``: their positions ``(start, end)``, end exclusive (``()`` for other
    kinds); ``text``: a caption.
    """

    kind: str
    seq_id: Hashable = None
    new_blocks: tuple[int, ...] = ()
    freed_blocks: tuple[int, ...] = ()
    slots: tuple[int, ...] = ()
    copies: tuple[tuple[int, int], ...] = ()
    text: str = ""
    rolled_back: tuple[int, ...] = ()
    dropped: tuple[int, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """The whole pool after one event.

    ``blocks[i]`` is physical block ``i``; ``tables[seq]`` is ``((logical, physical, filled), ...)``;
    ``num_tokens[seq]`` the sequence's length; ``free_list`` the free ids in allocation order.
    """

    step: int
    event: Event
    block_size: int
    blocks: tuple[BlockState, ...]
    tables: dict = field(default_factory=dict)
    num_tokens: dict = field(default_factory=dict)
    free_list: tuple[int, ...] = ()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def used_blocks(self) -> int:
        return sum(1 for b in self.blocks if b.ref_count > 0)

    @property
    def wasted_slots(self) -> int:
        """Allocated but still empty slots in used blocks (internal fragmentation once their sequences
        have finished), shared blocks once."""
        return sum(self.block_size - b.filled for b in self.blocks if b.ref_count > 0)


def snapshot(manager: BlockSpaceManager, step: int = 0, event: Event | None = None,
             labels: dict | None = None) -> Snapshot:
    """Record ``manager``'s state as plain data; ``labels[seq]`` are optional per-token texts."""
    labels = labels or {}
    bs = manager.block_size
    holders: dict[int, list] = {}
    filled: dict[int, int] = {}
    texts: dict[int, tuple[str, ...]] = {}
    tables, lengths = {}, {}
    for s in manager.seq_ids:
        table: BlockTable = manager.block_table(s)
        tables[s] = tuple(table.entries())
        lengths[s] = table.num_tokens
        for logical, block_id, n in table.entries():
            holders.setdefault(block_id, []).append((s, logical))
            filled[block_id] = n
            if s in labels and block_id not in texts:
                texts[block_id] = tuple(str(x) for x in labels[s][logical * bs: logical * bs + n])
    blocks = tuple(BlockState(b, manager.allocator.ref_count(b), tuple(holders.get(b, ())),
                              filled.get(b, 0), texts.get(b, ())) for b in range(manager.num_blocks))
    return Snapshot(step, event or Event("start"), bs, blocks, tables, lengths,
                    tuple(manager.allocator.free_list()))


def rename_sequences(snap: Snapshot, names: dict) -> Snapshot:
    """``snap`` with sequence ids replaced by ``names[seq_id]`` (ids without a name keep theirs):
    figures show a serving engine's sequences by request name, its manager keys them by int."""
    rn = lambda s: names.get(s, s)
    blocks = tuple(replace(b, holders=tuple((rn(s), lg) for s, lg in b.holders)) for b in snap.blocks)
    return replace(snap, blocks=blocks, tables={rn(s): t for s, t in snap.tables.items()},
                   num_tokens={rn(s): n for s, n in snap.num_tokens.items()})


class BlockHistory:
    """Drives a :class:`BlockSpaceManager` and records a :class:`Snapshot` after every event.

    ``snapshots[0]`` is the starting state.  Tokens may be given as text labels (words, characters)
    so a figure can show what each slot holds; only their number matters to the manager.

    Args:
        manager: the real manager to drive (a fresh one is typical).
        record: ``False`` passes every event straight to the manager and records nothing (the
            methods then return ``None``): code that sometimes wants a history and sometimes
            speed (a long decode) drives the manager through one object either way.
        noun: what the captions call a sequence: ``"request"`` (one sequence per request),
            ``"sample"`` (parallel sampling, the paper's Figure 8) or ``"beam"`` (beam search,
            Figure 9), so a figure of forked samples does not title one of them "request 2".

    Errors come from the manager (``OutOfBlocksError``, ``BlockError``); a failed event records
    nothing.  A ``noun`` that is not a non-empty ``str`` raises ``BlockError`` naming it.
    """

    def __init__(self, manager: BlockSpaceManager, record: bool = True, noun: str = "request") -> None:
        if not isinstance(noun, str) or not noun.strip() or ":" in noun:
            raise BlockError(f"noun (what captions call a sequence) must be a non-empty str without ':', got {noun!r}")
        self.manager = manager
        self.record = bool(record)
        self.noun = noun
        self.labels: dict[Hashable, list[str]] = {}
        self.snapshots: list[Snapshot] = [snapshot(manager)] if self.record else []

    @property
    def events(self) -> list[Event]:
        return [s.event for s in self.snapshots]

    def _record(self, event: Event) -> Snapshot:
        snap = snapshot(self.manager, len(self.snapshots), event, self.labels)
        self.snapshots.append(snap)
        return snap

    def allocate(self, seq_id, tokens: int | Sequence) -> Snapshot:
        """A prompt: ``tokens`` is a length (an int >= 1) or the prompt's tokens (labels).

        Raises ``BlockError`` for a length that is not an int ``>= 1`` (``-3``, ``2.7``)."""
        if hasattr(tokens, "__iter__") and not hasattr(tokens, "__index__"):   # labels
            toks = [str(t) for t in tokens]
        else:                                                                 # a length
            toks = [""] * count("a prompt length (tokens)", tokens, minimum=1, error=BlockError)
        if not self.record:
            self.manager.allocate(seq_id, len(toks))
            return None
        table = self.manager.allocate(seq_id, len(toks))
        self.labels[seq_id] = toks
        slots = tuple(self.manager.slot_mapping(seq_id))
        return self._record(Event("allocate", seq_id, tuple(table.block_ids), (), slots, (),
                                  f"{self.noun} {seq_id}: prompt of {len(toks)} tokens → blocks {list(table.block_ids)}"))

    def append(self, seq_id, token="") -> Snapshot:
        """A decode token for ``seq_id`` (``token``: its label).

        A copy-on-write copy this causes is recorded in the event and stays queued in the manager
        for whoever owns the cache (:func:`paged_kv.storage.run_from_manager` takes and applies it)."""
        if not self.record:
            self.manager.append_slot(seq_id)
            return None
        before = set(self.manager.block_table(seq_id).block_ids)
        queued = len(self.manager.pending_copies)
        slot = self.manager.append_slot(seq_id)
        copies = self.manager.pending_copies[queued:]   # observed, left queued for the cache
        self.labels.setdefault(seq_id, [""] * (self.manager.num_tokens(seq_id) - 1)).append(str(token))
        new = tuple(b for b in self.manager.block_table(seq_id).block_ids if b not in before)
        logical, offset = divmod(self.manager.num_tokens(seq_id) - 1, self.manager.block_size)
        what = f"new block {new[0]}" if new and not copies else (
            f"copy-on-write {copies[0][0]} → {copies[0][1]}" if copies else "no new block")
        return self._record(Event("append", seq_id, new, (), (slot,), copies,
                                  f"{self.noun} {seq_id}: token {token!r} → logical {logical}, offset {offset}, "
                                  f"slot {slot} ({what})"))

    def fork(self, parent_id, child_id) -> Snapshot:
        """``child_id`` starts as a copy of ``parent_id`` sharing all its blocks (no block taken)."""
        self.manager.fork(parent_id, child_id)
        if not self.record:
            return None
        self.labels[child_id] = list(self.labels.get(parent_id, []))
        return self._record(Event("fork", child_id, text=f"{self.noun} {child_id}: forked from {self.noun} {parent_id}, sharing "
                                  f"blocks {self.manager.block_table(child_id).block_ids}"))

    def free(self, seq_id) -> Snapshot:
        """``seq_id`` is done: blocks only it held go back to the free list (``freed_blocks`` in
        the order they are appended to it: the last logical block first)."""
        freed = tuple(self.manager.free(seq_id))
        if not self.record:
            return None
        self.labels.pop(seq_id, None)
        return self._record(Event("free", seq_id, (), freed, (), (),
                                  f"{self.noun} {seq_id}: finished, blocks {list(freed)} back on the free list"))

    def truncate(self, seq_id, num_tokens: int) -> Snapshot:
        """Roll ``seq_id`` back to its first ``num_tokens`` tokens (rejected draft tokens,
        :meth:`BlockSpaceManager.truncate`).  Recorded as kind ``"truncate"``: ``freed_blocks`` the
        ids back on the free list (the last logical block first), ``rolled_back`` the slots of the
        dropped tokens and ``dropped`` their positions, both read before the cut; the labels past
        the cut are dropped.  A truncate to the current length is recorded too, dropping nothing."""
        if not self.record:
            self.manager.truncate(seq_id, num_tokens)
            return None
        held = seq_id in self.manager.seq_ids            # else the manager's truncate names the error
        slots = self.manager.slot_mapping(seq_id) if held else []
        freed = tuple(self.manager.truncate(seq_id, num_tokens))
        old = len(slots)
        n = self.manager.num_tokens(seq_id)
        if seq_id in self.labels:
            del self.labels[seq_id][n:]
        rolled = tuple(slots[n:])
        what = (f"positions {n}..{old - 1} rolled back (slots {list(rolled)})" if rolled else "nothing rolled back")
        back = f", blocks {list(freed)} back on the free list" if freed else ", no block freed"
        return self._record(Event("truncate", seq_id, (), freed, (), (),
                                  f"{self.noun} {seq_id}: kept {n} tokens, {what}{back}", rolled, (n, old)))

    def preempt(self, seq_id, reason: str = "") -> Snapshot:
        """``seq_id`` is preempted by recompute (vLLM paper §4.5): all its blocks are freed at once
        and its tokens will be prefilled again when it is readmitted.  Recorded as kind
        ``"preempt"``; ``reason`` goes into the caption."""
        freed = tuple(self.manager.free(seq_id))
        if not self.record:
            return None
        self.labels.pop(seq_id, None)
        why = f" ({reason})" if reason else ""
        return self._record(Event("preempt", seq_id, (), freed, (), (),
                                  f"{self.noun} {seq_id}: preempted{why}, blocks {list(freed)} back on the "
                                  f"free list; it will be recomputed"))


def paper_trace() -> BlockHistory:
    """The vLLM paper's Figures 6 and 7 (§4.3), replayed by the real manager.

    Block size 4, a pool of 9 blocks (the figures draw physical blocks 0..8), one word per token.
    Figure 6: request A's prompt "Four score and seven years ago our" (7 tokens) lands on physical
    blocks 7, 1; decoding "fathers" fills block 1; decoding "brought" takes block 3.  Figure 7:
    request B, "It was the best of times" (6 tokens), lands on blocks 5, 2.  The paper does not say
    in which order the pool handed them out; with the free list ``PAPER_FREE_ORDER`` the manager
    produces exactly the figures' ids.
    """
    h = BlockHistory(BlockSpaceManager(9, 4, free_order=PAPER_FREE_ORDER))
    h.allocate("A", "Four score and seven years ago our".split())
    h.append("A", "fathers")
    h.append("A", "brought")
    h.allocate("B", "It was the best of times".split())
    return h


def paper_sampling_trace() -> BlockHistory:
    """The vLLM paper's Figure 8 (§4.4, parallel sampling), replayed by the real manager.

    Block size 4, the pool and free-list order of :func:`paper_trace`.  Sample A1's prompt "Four
    score and seven years ago our" (7 tokens) lands on blocks 7, 1; sample A2 forks from it and
    shares both (ref counts 2, 2).  A1 writes "fathers": its last block is shared and partly filled,
    so block 1 is copied to block 3 (A1's table becomes 7, 3; block 1's ref count drops 2 -> 1).
    A2 writes "mothers" into block 1 in place: it is the last holder.
    """
    h = BlockHistory(BlockSpaceManager(9, 4, free_order=PAPER_FREE_ORDER), noun="sample")
    h.allocate("A1", "Four score and seven years ago our".split())
    h.fork("A1", "A2")
    h.append("A1", "fathers")
    h.append("A2", "mothers")
    return h


def paper_beam_trace() -> BlockHistory:
    """The vLLM paper's Figure 9 (§4.4, beam search with k = 4), replayed by the real manager.

    Block size 4 and a pool of 13 blocks handed out in order 0, 1, 2, ...  Before the figure's
    dotted line each of the four beam candidates holds 4 full logical blocks: all share block 0
    (the prompt); candidate 3 leaves the others at the second block (blocks 0, 2, 4, 8); candidates
    0-2 share blocks 0, 1, 3 and diverge at the fourth (5, 6, 7).  Then the top 4 candidates all
    descend from candidates 1 and 2: each of those continues and forks once (candidates 4 and 5),
    candidates 0 and 3 are freed, and the blocks only they held (2, 4, 5, 8) go back to the pool;
    the four new tokens then take new blocks 9-12 (every last block was full).  Tokens are
    labelled by position.
    """
    h = BlockHistory(BlockSpaceManager(13, 4), noun="beam")

    def grow(seq, n):
        for _ in range(n):
            h.append(seq, str(h.manager.num_tokens(seq)))

    h.allocate(0, [str(i) for i in range(4)])                # the prompt: block 0
    h.fork(0, 3)                                             # candidate 3 leaves after the prompt
    grow(0, 4)                                               # block 1
    grow(3, 4)                                               # block 2
    grow(0, 4)                                               # block 3
    grow(3, 4)                                               # block 4
    h.fork(0, 1)
    h.fork(0, 2)                                             # candidates 0-2 share 0, 1, 3
    for seq in (0, 1, 2, 3):
        grow(seq, 4)                                         # blocks 5, 6, 7, 8
    h.fork(1, 4)                                             # the dotted line: top 4 from 1 and 2
    h.fork(2, 5)
    h.free(0)                                                # block 5 back
    h.free(3)                                                # blocks 8, 4, 2 back
    for seq in (1, 4, 2, 5):
        grow(seq, 1)                                         # blocks 9, 10, 11, 12
    return h
