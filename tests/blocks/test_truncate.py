"""``BlockSpaceManager.truncate``: speculative decoding's rollback of rejected draft slots.

The golden trace (checked id for id by hand), truncate == never having appended (hypothesis),
forks with a shared tail in either order, queued copy-on-write copies into freed blocks, the
prefix-cache rules, every error, and the history's ``truncate`` event.  The block manager's state
machine (``tests/blocks/test_manager.py``) drives truncate among random allocate / append / fork /
free steps too."""

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv.blocks import BlockHistory, BlockSpaceManager, blocks_needed
from paged_kv.errors import BlockError


def state(m: BlockSpaceManager):
    """Everything observable about a manager (free-list order included), to prove a call changed
    nothing."""
    return (m.allocator.free_list(), [m.allocator.ref_count(b) for b in range(m.num_blocks)],
            {s: (m.block_table(s).block_ids, m.num_tokens(s)) for s in m.seq_ids}, m.pending_copies,
            None if m.cache is None else sorted(m.cache.entries()))


# --- the golden trace -------------------------------------------------------------------------
def test_golden_trace_a_draft_across_a_block_boundary_one_accepted():
    """Block size 4, 6 blocks, the free list 0, 1, 2, 3, 4, 5 (head first).  Tokens are counted
    from 1; a slot is ``block * 4 + offset``.  Derived by hand:

    ====  ====================================  ============  ========================  =========
    step  call                                   returns       table (logical, phys,     free list
                                                               filled)                   (head ..)
    ====  ====================================  ============  ========================  =========
    0     ``BlockSpaceManager(6, 4)``            --            --                        0 1 2 3 4 5
    1     ``allocate("s", 6)``: tokens 1-6       blocks [0, 1] (0,0,4) (1,1,2)           2 3 4 5
    2     ``append_slots("s", 3)``: drafts 7-9   slots [6, 7,  (0,0,4) (1,1,4) (2,2,1)   3 4 5
          (7, 8 fill block 1; 9 takes block 2)   8]
    3     1 draft accepted: ``truncate("s", 7)`` freed [2]     (0,0,4) (1,1,3)           3 4 5 **2**
    4     ``allocate("x", 1)``                   blocks [3]    x: (0,3,1)                4 5 2
    5     ``append_slot("s")``: token 8          slot 7        (0,0,4) (1,1,4)           4 5 2
    6     ``append_slot("s")``: token 9          slot 16       (0,0,4) (1,1,4) (2,4,1)   5 2
    ====  ====================================  ============  ========================  =========

    Step 3: block 2 loses its only holder and goes to the *tail* of the free list (FIFO, position 3
    of 4), so the next allocation (step 4) does *not* get it: it gets 3, the head; block 2 comes
    out only after 4 and 5.  Steps 5-6: the kept block 1 takes token 8 in slot 7 (the slot of the
    rejected draft 8), and token 9 needs a new block, 4 (the head).  Ref counts: every held block 1,
    every free block 0, after every step.

    With prefix caching on (same calls), block 2 caches nothing (a draft is never registered), so
    at step 3 it goes to the *head*: free list 2 3 4 5, and step 4's allocation gets block 2 back.
    """
    m = BlockSpaceManager(6, 4)
    assert m.allocator.free_list() == [0, 1, 2, 3, 4, 5]
    assert m.allocate("s", 6).entries() == [(0, 0, 4), (1, 1, 2)]
    assert m.allocator.free_list() == [2, 3, 4, 5]
    assert m.append_slots("s", 3) == [6, 7, 8]
    assert m.block_table("s").entries() == [(0, 0, 4), (1, 1, 4), (2, 2, 1)]
    assert m.allocator.free_list() == [3, 4, 5]
    assert m.truncate("s", 7) == [2]
    assert m.block_table("s").entries() == [(0, 0, 4), (1, 1, 3)] and m.num_tokens("s") == 7
    assert m.allocator.free_list() == [3, 4, 5, 2]                 # block 2 at the tail
    assert [m.allocator.ref_count(b) for b in range(6)] == [1, 1, 0, 0, 0, 0]
    m.check()
    assert m.allocate("x", 1).block_ids == [3]                     # not 2
    assert m.allocator.free_list() == [4, 5, 2]
    assert m.append_slot("s") == 7 and m.block_ids("s") == (0, 1)  # token 8: the kept block
    assert m.append_slot("s") == 16 and m.block_ids("s") == (0, 1, 4)
    assert m.allocator.free_list() == [5, 2]
    assert [m.allocator.ref_count(b) for b in range(6)] == [1, 1, 0, 1, 1, 0]
    m.check()

    c = BlockSpaceManager(6, 4, enable_prefix_caching=True)
    c.allocate("s", 6), c.append_slots("s", 3)
    assert c.truncate("s", 7) == [2]
    assert c.allocator.free_list() == [2, 3, 4, 5]                 # block 2 at the head
    assert c.allocate("x", 1).block_ids == [2]
    c.check()


