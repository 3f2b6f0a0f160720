"""KV memory policies: reservations, placement, on-demand blocks, and invariants under random use."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import paged_kv  # noqa: F401
from paged_kv.errors import BlockError, ConfigError, OutOfBlocksError
from paged_kv.sim import (CATEGORIES, OrcaMax, OrcaOracle, OrcaPow2, PagedPolicy, make_policy)


def cats(policy, head=None):
    return dict(zip(CATEGORIES, [*policy.totals(), *policy.split_free(head)]))


def test_reservations():
    assert OrcaMax(10_000, 2048).reservation(5, 3) == 2048
    # the paper's example: an output of 25 tokens reserves 32 output slots
    assert OrcaPow2(10_000, 2048).reservation(100, 25) == 132
    assert OrcaPow2(10_000, 2048).reservation(100, 32) == 132
    assert OrcaPow2(10_000, 2048).reservation(1100, 900) == 2048  # capped at max_seq_len
    assert OrcaOracle(10_000, 2048).reservation(100, 25) == 125


def test_first_fit_leaves_a_hole_best_fit_does_not():
    """Holes [0,4) and [6,9): a 3-slot request then a 4-slot one."""
    def fragmented(placement):
        pol = OrcaOracle(10, 10, placement=placement)
        for rid, size in enumerate([4, 2, 3, 1]):  # regions [0,4) [4,6) [6,9) [9,10)
            pol.admit(rid, size - 1, 1, 0)
        pol.free(0), pol.free(2)
        assert pol.holes == [[0, 4], [6, 3]]
        pol.admit(10, 2, 1, 0)  # 3 slots
        return pol
    ff, bf = fragmented("first-fit"), fragmented("best-fit")
    assert ff.regions[10] == (0, 3) and bf.regions[10] == (6, 3)
    # first-fit: 4 slots free ([3,4) and [6,9)) but no 4-slot hole: external fragmentation
    assert not ff.can_admit(3, 1) and cats(ff, head=4)["external"] == 4 and cats(ff, head=4)["free"] == 0
    assert bf.can_admit(3, 1)
    ff.check(head_need=4), bf.check(head_need=4)


def test_free_coalesces_holes():
    pol = OrcaOracle(12, 12, placement="first-fit")
    for rid in range(4):
        pol.admit(rid, 2, 1, 0)  # [0,3) [3,6) [6,9) [9,12)
    pol.free(1), pol.free(3)
    assert pol.holes == [[3, 3], [9, 3]]
    pol.free(2)  # merges with both neighbours
    assert pol.holes == [[3, 9]]
    pol.free(0)
    assert pol.holes == [[0, 12]]


def test_contiguous_categories_while_growing():
    pol = OrcaPow2(20, 16, placement="first-fit")
    pol.admit(0, 3, 5, step=0)  # reserves 3 + 8 = 11, final length 8
    assert cats(pol) == dict(token_states=4, reserved=4, internal=3, external=0, free=9)
    for s in (1, 2, 3, 4):
        pol.append(s)
    assert pol.length(0) == 8 and cats(pol)["reserved"] == 0 and cats(pol)["internal"] == 3
    assert cats(pol, head=16)["external"] == 9  # the 9-slot hole cannot take a 16-slot region
    pol.check(head_need=16)


@pytest.mark.parametrize("prompt, blocks", [(14, 1), (15, 1), (16, 2), (31, 2), (32, 3)])
def test_paged_admission_blocks(prompt, blocks):
    """After its admission step a request holds prompt + 1 tokens: ceil((p + 1) / 16) blocks."""
    pol = PagedPolicy(16 * 8, block_size=16, watermark=0.0)
    pol.admit(0, prompt, 50, step=0)
    assert len(pol.tables[0]) == blocks
    assert cats(pol)["internal"] + cats(pol)["reserved"] == 16 * blocks - (prompt + 1)


def test_paged_grows_one_block_when_the_last_is_full():
    pol = PagedPolicy(12, block_size=4, watermark=0.0)
    pol.admit(0, 3, 3, step=0)  # 4 tokens: one full block; final length 6
    assert cats(pol) == dict(token_states=4, reserved=0, internal=0, external=0, free=8)
    assert pol.shortfall(1) == 0
    pol.append(1)  # 5 tokens: a second block
    assert pol.tables[0] == [0, 1]
    assert cats(pol) == dict(token_states=5, reserved=1, internal=2, external=0, free=4)
    pol.append(2)  # 6 tokens: no new block
    assert pol.tables[0] == [0, 1] and cats(pol)["internal"] == 2 and cats(pol)["reserved"] == 0
    pol.check()
    pol.free(0)
    assert pol.num_free_blocks == 3 and cats(pol)["free"] == 12


def test_paged_leftover_slots_are_external():
    pol = PagedPolicy(10, block_size=4)
    assert pol.num_blocks == 2 and cats(pol) == dict(token_states=0, reserved=0, internal=0, external=2, free=8)
    pol.check()


def test_paged_watermark_gates_admission():
    pol = PagedPolicy(16 * 100, block_size=16, watermark=0.05)  # keeps 5 blocks free at admission
    assert pol.watermark_blocks == 5
    assert pol.can_admit(16 * 95 - 1, 1) and not pol.can_admit(16 * 95, 1)


def test_paged_shortfall_and_refusal():
    pol = PagedPolicy(8, block_size=4, watermark=0.0)
    pol.admit(0, 3, 5, 0), pol.admit(1, 3, 5, 0)  # both full after step 0; no block left
    assert pol.shortfall(1) == 2
    with pytest.raises(OutOfBlocksError):
        pol.append(1)
    assert pol.length(0) == 4  # state unchanged by the refused append


def test_misuse_raises():
    pol = OrcaOracle(10, 10, placement="first-fit")
    pol.admit(0, 4, 1, 0)
    with pytest.raises(BlockError):
        pol.admit(0, 1, 1, 0)
    with pytest.raises(BlockError):
        pol.free(5)
    with pytest.raises(OutOfBlocksError):
        pol.admit(1, 5, 2, 0)
    with pytest.raises(ConfigError, match="placement"):
        OrcaMax(10, 4, placement="worst-fit")
    with pytest.raises(ConfigError, match="block_size"):
        PagedPolicy(10, block_size=0)
    with pytest.raises(ConfigError, match="pool_slots"):
        PagedPolicy(0)
    with pytest.raises(ConfigError, match="unknown policy"):
        make_policy("fifo", 10)
    with pytest.raises(ConfigError, match="bad arguments"):
        make_policy("max", 10, block_size=4)


def test_counts_accept_numpy_ints_reject_bools_floats_and_strings():
    assert OrcaMax(np.int64(10), np.int32(4)).reservation(1, 1) == 4
    pol = PagedPolicy(np.int64(64), block_size=np.int16(8), watermark=np.float64(0.05))
    assert (pol.block_size, pol.num_blocks, pol.watermark_blocks) == (8, 8, 0)
    for kw, what in ((dict(block_size=True), "block_size"), (dict(block_size=4.0), "block_size"),
                     (dict(watermark="0.01"), "watermark"), (dict(watermark=float("nan")), "watermark"),
                     (dict(watermark=1.0), "watermark"), (dict(watermark=-0.1), "watermark"),
                     (dict(watermark=True), "watermark")):
        with pytest.raises(ConfigError, match=what):
            PagedPolicy(64, **kw)
    for args in ((10.0,), (True,), (10, 4.0), ("10",)):
        with pytest.raises(ConfigError):
            OrcaOracle(*args)
    with pytest.raises(ConfigError, match="policy name"):
        make_policy(3, 10)


def test_make_policy_names():
    assert isinstance(make_policy("Orca (Max)", 10, 4), OrcaMax)
    assert isinstance(make_policy("orca-pow2", 10, 4), OrcaPow2)
    assert isinstance(make_policy("oracle", 10, 4, placement="best-fit"), OrcaOracle)
    assert make_policy("paged", 64, 16, block_size=8).block_size == 8


def test_check_fires_on_corruption():
    pol = OrcaOracle(10, 10, placement="first-fit")
    pol.admit(0, 2, 2, 0), pol.admit(1, 2, 2, 0)
    pol.regions[1] = (2, 4)  # overlaps request 0's [0, 4)
    with pytest.raises(BlockError, match="already owned"):
        pol.check()
    pag = PagedPolicy(16, block_size=4, watermark=0.0)
    pag.admit(0, 2, 5, 0)
    pag.sum_len += 1  # a drifted running sum
    with pytest.raises(BlockError, match="running sums"):
        pag.check()
    pag.sum_len -= 1
    pag.tables[0].append(pag._free.popleft())  # a block held in advance breaks the BS - 1 bound
    pag.sum_alloc += 4
    pag.sum_cap += min(8, 7) - min(4, 7)
    with pytest.raises(BlockError, match="bound"):
        pag.check()


# --- random use: every invariant after every operation --------------------------------------
POLICY_MAKERS = {
    "max": lambda: OrcaMax(64, 16),
    "pow2": lambda: OrcaPow2(64, 16, placement="best-fit"),
    "oracle": lambda: OrcaOracle(64, 16, placement="first-fit"),
    "oracle-buddy": lambda: OrcaOracle(64, 16),
    "pow2-buddy": lambda: OrcaPow2(60, 16),
    "paged": lambda: PagedPolicy(64, 16, block_size=4, watermark=0.0),
    "paged-odd": lambda: PagedPolicy(63, 16, block_size=5, watermark=0.0),
}


@pytest.mark.parametrize("kind", sorted(POLICY_MAKERS))
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["admit", "step", "free"]), st.integers(1, 8),
                              st.integers(1, 8), st.integers(0, 10)), max_size=40))
def test_invariants_under_random_operations(kind, ops):
    pol = POLICY_MAKERS[kind]()
    final, step, rid = {}, 0, 0
    for op, p, o, pick in ops:
        if op == "admit" and pol.fits(p, o) and pol.can_admit(p, o):
            pol.admit(rid, p, o, step)
            final[rid] = p + o
            rid += 1
        elif op == "step":
            step += 1
            while pol.shortfall(step):  # preempt the newest, as the scheduler does
                victim = max(pol.running())
                pol.free(victim)
                del final[victim]
            pol.append(step)
        elif op == "free" and final:
            victim = sorted(final)[pick % len(final)]
            pol.free(victim)
            del final[victim]
        for r in [r for r in final if pol.length(r) == final[r]]:  # finished: freed at once
            pol.free(r)
            del final[r]
        # no two requests own a slot; every slot id is inside the pool
        owned = np.concatenate([np.zeros(0, np.int64), *pol.owned_slots().values()])
        assert len(np.unique(owned)) == len(owned) and (owned < pol.pool_slots).all() and (owned >= 0).all()
        # the categories sum to the pool, and agree with a slot-by-slot recount
        c = cats(pol, head=4)
        assert sum(c.values()) == pol.pool_slots and min(c.values()) >= 0
        pol.check(head_need=4)
        for r in final:
            assert pol.length(r) <= final[r]
            if isinstance(pol, PagedPolicy):
                assert len(pol.tables[r]) * pol.block_size - pol.length(r) <= pol.block_size - 1
