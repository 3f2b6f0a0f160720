"""The binary buddy allocator (the paper's Orca baseline, §6.1) and the Orca policies placed by it."""

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from paged_kv.errors import BlockError, ConfigError, OutOfBlocksError
from paged_kv.sim import CATEGORIES, BuddyAllocator, OrcaMax, OrcaOracle, OrcaPow2, make_policy, next_pow2


def test_next_pow2():
    assert [next_pow2(n) for n in (1, 2, 3, 4, 5, 8, 9, 1000, 1025)] == [1, 2, 4, 4, 8, 8, 16, 1024, 2048]


def test_hand_checked_trace():
    """16 slots, one root of 16.  Worked by hand:
    place(3): 16@0 -> keep 8@0 (free 8@8) -> keep 4@0 (free 4@4): block [0, 4)
    place(5): a free 8 exists: [8, 16)
    place(1): smallest free is 4@4 -> 2@4 (free 2@6) -> 1@4 (free 1@5): block [4, 5)
    release(0): its buddy 4@4 is split, so [0, 4) stays alone
    release(4): 1@4 + 1@5 -> 2@4; + 2@6 -> 4@4; + 4@0 -> 8@0; 8@8 is allocated: stop."""
    b = BuddyAllocator(16, 16)
    assert b.place(3) == (0, 4)
    assert b.place(5) == (8, 8)
    assert b.place(1) == (4, 1)
    assert b.free_runs() == [(5, 1), (6, 2)]
    b.release(0)
    assert b.free_runs() == [(0, 4), (5, 1), (6, 2)]
    b.release(4)
    assert b.free_runs() == [(0, 8)]
    assert not b.can_place(9) and b.can_place(8)
    b.release(8)
    assert b.free_runs() == [(0, 16)]
    b.check()


def test_paper_pool_roots():
    """15,728 slots with 2,048-slot blocks: 7 roots of 2,048 (14,336) and the rest, 1,392 =
    1024 + 256 + 64 + 32 + 16, as smaller roots that never merge."""
    b = BuddyAllocator(15_728, 2048)
    assert b.roots[:7] == [(2048 * i, 2048) for i in range(7)]
    assert [n for _, n in b.roots[7:]] == [1024, 256, 64, 32, 16]
    assert sum(n for _, n in b.roots) == 15_728
    assert b.largest_block == 2048
    assert b.place(2000) == (0, 2048)
    b.check()


def test_largest_block_capped_by_pool_and_roots_do_not_merge():
    b = BuddyAllocator(10, 16)  # no 16-slot block fits: roots 8@0 and 2@8
    assert b.roots == [(0, 8), (8, 2)] and b.largest_block == 8
    assert b.place(2) == (8, 2)  # the smallest block that fits, not the lowest address
    b.release(8)
    assert b.free_runs() == [(0, 8), (8, 2)]  # 2@8 is a root: no buddy to merge with


def test_errors_and_no_change_on_failure():
    b = BuddyAllocator(8, 8)
    b.place(5)
    before = b.free_runs()
    with pytest.raises(OutOfBlocksError) as e:
        b.place(1)
    assert (e.value.needed, e.value.free) == (1, 0) and b.free_runs() == before
    with pytest.raises(BlockError, match="slot 3"):
        b.release(3)
    with pytest.raises(ConfigError):
        BuddyAllocator(0, 8)
    with pytest.raises(ConfigError):
        b.place(0)


def test_check_fires_on_corruption():
    b = BuddyAllocator(16, 16)
    b.place(3), b.place(3)  # [0, 4) [4, 8); free 8@8
    b.free_sets[4] = {0}  # a free block over an allocated one
    with pytest.raises(BlockError, match="two blocks"):
        b.check()
    b = BuddyAllocator(16, 16)
    b.place(8)
    b.free_sets[8].discard(8)  # a free block lost
    with pytest.raises(BlockError, match="cover|lost"):
        b.check()
    b = BuddyAllocator(16, 16)
    b.free_sets = {8: {0, 8}}  # two free buddies not merged
    with pytest.raises(BlockError, match="not merged"):
        b.check()
    b = BuddyAllocator(16, 16)
    b.free_sets = {16: set(), 6: {0}, 10: {6}}  # not powers of two
    with pytest.raises(BlockError, match="power of two"):
        b.check()