def test_several_freed_blocks_go_back_last_logical_block_first():
    """Dropped blocks are released tail first, as ``free`` releases them: without a cache each
    joins the tail, so the last logical block is handed out first; with a cache (none of them
    registered) each joins the head, so the first dropped block ends at the very head."""
    m = BlockSpaceManager(8, 2)
    m.allocate("s", 3)                                             # [0, 1]
    m.append_slots("s", 5)                                         # 8 tokens: [0, 1, 2, 3]
    assert m.truncate("s", 3) == [3, 2]
    assert m.allocator.free_list() == [4, 5, 6, 7, 3, 2]
    c = BlockSpaceManager(8, 2, enable_prefix_caching=True)
    c.allocate("s", 3), c.append_slots("s", 5)
    assert c.truncate("s", 3) == [3, 2]
    assert c.allocator.free_list() == [2, 3, 4, 5, 6, 7]


def test_truncate_to_the_current_length_changes_nothing():
    m = BlockSpaceManager(6, 4)
    m.allocate("s", 6), m.append_slots("s", 3)
    m.allocate("t", 2), m.free("t")                                # a free list not in id order
    before = state(m)
    assert m.truncate("s", 9) == [] and state(m) == before


# --- truncate == never having appended --------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(bs=st.integers(1, 8), prompt=st.integers(1, 30), k=st.integers(0, 20), data=st.data())
def test_truncate_after_appending_equals_never_having_appended_past_the_cut(bs, prompt, k, data):
    """``allocate(L)``, ``append_slots(k)``, ``truncate(n)`` leaves the same block table, free set
    and ref counts as ``allocate(min(n, L))``, ``append_slots(max(0, n - L))``, for any cut
    ``1 <= n <= L + k`` (into the draft or into the prompt), over a random initial free order.
    Freeing everything then returns the whole pool (no leak, no double free)."""
    n = data.draw(st.integers(1, prompt + k), label="n")
    nb = blocks_needed(prompt + k, bs) + 2
    order = data.draw(st.permutations(range(nb)), label="free_order")
    a, b = BlockSpaceManager(nb, bs, free_order=order), BlockSpaceManager(nb, bs, free_order=order)
    a.allocate("s", prompt), a.append_slots("s", k)
    freed = a.truncate("s", n)
    b.allocate("s", min(n, prompt)), b.append_slots("s", max(0, n - prompt))
    assert a.block_table("s") == b.block_table("s")
    assert set(a.allocator.free_list()) == set(b.allocator.free_list())
    assert [a.allocator.ref_count(i) for i in range(nb)] == [b.allocator.ref_count(i) for i in range(nb)]
    assert len(freed) == blocks_needed(prompt + k, bs) - blocks_needed(n, bs)
    assert a.wasted_slots("s") == b.wasted_slots("s") <= bs - 1
    a.check()
    a.free("s")
    assert a.num_free_blocks == nb
    a.check()


