"""Sharing in the simulator (paged_kv.sim.sharing): the block formulas against the real block
manager, the Figure 15 metric by hand, and groups served by simulate()."""

import numpy as np
import pytest

from paged_kv.blocks import BlockSpaceManager
from paged_kv.errors import ConfigError
from paged_kv.sim import OrcaOracle, simulate, trace_from_rows
from paged_kv.sim.sharing import GroupContiguousPolicy, SharedPagedPolicy, Sharing, group_blocks, memory_saving


def _manager_blocks(P, O, n, bs):
    """Blocks n parallel samples hold after each step, from the real manager: the prompt prefilled
    once, n - 1 forks, then every sample appends one token per step (the first step's token is the
    prefill's own, the simulator's convention: a request holds P + 1 tokens after admission)."""
    m = BlockSpaceManager(64, bs)
    m.allocate(0, P)
    for j in range(1, n):
        m.fork(0, j)
    held = []
    for _ in range(O):
        for j in range(n):
            m.append_slot(j)
        m.take_copies()
        held.append(m.allocator.num_used_blocks)
    return held


@pytest.mark.parametrize("P,O,n,bs", [(10, 9, 3, 4), (16, 5, 2, 16), (3, 12, 4, 4), (33, 20, 6, 16), (7, 3, 1, 4)])
def test_parallel_formula_equals_the_real_manager(P, O, n, bs):
    lengths = np.arange(P + 1, P + O + 1)
    assert group_blocks(P, lengths, Sharing("parallel", n), bs).tolist() == _manager_blocks(P, O, n, bs)


def test_formulas_by_hand():
    # prompt 10, block size 4: two full blocks shared; at 15 tokens each sample holds blocks 2, 3
    assert group_blocks(10, 15, Sharing("parallel", 3), 4) == 2 + 3 * 2
    assert group_blocks(10, 15, Sharing("none", 3), 4) == 3 * 4
    # beams share the full blocks of their common prefix max(P, L - d): L = 30, d = 6 -> 24 tokens
    assert group_blocks(10, 30, Sharing("beam", 4, 6), 4) == 6 + 4 * (8 - 6)
    assert group_blocks(10, 10, Sharing("parallel", 3), 4) == 3        # nobody has written yet


def test_memory_saving_by_hand():
    # one request, P = 4, O = 3, block size 4, n = 2: lengths 5, 6, 7 -> with sharing 1 + 2 = 3
    # blocks each step, without 2 * 2 = 4: saving 1 - 9/12 = 25%
    trace = trace_from_rows([(0, 4, 3)])
    assert memory_saving(trace, Sharing("parallel", 2), 4) == pytest.approx(0.25)
    assert memory_saving(trace, Sharing("none", 2), 4) == 0.0


@pytest.mark.parametrize("sharing", [Sharing("parallel", 3), Sharing("beam", 4, 5), Sharing("beam", 6, 0),
                                     Sharing("none", 2), Sharing("parallel", 1)])
def test_the_policys_int_formulas_equal_group_blocks(sharing):
    pol = SharedPagedPolicy(10_000, 256, 4, sharing, watermark=0.0)
    P = np.repeat(np.arange(1, 21), 30)
    L = P + np.tile(np.arange(30), 20)
    expect = group_blocks(P, L, sharing, 4).tolist()
    assert [pol._blocks(p, n) for p, n in zip(P.tolist(), L.tolist())] == expect


@pytest.mark.parametrize("sharing", [Sharing("parallel", 3), Sharing("beam", 4, 5), Sharing("none", 2)])
def test_simulated_groups_hold_what_the_formulas_say(sharing):
    trace = trace_from_rows([(0, 10, 12), (1, 18, 7), (3, 5, 9), (3, 30, 4)])
    res = simulate(trace, SharedPagedPolicy(400, 128, 4, sharing, watermark=0.0), check=True)
    first = res.first_admit_s.astype(int)
    for step, t in enumerate(res.steps["time_s"].astype(int)):
        expect = 0
        for i in range(len(trace)):
            P, O = int(trace.prompt_len[i]), int(trace.output_len[i])
            if first[i] <= t < first[i] + O:
                expect += int(group_blocks(P, P + 1 + t - first[i], sharing, 4))
        held = res.steps["token_states"][step] + res.steps["reserved"][step] + res.steps["internal"][step]
        assert held == expect * 4, f"step {step}"


def test_preempted_groups_come_back_with_their_sharing():
    trace = trace_from_rows([(0, 9, 14), (0, 9, 14), (0, 9, 14)])
    res = simulate(trace, SharedPagedPolicy(48, 64, 4, Sharing("parallel", 2), watermark=0.0), check=True)
    assert res.preemptions.sum() > 0 and np.isfinite(res.finish_s).all()


def test_orca_groups_reserve_one_region_per_sequence():
    trace = trace_from_rows([(0, 5, 3)])
    wide = GroupContiguousPolicy(100, 64, "oracle", 3)
    res = simulate(trace, wide)
    one = simulate(trace, OrcaOracle(100, 64))
    assert res.steps["token_states"].tolist() == [3 * x for x in one.steps["token_states"].tolist()]
    held = res.steps["token_states"] + res.steps["reserved"] + res.steps["internal"]
    assert held.tolist() == [3 * 8] * 3
    assert wide.prefill_tokens(5) == 15 and SharedPagedPolicy(100, 64, 4, Sharing("parallel", 3)).prefill_tokens(5) == 5


def test_bad_sharing_raises():
    with pytest.raises(ConfigError, match="mode"):
        Sharing("tree", 2)
    with pytest.raises(ConfigError, match="width"):
        Sharing("parallel", 0)
    with pytest.raises(ConfigError, match="base"):
        GroupContiguousPolicy(100, 64, "paged", 2)
    with pytest.raises(ConfigError, match="slot-by-slot"):
        simulate(trace_from_rows([(0, 3, 2)]), SharedPagedPolicy(100, 64, 4, Sharing("parallel", 2)), layouts=1)