class BuddyMachine(RuleBasedStateMachine):
    """Random place/release; a dict of allocated intervals stands in for the pool."""

    def __init__(self):
        super().__init__()
        self.b = BuddyAllocator(40, 16)  # roots 16@0, 16@16, 8@32
        self.held: dict[int, tuple[int, int]] = {}  # start -> (asked, block)

    @rule(n=st.integers(1, 20))
    def place(self, n):
        want = next_pow2(n)
        possible = any(size >= want for _, size in self.b.free_runs())  # independent of place()
        assert self.b.can_place(n) == possible
        if not possible:
            with pytest.raises(OutOfBlocksError):
                self.b.place(n)
            return
        start, block = self.b.place(n)
        assert block == want and start % block == 0 and start + block <= 40
        for s, (_, blk) in self.held.items():  # no overlap with any held block
            assert start + block <= s or s + blk <= start
        self.held[start] = (n, block)

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 100))
    def release(self, pick):
        start = sorted(self.held)[pick % len(self.held)]
        self.b.release(start)
        del self.held[start]

    @invariant()
    def consistent(self):
        self.b.check()
        free = sum(n for _, n in self.b.free_runs())
        assert free + sum(blk for _, blk in self.held.values()) == 40
        if not self.held:  # everything merged back into the roots
            assert self.b.free_runs() == [(0, 16), (16, 16), (32, 8)]


TestBuddyMachine = BuddyMachine.TestCase
TestBuddyMachine.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)


# --- the Orca policies on the buddy allocator -------------------------------------------------
def cats(policy, head=None):
    return dict(zip(CATEGORIES, [*policy.totals(), *policy.split_free(head)]))


def test_buddy_is_the_default_and_rounding_counts_as_external():
    pol = OrcaOracle(16, 16)
    assert pol.placement == "buddy" and make_policy("pow2", 16, 16).placement == "buddy"
    pol.admit(0, 2, 3, step=0)  # reservation 5, block 8: 3 slots hold nothing and never will
    assert pol.blocks[0] == 8 and pol.regions[0] == (0, 5)
    # token states 3 (prompt + first token), reserved 2, internal 0 (exact reservation),
    # external 3 (the rounding), free 8 (the buddy [8, 16))
    assert cats(pol) == dict(token_states=3, reserved=2, internal=0, external=3, free=8)
    # a head needing 9 slots needs a 16-slot block: the free 8 is external too
    assert cats(pol, head=9) == dict(token_states=3, reserved=2, internal=0, external=11, free=0)
    pol.check(head_need=9)
    owner, cat = pol.layout()
    assert owner.tolist() == [0] * 5 + [-1] * 11
    assert cat[5:8].tolist() == [CATEGORIES.index("external")] * 3


def test_buddy_refuses_what_first_fit_admits():
    """Exact sizes 5 + 5 + 5 fit 16 slots first-fit; buddy rounds each to 8 and fits two."""
    ff, bd = OrcaOracle(16, 16, placement="first-fit"), OrcaOracle(16, 16)
    for pol in (ff, bd):
        pol.admit(0, 4, 1, 0), pol.admit(1, 4, 1, 0)
    assert ff.can_admit(4, 1) and not bd.can_admit(4, 1)


def test_fits_uses_the_rounded_block():
    # max length 12: the largest block is 16 but the pool of 12 holds roots 8 and 4 only
    assert not OrcaOracle(12, 12).fits(5, 4)  # 9 slots need a 16-slot block
    assert OrcaOracle(12, 12, placement="first-fit").fits(5, 4)
    assert OrcaMax(16, 8).fits(1, 1) and OrcaPow2(16, 8).fits(3, 5)


def test_borders():
    pol = OrcaOracle(16, 16)
    pol.admit(0, 2, 1, 0), pol.admit(1, 1, 1, 0)  # 3 -> [0, 4); 2 -> [4, 6)
    assert pol.borders().tolist() == [0, 3, 4, 6, 8]  # region 0, its unused slot, region 1, the free 2 and 8
    assert np.array_equal(pol.owned_slots()[1], [4, 5])


@pytest.mark.parametrize("name", ["pow2", "oracle"])
def test_buddy_invariants_at_every_step_of_a_realistic_trace(name):
    """ShareGPT-like lengths in a 3 GiB pool (3,932 slots: roots 2,048, 1,024, 512, 256, 64, 16, 8,
    4): the layout recount and the buddy invariants hold after every step, and rounding shows up."""
    from paged_kv.sim import PAPER_SETUP, ServingSetup
    import dataclasses
    setup = dataclasses.replace(PAPER_SETUP, kv_gib=3.0, num_requests=20, rate_per_s=20.0)
    assert [n for _, n in BuddyAllocator(setup.pool_slots, 2048).roots] == [2048, 1024, 512, 256, 64, 16, 8, 4]
    res = setup.run(name, check=True)
    assert res.mean_batch() > 1 and (res.finish_s > 0).all()
    assert res.time_average("external") > 0