# --- forks: a shared tail ---------------------------------------------------------------------
class Model:
    """A manager plus what each sequence holds, a dict standing for the KV cache (slot -> token),
    copy-on-write copies applied as the cache must; :meth:`verify` checks every invariant and that
    each sequence reads back exactly its own tokens."""

    def __init__(self, nb=8, bs=4, **kw):
        self.m = BlockSpaceManager(nb, bs, **kw)
        self.bs, self.tokens, self.cache, self.next = bs, {}, {}, 100

    def allocate(self, s, n):
        self.m.allocate(s, n)
        self.tokens[s] = list(range(self.next, self.next + n))
        self.next += n
        for slot, t in zip(self.m.slot_mapping(s), self.tokens[s]):
            self.cache[slot] = t
        self.verify()

    def fork(self, p, c):
        self.m.fork(p, c)
        self.tokens[c] = list(self.tokens[p])
        self.verify()

    def append(self, s):
        slot = self.m.append_slot(s)
        assert self.m.allocator.ref_count(slot // self.bs) == 1, f"{s} writes into a shared block"
        for src, dst in self.m.take_copies():
            for o in range(self.bs):
                if src * self.bs + o in self.cache:
                    self.cache[dst * self.bs + o] = self.cache[src * self.bs + o]
        self.cache[slot] = self.next
        self.tokens[s].append(self.next)
        self.next += 1
        self.verify()
        return slot

    def truncate(self, s, n):
        freed = self.m.truncate(s, n)
        del self.tokens[s][n:]
        self.verify()
        return freed

    def verify(self):
        self.m.check()
        for s, toks in self.tokens.items():
            assert [self.cache[slot] for slot in self.m.slot_mapping(s)] == toks, s


@pytest.mark.parametrize("first", ["child", "parent"])
def test_truncating_a_shared_partial_tail_in_either_order(first):
    """Parent ``p`` (6 tokens: blocks 0, 1; block 1 holds 2) forks ``c``: both share block 1,
    partly filled.  Cutting either one back to 5 tokens frees nothing (the block is still held),
    keeps it shared (ref count 2) and changes the other's tokens in no way; the cut one's next
    append still copies (copy-on-write), and then the other, its last holder, writes in place."""
    mod = Model()
    mod.allocate("p", 6)
    mod.fork("p", "c")
    cut, other = ("c", "p") if first == "child" else ("p", "c")
    assert mod.truncate(cut, 5) == []
    m = mod.m
    assert m.block_ids(cut) == m.block_ids(other) == (0, 1) and m.allocator.ref_count(1) == 2
    assert (m.num_tokens(cut), m.num_tokens(other)) == (5, 6)
    assert m.blocks_to_append(cut) == 1                     # shared and partly filled: a copy
    assert mod.append(cut) == 2 * 4 + 1 and m.block_ids(cut) == (0, 2)
    assert [m.allocator.ref_count(b) for b in (0, 1, 2)] == [2, 1, 1]
    assert m.blocks_to_append(other) == 0
    assert mod.append(other) == 1 * 4 + 2                   # in place: its last holder
    assert mod.truncate(other, 5) == [] and mod.truncate(cut, 4) == [2]
    for s in ("p", "c"):
        m.free(s)
    assert m.num_free_blocks == m.num_blocks
    m.check()


@pytest.mark.parametrize("first", ["child", "parent"])
def test_cutting_inside_a_shared_full_block_leaves_the_other_whole(first):
    """``p`` holds 8 tokens (blocks 0, 1, both full) and forks ``c``.  Cut one to 6: block 1 stays
    shared, the cut one holding 2 of its 4 tokens, the other all 4 (``check`` allows it for a
    truncated sequence only).  The cut one's append copies block 1; the other's append takes a new
    block (its last block is full); cut both, in either order, and free them: the pool is whole."""
    mod = Model()
    mod.allocate("p", 8)
    mod.fork("p", "c")
    cut, other = ("c", "p") if first == "child" else ("p", "c")
    assert mod.truncate(cut, 6) == []
    m = mod.m
    assert m.allocator.ref_count(1) == 2 and m.block_table(cut).entries() == [(0, 0, 4), (1, 1, 2)]
    assert m.block_table(other).entries() == [(0, 0, 4), (1, 1, 4)]
    mod.append(cut)                                          # copies 1 -> 2, writes offset 2
    assert m.block_ids(cut) == (0, 2) and m.allocator.ref_count(1) == 1
    mod.append(other)                                        # block 1 full for it: new block 3
    assert m.block_ids(other) == (0, 1, 3)
    assert mod.truncate(other, 5) == [3] and mod.truncate(cut, 4) == [2]
    assert mod.truncate(other, 1) == [1] and m.allocator.ref_count(0) == 2
    m.free("p"), m.free("c")
    assert m.num_free_blocks == m.num_blocks
    m.check()


def test_dropping_a_shared_block_only_removes_a_holder():
    mod = Model()
    mod.allocate("p", 8)
    mod.fork("p", "c")
    assert mod.truncate("c", 4) == [] and mod.m.allocator.ref_count(1) == 1
    assert mod.m.block_ids("c") == (0,) and mod.m.block_ids("p") == (0, 1)
    assert mod.append("c") == 2 * 4 and mod.m.take_copies() == []     # a new block, no copy
    mod.m.free("p")
    assert mod.m.allocator.ref_count(1) == 0


def test_a_fork_of_a_truncated_tail_is_checked_like_its_parent():
    """``c`` is cut inside the full block 1 it shares with ``p`` (``c`` 2 tokens there, ``p`` 4),
    then forks ``d``, which holds block 1 short too: allowed, because ``d`` inherits ``c``'s
    allowance.  The allowance is per sequence and narrow: taken from ``d``, ``check`` fires; and
    once ``c`` and ``d`` have appended (each copied block 1), nothing is uneven any more."""
    mod = Model()
    mod.allocate("p", 8)
    mod.fork("p", "c")
    mod.truncate("c", 6)
    mod.fork("c", "d")
    assert mod.m.allocator.ref_count(1) == 3
    mod.m._short_tail.discard("d")
    with pytest.raises(BlockError, match=r"different token counts in different tables: \{1: \[2, 4\]\}"):
        mod.m.check()
    mod.m._short_tail.add("d")
    mod.append("d"), mod.append("c")
    mod.m._short_tail.clear()
    mod.m.check()


# --- queued copy-on-write copies --------------------------------------------------------------
def test_a_queued_copy_into_a_freed_block_is_dropped_and_one_into_the_kept_block_stays():
    """``c`` forks from ``p`` (6 tokens) and appends: the copy (1, 2) is queued, not yet applied.
    Cutting ``c`` to 6 keeps block 2 (the copy carries c's tokens 5-6 into it): the copy stays.
    Cutting it to 4 frees block 2: the copy must go, or it would land in whatever block 2 holds
    when the cache applies the queue; a prompt that takes block 2 (the free list's tail) then
    finds no copy aimed at it."""
    m = BlockSpaceManager(6, 4)
    m.allocate("p", 6)
    m.fork("p", "c")
    m.append_slot("c")
    assert m.pending_copies == ((1, 2),) and m.block_ids("c") == (0, 2)
    assert m.truncate("c", 6) == [] and m.pending_copies == ((1, 2),)
    m.check()
    assert m.truncate("c", 4) == [2] and m.pending_copies == ()
    m.check()
    assert m.allocator.free_list() == [3, 4, 5, 2]
    assert m.allocate("x", 16).block_ids == [3, 4, 5, 2]
    assert m.take_copies() == []
    m.check()


# --- prefix caching ---------------------------------------------------------------------------
def test_a_dropped_registered_block_stays_cached_free_and_is_hit_again():
    """``s`` (8 tokens, blocks 0, 1 registered) takes block 2 for a ninth; cutting it to 4 frees
    block 2 (caches nothing: to the head) then block 1 (registered: cached-free, at the tail, found
    again by a prompt of the same 8 tokens).  ``s`` counts as registered up to block 0, so the
    tokens it appends into a new block 1 are registered again when it fills."""
    m = BlockSpaceManager(6, 4, enable_prefix_caching=True)
    toks = [1, 2, 3, 4, 5, 6, 7, 8]
    m.allocate("s", 8)
    assert m.cache_full_blocks("s", toks, 8) == [0, 1]
    m.append_slot("s")                                             # block 2
    assert m.truncate("s", 4) == [2, 1]
    assert m.allocator.free_list() == [2, 3, 4, 5, 1] and m.allocator.cached_free() == [1]
    assert m.cache_hit(toks + [9]) == [0, 1]
    m.check()
    m.append_slots("s", 4)                                         # block 2 again: other tokens
    assert m.cache_full_blocks("s", [1, 2, 3, 4, 9, 9, 9, 9], 8) == [2]
    m.check()


def test_a_cut_inside_a_registered_block_is_refused_and_a_cut_at_its_edge_is_not():
    m = BlockSpaceManager(6, 4, enable_prefix_caching=True)
    m.allocate("s", 8)
    m.cache_full_blocks("s", list(range(8)), 8)
    before = state(m)
    with pytest.raises(BlockError, match=r"to 6 tokens: the cut falls inside block 1 \(logical 1\), registered"):
        m.truncate("s", 6)
    assert state(m) == before
    assert m.truncate("s", 4) == [1] and m.allocator.cached_free() == [1]
    m.check()


def test_a_block_held_short_by_a_truncated_fork_is_not_registered_until_it_is_copied():
    """``p`` (4 tokens, block 0 full) forks ``c``; ``c`` is cut to 3, holding block 0 short.  ``p``
    may not register block 0: once ``p`` is freed, ``c`` would write its fourth token into it in
    place, under an entry naming ``p``'s.  After ``c``'s append copies block 0, ``p`` registers it."""
    m = BlockSpaceManager(6, 2, enable_prefix_caching=True)
    m.allocate("p", 4)
    m.fork("p", "c")
    m.truncate("c", 3)
    assert m.cache_full_blocks("p", [1, 2, 3, 4], 4) == [0]           # block 1 is c's short tail
    m.check()
    m.append_slot("c")                                                 # copies block 1 -> 2
    assert m.take_copies() == [(1, 2)]
    assert m.cache_full_blocks("p", [1, 2, 3, 4], 4) == [1]
    m.check()


# --- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("seq,n,match", [
    ("zz", 3, "unknown sequence 'zz'"),
    (["s"], 3, r"sequence id must be a str or an int, got \['s'\]"),
    ("gone", 3, "sequence 'gone' is swapped out: swap it in before truncating it"),
    ("s", 2.5, r"num_tokens \(tokens to keep\) must be an int >= 1, got 2.5"),
    ("s", True, "must be an int >= 1, got True"),
    ("s", "3", "must be an int >= 1, got '3'"),
    ("s", None, "must be an int >= 1, got None"),
    ("s", 0, r"must be an int >= 1, got 0; a sequence keeps >= 1 token \(free\(\) drops them all\)"),
    ("s", -1, "must be an int >= 1, got -1"),
    ("s", 10, "cannot truncate sequence 's' to 10 tokens: it holds 9"),
])
def test_every_bad_argument_is_refused_by_name_and_changes_nothing(seq, n, match):
    m = BlockSpaceManager(6, 4, num_cpu_blocks=2)
    m.allocate("s", 6), m.append_slots("s", 3)
    m.allocate("gone", 2), m.swap_out(["gone"])
    before = state(m)
    with pytest.raises(BlockError, match=match):
        m.truncate(seq, n)
    assert state(m) == before and m.swapped_ids == ["gone"]
    m.check()


