"""Block bookkeeping: the allocator's free list and ref counts, block tables, on-demand blocks,
slot mapping, fork + copy-on-write, the paper's Figure 6-7 trace, and a hypothesis state machine
(allocate / append / fork / truncate / free) that checks every invariant after every step (and
tests that each check can fire)."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from paged_kv.blocks import BlockAllocator
from paged_kv.blocks import BlockSpaceManager, BlockTable, blocks_needed
from paged_kv.errors import BlockError, ConfigError, OutOfBlocksError


def state(m: BlockSpaceManager):
    """Everything observable about a manager, to prove a failed call changed nothing."""
    return (m.allocator.free_list(), [m.allocator.ref_count(b) for b in range(m.num_blocks)],
            {s: (m.block_table(s).block_ids, m.num_tokens(s)) for s in m.seq_ids})


# --- BlockAllocator ---------------------------------------------------------------------------
def test_allocator_hands_out_free_list_head_and_returns_to_tail():
    a = BlockAllocator(4)
    assert [a.allocate() for _ in range(3)] == [0, 1, 2]
    assert a.num_free_blocks == 1 and a.ref_count(1) == 1 and a.ref_count(3) == 0
    assert a.free(1) == 0
    assert a.free_list() == [3, 1]            # freed block goes to the tail (FIFO)
    assert a.allocate() == 3 and a.allocate() == 1


def test_allocator_initial_order_is_a_parameter():
    a = BlockAllocator(5, free_order=[4, 2, 0, 1, 3])
    assert [a.allocate() for _ in range(5)] == [4, 2, 0, 1, 3]


@pytest.mark.parametrize("bad", [[0, 1, 1], [0, 1], [0, 1, 3], [-1, 0, 1]])
def test_allocator_rejects_a_free_order_that_is_not_a_permutation(bad):
    with pytest.raises(ConfigError):
        BlockAllocator(3, free_order=bad)


@pytest.mark.parametrize("bad", [0, -3, 2.0, True])
def test_allocator_rejects_bad_pool_sizes(bad):
    with pytest.raises(ConfigError):
        BlockAllocator(bad)


def test_double_free_raises_and_never_goes_negative():
    a = BlockAllocator(2)
    b = a.allocate()
    a.free(b)
    with pytest.raises(BlockError, match="double free"):
        a.free(b)
    assert a.ref_count(b) == 0 and a.free_list().count(b) == 1
    a.check()


def test_freeing_a_block_never_allocated_is_not_called_a_double_free():
    a = BlockAllocator(3)
    with pytest.raises(BlockError, match="block 2 is not allocated") as e:
        a.free(2)
    assert "double" not in str(e.value)
    assert a.free_list() == [0, 1, 2]
    a.allocate(), a.allocate(), a.allocate()
    a.free(2)
    with pytest.raises(BlockError, match="double free: block 2"):   # handed out once, freed once
        a.free(2)


def test_numpy_integers_count_like_ints():
    np = pytest.importorskip("numpy")
    a = BlockAllocator(np.int64(3), free_order=np.array([2, 0, 1]))
    assert a.num_blocks == 3 and type(a.num_blocks) is int and a.allocate() == 2
    assert a.ref_count(np.int32(2)) == 1 and a.free(np.int64(2)) == 0
    m = BlockSpaceManager(np.int64(4), np.int32(2))
    t = m.allocate(np.int64(7), np.int64(3))            # a numpy seq id is the int 7
    assert m.seq_ids == [7] and type(m.seq_ids[0]) is int and len(t) == 2 == blocks_needed(np.int64(3), 2)


def test_shared_block_returns_to_free_list_only_at_zero():
    a = BlockAllocator(3)
    b = a.allocate()
    assert a.share(b) == 2 and a.share(b) == 3
    assert a.free(b) == 2 and a.free(b) == 1 and b not in a.free_list()
    assert a.free(b) == 0 and a.free_list()[-1] == b


@pytest.mark.parametrize("bad", [-1, 3, 1.5, None])
def test_allocator_rejects_unknown_block_ids(bad):
    a = BlockAllocator(3)
    for call in (a.free, a.share, a.ref_count):
        with pytest.raises(BlockError):
            call(bad)


def test_sharing_a_free_block_raises():
    with pytest.raises(BlockError, match="free"):
        BlockAllocator(2).share(0)


def test_allocator_out_of_blocks_carries_numbers_and_changes_nothing():
    a = BlockAllocator(2)
    a.allocate(), a.allocate()
    with pytest.raises(OutOfBlocksError) as e:
        a.allocate()
    assert (e.value.needed, e.value.free) == (1, 0)
    assert a.num_free_blocks == 0 and a.num_used_blocks == 2


def _corrupt_allocator(kind: str) -> BlockAllocator:
    a = BlockAllocator(4)
    a.allocate(), a.allocate()                      # 0, 1 held; free list [2, 3]
    if kind == "negative":
        a._refs[2] = -1
    elif kind == "leak":
        a._free.remove(3)                           # count 0 but not on the list
    elif kind == "held on list":
        a._free.remove(3), a._free.append(0)        # [2, 0]; block 0 still held, 3 lost
    return a


def test_the_free_queue_cannot_hold_a_block_twice():
    a = _corrupt_allocator("none")                  # free list [2, 3]
    with pytest.raises(BlockError, match="already on the free queue"):
        a._free.append(2)
    assert a.free_list() == [2, 3]


@pytest.mark.parametrize("kind,match", [("negative", "negative"), ("leak", "pool size"),
                                        ("held on list", "ref count 0")])
def test_each_allocator_check_fires(kind, match):
    _corrupt_allocator("none").check()               # the uncorrupted state passes
    with pytest.raises(BlockError, match=match):
        _corrupt_allocator(kind).check()


# --- BlockTable -------------------------------------------------------------------------------
def test_block_table_translates_positions():
    t = BlockTable(4, [7, 1, 3], 9)
    assert [t.filled(i) for i in range(3)] == [4, 4, 1]
    assert t.locate(8) == (2, 0) and t.slot(8) == 3 * 4 + 0
    assert t.slot(5) == 1 * 4 + 1
    assert t.entries() == [(0, 7, 4), (1, 1, 4), (2, 3, 1)]
    with pytest.raises(BlockError):
        t.locate(12)
    with pytest.raises(BlockError):
        t.filled(3)


# --- BlockSpaceManager: the boundary table (block size 16) ----------------------------
# prompt tokens -> (blocks held, tokens in last block, new blocks for one append, new token's (logical, offset))
BOUNDARIES = [(15, 1, 15, 0, (0, 15)), (16, 1, 16, 1, (1, 0)), (17, 2, 1, 0, (1, 1)),
              (32, 2, 16, 1, (2, 0)), (33, 3, 1, 0, (2, 1))]


@pytest.mark.parametrize("prompt,blocks,last,new_blocks,where", BOUNDARIES)
def test_boundaries(prompt, blocks, last, new_blocks, where):
    m = BlockSpaceManager(num_blocks=8, block_size=16)
    table = m.allocate("s", prompt)
    assert len(table) == blocks and m.num_free_blocks == 8 - blocks
    assert table.filled(len(table) - 1) == last
    assert m.blocks_to_append("s") == new_blocks
    slot = m.append_slot("s")
    assert m.num_free_blocks == 8 - blocks - new_blocks
    table = m.block_table("s")
    logical, offset = where
    assert slot == table[logical] * 16 + offset
    assert table.locate(prompt) == where and m.num_tokens("s") == prompt + 1
    m.check()


def test_blocks_needed_is_a_ceiling():
    assert [blocks_needed(n, 16) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]


@pytest.mark.parametrize("tokens,bs,err,match", [
    (10, 0, ConfigError, "block_size must be an int >= 1, got 0"), (10, -4, ConfigError, "got -4"),
    (10, 2.0, ConfigError, "block_size must be an int >= \\d+, got 2.0"),
    (-5, 4, BlockError, "num_tokens must be an int >= 0, got -5"),
    (10.5, 4, BlockError, "num_tokens must be an int >= \\d+, got 10.5"), (True, 4, BlockError, "got True"),
])
def test_blocks_needed_rejects_bad_counts(tokens, bs, err, match):
    with pytest.raises(err, match=match):
        blocks_needed(tokens, bs)


@pytest.mark.parametrize("args,err,match", [
    ((4, [7, 1], 9), BlockError, "num_tokens=9 does not fit in 2 blocks x 4 slots = 8"),
    ((4, [-3, 1], 5), BlockError, "block id must be an int >= 0, got -3"),
    ((4, [7, 1.5], 5), BlockError, "block id must be an int >= \\d+, got 1.5"),
    ((4, [7], -1), BlockError, "num_tokens must be an int >= 0, got -1"),
    ((0, [7], 0), ConfigError, "block_size must be an int >= 1, got 0"),
])
def test_hand_built_block_table_is_validated(args, err, match):
    with pytest.raises(err, match=match):
        BlockTable(*args)


def test_hand_built_table_with_a_reserved_empty_block():
    t = BlockTable(4, [7, 1, 3], 4)               # blocks 1 and 3 reserved, still empty
    assert [t.filled(i) for i in range(3)] == [4, 0, 0] and t.slot(4) == 4


@pytest.mark.parametrize("bad", [["x"], {"x": 1}, 2.5, None, True])
def test_sequence_ids_are_validated_the_same_everywhere(bad):
    m = BlockSpaceManager(num_blocks=4, block_size=2)
    m.allocate("s", 1)
    calls = [lambda: m.allocate(bad, 1), lambda: m.free(bad), lambda: m.block_table(bad),
             lambda: m.append_slot(bad), lambda: m.fork("s", bad), lambda: m.fork(bad, "t")]
    for call in calls:
        with pytest.raises(BlockError, match="sequence id must be a str or an int"):
            call()
    assert bad not in m and m.seq_ids == ["s"] and m.num_free_blocks == 3


def test_no_block_is_taken_in_advance():
    m = BlockSpaceManager(num_blocks=4, block_size=4)
    m.allocate("s", 1)
    used = []
    for _ in range(15):
        m.append_slot("s")
        used.append(m.num_blocks - m.num_free_blocks)
    # tokens 2..16: a block per 4 tokens, the new one exactly when token 4k+1 arrives
    assert used == [blocks_needed(n, 4) for n in range(2, 17)]


def test_slot_mapping_is_physical_times_block_size_plus_offset():
    m = BlockSpaceManager(num_blocks=6, block_size=4, free_order=[5, 0, 3, 1, 2, 4])
    m.allocate("s", 10)
    assert m.block_table("s").block_ids == [5, 0, 3]
    assert m.slot_mapping("s") == [20, 21, 22, 23, 0, 1, 2, 3, 12, 13]
    assert m.slot_mapping("s", 3, 6) == [23, 0, 1]
    assert m.slot_mapping("s", 4, 4) == []
    with pytest.raises(BlockError):
        m.slot_mapping("s", 0, 11)


def test_out_of_blocks_leaves_state_unchanged():
    m = BlockSpaceManager(num_blocks=3, block_size=4)
    m.allocate("a", 8)
    before = state(m)
    assert not m.can_allocate(5)
    with pytest.raises(OutOfBlocksError) as e:
        m.allocate("b", 5)
    assert (e.value.needed, e.value.free) == (2, 1) and state(m) == before and "b" not in m
    m.allocate("b", 4)
    before = state(m)
    assert not m.can_append("a")
    with pytest.raises(OutOfBlocksError) as e:
        m.append_slot("a")
    assert (e.value.needed, e.value.free) == (1, 0) and state(m) == before
    assert m.can_append("b") is False and m.blocks_to_append("b") == 1
    m.check()


def test_free_returns_blocks_last_first_and_unknown_sequences_raise():
    m = BlockSpaceManager(num_blocks=4, block_size=2)
    m.allocate("s", 5)
    assert m.free("s") == [2, 1, 0]
    assert m.allocator.free_list() == [3, 2, 1, 0] and m.seq_ids == []
    for call in (m.free, m.block_table, m.append_slot, m.can_append):
        with pytest.raises(BlockError, match="unknown sequence"):
            call("s")


@pytest.mark.parametrize("bad", [0, -1, 2.5, None])
def test_prompt_lengths_must_be_positive_ints(bad):
    m = BlockSpaceManager(num_blocks=4, block_size=2)
    with pytest.raises(BlockError):
        m.allocate("s", bad)
    with pytest.raises(BlockError):
        m.can_allocate(bad)


def test_duplicate_sequence_ids_raise():
    m = BlockSpaceManager(num_blocks=4, block_size=2)
    m.allocate("s", 1)
    with pytest.raises(BlockError):
        m.allocate("s", 1)
    with pytest.raises(BlockError):
        m.fork("s", "s")


@pytest.mark.parametrize("bad", [0, -4, "16"])
def test_manager_rejects_bad_block_size(bad):
    with pytest.raises(ConfigError):
        BlockSpaceManager(4, bad)


# --- fork and copy-on-write -------------------------------------------------------------------
def test_fork_shares_blocks_and_copy_on_write_copies_the_partial_last_block():
    m = BlockSpaceManager(num_blocks=6, block_size=4)
    m.allocate("p", 6)                                  # blocks [0, 1]; block 1 holds 2 tokens
    m.fork("p", "c")
    assert m.block_table("c").block_ids == [0, 1] and m.num_free_blocks == 4
    assert [m.allocator.ref_count(b) for b in (0, 1)] == [2, 2]
    assert m.blocks_to_append("c") == 1                 # shared and partly filled: needs a copy
    slot = m.append_slot("c")
    assert m.block_table("c").block_ids == [0, 2] and slot == 2 * 4 + 2
    assert m.take_copies() == [(1, 2)] and m.take_copies() == []
    assert [m.allocator.ref_count(b) for b in (0, 1, 2)] == [2, 1, 1]
    assert m.blocks_to_append("p") == 0                 # the parent owns block 1 alone now
    assert m.append_slot("p") == 1 * 4 + 2 and m.take_copies() == []
    m.check()
    m.free("p")
    assert m.allocator.ref_count(0) == 1 and m.allocator.ref_count(1) == 0
    m.free("c")
    assert m.num_free_blocks == 6
    m.check()


def test_appending_after_a_full_shared_block_takes_a_new_block_without_copy():
    m = BlockSpaceManager(num_blocks=4, block_size=4)
    m.allocate("p", 4)
    m.fork("p", "c")
    assert m.append_slot("c") == 1 * 4 and m.take_copies() == []
    assert m.block_table("c").block_ids == [0, 1] and m.allocator.ref_count(0) == 2


def test_copy_on_write_out_of_blocks_changes_nothing():
    m = BlockSpaceManager(num_blocks=2, block_size=4)
    m.allocate("p", 2)
    m.fork("p", "c")
    m.allocate("x", 3)
    before = state(m)
    with pytest.raises(OutOfBlocksError):
        m.append_slot("c")
    assert state(m) == before and m.take_copies() == []


# --- the paper's Figures 6 and 7 --------------------------------------------------------------
def test_golden_trace_vllm_paper_figures_6_and_7():
    """Kwon et al., "Efficient Memory Management for LLM Serving with PagedAttention" (SOSP 2023),
    §4.3, with block size 4 and a pool of 9 physical blocks (the figures draw blocks 0..8), one
    word = one token.

    Figure 6 (request A): the prompt "Four score and seven years ago our" (7 tokens) maps
    logical blocks 0, 1 to physical blocks 7, 1 with 4 and 3 filled; decode step 1 ("fathers")
    fills block 1's last slot (#filled 3 -> 4, no new block); decode step 2 ("brought") takes a
    new physical block 3 for logical block 2.  Block table 7/4, 1/4, 3/1.
    Figure 7 adds request B, "It was the best" | "of times" (6 tokens): logical blocks 0, 1 on
    physical blocks 5, 2; physical blocks 0, 4, 6, 8 stay empty.  We reproduce every physical
    id of both figures: 7, 1, 3 (A) and 5, 2 (B).  The paper gives no allocation order, so we
    choose the free-list order 7, 1, 3, 5, 2, 0, 4, 6, 8 and let the real manager hand them out.
    """
    m = BlockSpaceManager(num_blocks=9, block_size=4, free_order=[7, 1, 3, 5, 2, 0, 4, 6, 8])
    words_a = "Four score and seven years ago our".split()
    assert m.allocate("A", len(words_a)).entries() == [(0, 7, 4), (1, 1, 3)]        # Fig. 6 step 1
    assert m.num_free_blocks == 7                                                  # nothing reserved
    assert m.append_slot("A") == 1 * 4 + 3                                         # "fathers": step 2
    assert m.block_table("A").entries() == [(0, 7, 4), (1, 1, 4)]
    assert m.append_slot("A") == 3 * 4 + 0                                         # "brought": step 3
    assert m.block_table("A").entries() == [(0, 7, 4), (1, 1, 4), (2, 3, 1)]
    words_b = "It was the best of times".split()
    assert m.allocate("B", len(words_b)).entries() == [(0, 5, 4), (1, 2, 2)]       # Fig. 7
    assert sorted(m.allocator.free_list()) == [0, 4, 6, 8]
    m.check()


def test_default_free_order_gives_different_ids_than_the_figures():
    """The ids depend on the free-list order: with 0, 1, 2, ... request A lands on 0, 1, 2."""
    m = BlockSpaceManager(num_blocks=9, block_size=4)
    m.allocate("A", 7), m.append_slot("A"), m.append_slot("A")
    assert m.block_table("A").block_ids == [0, 1, 2]


# --- each manager check fires -----------------------------------------------------------------
def _corrupt_manager(kind: str) -> BlockSpaceManager:
    m = BlockSpaceManager(num_blocks=6, block_size=4)
    m.allocate("a", 6)            # [0, 1]
    m.fork("a", "b")              # shares 0, 1
    m.allocate("c", 3)            # [2]
    t = m._tables
    if kind == "too many blocks":
        t["c"].block_ids.append(m.allocator.allocate())
    elif kind == "held twice":
        m.allocator.free(2), m.allocator.share(0)
        t["c"].block_ids[0] = 0
        t["c"].block_ids.append(0), m.allocator.share(0)
        t["c"].num_tokens = 5
    elif kind == "ref count":
        m.allocator.share(2)
    elif kind == "free block in table":
        m.allocator.free(2)
    elif kind == "uneven share":
        t["b"].num_tokens = 7
    return m


@pytest.mark.parametrize("kind,match", [("too many blocks", "holds 2 blocks for 3"),
                                        ("held twice", "holds a block twice"),
                                        ("ref count", "ref count 2 but 1"),
                                        ("free block in table", "ref count 0 but 1"),
                                        ("uneven share", "different token counts")])
def test_each_manager_check_fires(kind, match):
    _corrupt_manager("none").check()
    with pytest.raises(BlockError, match=match):
        _corrupt_manager(kind).check()


# --- the state machine ------------------------------------------------------------------------
class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / append / fork / truncate / free against a model of what each sequence holds.

    A dict stands for the KV cache (slot -> token value): every token a sequence writes goes to
    its slot, copy-on-write copies are applied as the real cache must, and after every step each
    sequence must read back exactly its own tokens through its block table.  That proves no two
    sequences ever write one slot, and that sharing + copy-on-write is correct.
    """

    NB, BS = 12, 4

    def __init__(self):
        super().__init__()
        self.m = BlockSpaceManager(self.NB, self.BS)
        self.tokens: dict[int, list[int]] = {}   # the model: each sequence's token values
        self.cache: dict[int, int] = {}          # slot -> token value written there
        self.next_id, self.next_token = 0, 0

    def _new_tokens(self, n):
        self.next_token += n
        return list(range(self.next_token - n, self.next_token))

    def _apply_copies(self):
        for src, dst in self.m.take_copies():
            for off in range(self.BS):
                if src * self.BS + off in self.cache:
                    self.cache[dst * self.BS + off] = self.cache[src * self.BS + off]

    @rule(n=st.integers(1, 20))
    def allocate(self, n):
        seq, before = self.next_id, state(self.m)
        if blocks_needed(n, self.BS) > self.m.num_free_blocks:
            assert not self.m.can_allocate(n)
            with pytest.raises(OutOfBlocksError):
                self.m.allocate(seq, n)
            assert state(self.m) == before
            return
        assert self.m.can_allocate(n)
        self.m.allocate(seq, n)
        self.next_id += 1
        self.tokens[seq] = self._new_tokens(n)
        for slot, tok in zip(self.m.slot_mapping(seq), self.tokens[seq]):
            self.cache[slot] = tok

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def append(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        before = state(self.m)
        if not self.m.can_append(seq):
            with pytest.raises(OutOfBlocksError):
                self.m.append_slot(seq)
            assert state(self.m) == before
            return
        free_before = self.m.num_free_blocks
        expect_new = self.m.blocks_to_append(seq)
        slot = self.m.append_slot(seq)
        assert self.m.num_free_blocks == free_before - expect_new
        self._apply_copies()
        (tok,) = self._new_tokens(1)
        self.tokens[seq].append(tok)
        self.cache[slot] = tok

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def decode_step(self, data):
        """One token for several sequences at once, as a decode step does: the manager's count of
        blocks it takes is exact and all-or-nothing; optionally a sequence is freed (a preemption
        mid-step) or truncated below this step's token (a rejected draft) before the cache applies
        the copies: a queued copy into a block that went back to the free list must be dropped."""
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.tokens)), min_size=1, unique=True))
        needed = self.m.blocks_to_append_all(seqs)
        free_before = self.m.num_free_blocks
        if needed > free_before:
            return                                            # a caller checks before appending
        slots = {s: self.m.append_slot(s) for s in seqs}
        assert self.m.num_free_blocks == free_before - needed
        for s, slot in slots.items():                         # never a write into a shared block
            assert self.m.allocator.ref_count(slot // self.BS) == 1, f"{s} writes into a shared block"
        for s in seqs:
            (tok,) = self._new_tokens(1)
            self.tokens[s].append(tok)
        victim = data.draw(st.none() | st.sampled_from(seqs))
        if victim is not None and len(self.tokens[victim]) > 1 and data.draw(st.booleans()):
            n = data.draw(st.integers(1, len(self.tokens[victim]) - 1))   # a rejected draft: taken back
            if self._may_truncate(victim, n):
                self.m.truncate(victim, n)
                del self.tokens[victim][n:]
                del slots[victim]
        elif victim is not None:
            self.m.free(victim)
            del self.tokens[victim]
            del slots[victim]
        self.m.check()                                        # no queued copy into a freed block
        self._apply_copies()
        for s, slot in slots.items():
            self.cache[slot] = self.tokens[s][-1]

    def _may_truncate(self, seq, n) -> bool:
        """Whether ``truncate(seq, n)`` is allowed; if not (a cut inside a registered block), check
        that it raises and changes nothing."""
        keep = blocks_needed(n, self.BS)
        last = self.m.block_table(seq).block_ids[keep - 1]
        if self.m.cache is None or n % self.BS == 0 or last not in self.m.cache:
            return True
        before = state(self.m)
        with pytest.raises(BlockError, match="registered in the prefix cache"):
            self.m.truncate(seq, n)
        assert state(self.m) == before
        return False

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def truncate(self, data):
        """Roll a sequence back (rejected draft tokens): the blocks past the cut lose a holder, the
        returned ids are exactly those whose count reached 0, last logical block first, each now on
        the free list; the kept blocks are the table's first ones; a no-op cut changes nothing."""
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        n = data.draw(st.integers(1, len(self.tokens[seq])))
        if not self._may_truncate(seq, n):
            return
        table, free_before, before = self.m.block_table(seq), self.m.num_free_blocks, state(self.m)
        keep = blocks_needed(n, self.BS)
        freed = self.m.truncate(seq, n)
        assert freed == [b for b in reversed(table.block_ids[keep:]) if self.m.allocator.ref_count(b) == 0]
        assert self.m.num_free_blocks == free_before + len(freed)
        assert set(freed) <= set(self.m.allocator.free_list())
        assert self.m.block_table(seq).block_ids == table.block_ids[:keep]
        if n == len(self.tokens[seq]):
            assert freed == [] and state(self.m) == before
        del self.tokens[seq][n:]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.tokens)))
        free_before = self.m.num_free_blocks
        self.m.fork(parent, self.next_id)
        assert self.m.num_free_blocks == free_before          # sharing costs no block
        self.tokens[self.next_id] = list(self.tokens[parent])
        self.next_id += 1

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)))
        self.m.free(seq)
        del self.tokens[seq]
        with pytest.raises(BlockError):
            self.m.free(seq)                                  # a second free is an error

    @invariant()
    def every_invariant_holds(self):
        self.m.check()
        tables = {s: self.m.block_table(s) for s in self.tokens}
        assert set(self.m.seq_ids) == set(self.tokens)
        held = [b for t in tables.values() for b in t.block_ids]
        for b in range(self.NB):                              # ref count == tables holding it
            assert self.m.allocator.ref_count(b) == held.count(b)
        assert self.m.num_free_blocks == self.NB - len(set(held))   # free + used == total, no leak
        for s, toks in self.tokens.items():
            t = tables[s]
            assert t.num_tokens == len(toks) and len(t) == blocks_needed(len(toks), self.BS)
            assert self.m.wasted_slots(s) <= self.BS - 1
            assert [self.cache[slot] for slot in self.m.slot_mapping(s)] == toks

    def teardown(self):
        for s in list(self.tokens):
            self.m.free(s)
        assert self.m.num_free_blocks == self.NB                  # everything came back
        self.m.check()


BlockManagerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_block_manager_state_machine = BlockManagerMachine.TestCase