def test_a_freed_sequence_cannot_be_truncated():
    m = BlockSpaceManager(4, 4)
    m.allocate("s", 5), m.free("s")
    with pytest.raises(BlockError, match="unknown sequence 's'"):
        m.truncate("s", 1)


def test_numpy_counts_are_accepted():
    np = pytest.importorskip("numpy")
    m = BlockSpaceManager(4, 4)
    m.allocate(np.int64(3), 9)
    assert m.truncate(np.int32(3), np.int64(5)) == [2] and m.num_tokens(3) == 5


# --- the history's truncate event -------------------------------------------------------------
def test_history_records_the_rollback():
    """The golden trace through :class:`BlockHistory`: the event names the freed block, the
    dropped positions 7..8 (0-based: tokens 8 and 9) and their slots 7 and 8 (block 1 offset 3, block 2
    offset 0); the labels past the cut go; the snapshot shows block 2 free, at the tail."""
    h = BlockHistory(BlockSpaceManager(6, 4))
    h.allocate("s", list("abcdef"))
    for t in "xyz":
        h.append("s", t)
    snap = h.truncate("s", 7)
    json.dumps(dataclasses.asdict(snap))                            # plain data, as every snapshot
    ev = snap.event
    assert (ev.kind, ev.seq_id, ev.freed_blocks, ev.rolled_back, ev.dropped) == ("truncate", "s", (2,), (7, 8), (7, 9))
    assert ev.new_blocks == () and ev.slots == () and ev.copies == ()
    assert ev.text == "request s: kept 7 tokens, positions 7..8 rolled back (slots [7, 8]), blocks [2] back on the free list"
    assert snap.tables["s"] == ((0, 0, 4), (1, 1, 3)) and snap.num_tokens["s"] == 7
    assert snap.free_list == (3, 4, 5, 2) and snap.blocks[2].ref_count == 0 and snap.blocks[2].holders == ()
    assert snap.blocks[1].labels == ("e", "f", "x") and h.labels["s"] == list("abcdefx")
    assert [e.kind for e in h.events] == ["start", "allocate", "append", "append", "append", "truncate"]
    none = h.truncate("s", 7).event
    assert (none.freed_blocks, none.rolled_back, none.dropped) == ((), (), (7, 7))
    assert none.text.endswith("nothing rolled back, no block freed")


def test_history_truncate_of_a_shared_tail_and_a_failed_truncate_records_nothing():
    h = BlockHistory(BlockSpaceManager(6, 4), noun="sample")
    h.allocate("a", 6)
    h.fork("a", "b")
    snap = h.truncate("b", 5)
    assert snap.event.freed_blocks == () and snap.event.rolled_back == (1 * 4 + 1,)
    assert snap.blocks[1].ref_count == 2 and snap.event.text.startswith("sample b: kept 5 tokens")
    n = len(h.snapshots)
    for bad in (0, 7):
        with pytest.raises(BlockError):
            h.truncate("b", bad)
    with pytest.raises(BlockError, match="unknown sequence 'zz'"):
        h.truncate("zz", 1)
    assert len(h.snapshots) == n and len(h.labels["b"]) == 5


def test_history_without_recording_passes_truncate_through():
    h = BlockHistory(BlockSpaceManager(6, 4), record=False)
    h.allocate("s", 9)
    assert h.truncate("s", 4) is None and h.manager.num_tokens("s") == 4 and h.snapshots == []
