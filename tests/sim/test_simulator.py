"""The step simulator: hand-computed traces per policy, invariants at every step, the paper's set-up."""

import dataclasses

import numpy as np
import pytest

import paged_kv  # noqa: F401
from paged_kv.errors import ConfigError
from paged_kv.sim import CATEGORIES, OrcaMax, OrcaOracle, OrcaPow2, PagedPolicy
from paged_kv.sim import (FIG2_SEGMENTS, PAPER_RESULTS, PAPER_SETUP, ServingSetup, comparison_rows, fig2_rows,
                          format_table)
from paged_kv.sim import IterationTime, simulate
from paged_kv.sim import synthetic_trace, trace_from_rows


def row(res, step):
    return {c: int(res.steps[c][step]) for c in CATEGORIES}


def test_first_fit_hole_blocks_a_request():
    """Pool of 10, exact reservations: [0,3) and [6,8) finish first, leaving holes of 3 and 4.
    A 5-slot request then waits although 7 slots are free: external fragmentation."""
    tr = trace_from_rows([(0, 2, 1), (0, 1, 2), (0, 1, 1), (1, 3, 2)])
    res = simulate(tr, OrcaOracle(10, 10, placement="first-fit"), check=True, layouts=1)
    assert row(res, 0) == dict(token_states=7, reserved=1, internal=0, external=0, free=2)
    assert row(res, 1) == dict(token_states=3, reserved=0, internal=0, external=7, free=0)
    assert res.steps["waiting"][1] == 1 and res.steps["running"][1] == 1
    assert res.steps["admitted"].tolist() == [3, 0, 1, 0]
    assert row(res, 2) == dict(token_states=4, reserved=1, internal=0, external=0, free=5)
    assert res.layouts[1].category.tolist() == [3, 3, 3, 0, 0, 0, 3, 3, 3, 3]  # 3 = external
    assert res.layouts[2].owner.tolist() == [3] * 5 + [-1] * 5  # first fit: address 0
    assert res.finish_s.tolist() == [1.0, 2.0, 1.0, 4.0]


def test_orca_max_reserves_the_maximum():
    tr = trace_from_rows([(0, 1, 1)] * 3)
    res = simulate(tr, OrcaMax(10, 4), check=True)
    # two 4-slot regions, each holding 2 tokens; the 2-slot tail cannot take a third region
    assert row(res, 0) == dict(token_states=4, reserved=0, internal=4, external=2, free=0)
    assert row(res, 1) == dict(token_states=2, reserved=0, internal=2, external=0, free=6)


def test_orca_pow2_internal_fragmentation():
    tr = trace_from_rows([(0, 3, 5), (0, 2, 9)])
    res = simulate(tr, OrcaPow2(20, 16, placement="first-fit"), check=True)
    # request 0 reserves 3 + 8 = 11 for a final length 8; request 1 wants min(16, 2 + 16) = 16
    assert row(res, 0) == dict(token_states=4, reserved=4, internal=3, external=9, free=0)
    assert row(res, 4) == dict(token_states=8, reserved=0, internal=3, external=9, free=0)
    assert row(res, 5) == dict(token_states=3, reserved=8, internal=5, external=0, free=4)


def test_paged_preempts_the_newest_and_recomputes():
    """3 blocks of 2 slots, two requests of prompt 1 + output 4 (worked out by hand)."""
    tr = trace_from_rows([(0, 1, 4), (0, 1, 4)])
    res = simulate(tr, PagedPolicy(6, 2048, block_size=2, watermark=0.0), check=True)
    assert res.steps["running"].tolist() == [2, 1, 1, 1, 1, 1, 1]
    assert res.steps["preempted"].tolist() == [0, 1, 0, 0, 0, 0, 0]
    assert res.steps["waiting"].tolist() == [0, 1, 1, 1, 0, 0, 0]
    assert [row(res, s) for s in range(7)] == [
        dict(token_states=4, reserved=0, internal=0, external=0, free=2),
        dict(token_states=3, reserved=1, internal=0, external=0, free=2),  # request 1 preempted
        dict(token_states=4, reserved=0, internal=0, external=0, free=2),  # 1 needs 2 blocks, 1 free
        dict(token_states=5, reserved=0, internal=1, external=0, free=0),
        dict(token_states=3, reserved=1, internal=0, external=0, free=2),  # recomputed: prompt 2
        dict(token_states=4, reserved=0, internal=0, external=0, free=2),
        dict(token_states=5, reserved=0, internal=1, external=0, free=0)]
    assert res.preemptions.tolist() == [0, 1]
    assert res.finish_s.tolist() == [4.0, 7.0]


def test_layout_times_stay_aligned_across_idle_gaps():
    tr = trace_from_rows([(0, 1, 2), (5, 1, 1)])  # steps start at 0, 1, then 5
    res = simulate(tr, OrcaOracle(10, 10, placement="first-fit"), layout_times=[0, 0.5, 1, 2, 3, 4, 5, 9])
    assert [lay.step for lay in res.layouts] == [0, 1, 1, -1, -1, -1, 2]  # 9 s: after the run ended
    assert res.layouts[3].owner.tolist() == [-1] * 10 and res.layouts[3].time_s == 2  # idle: empty
    assert res.layouts[6].owner.tolist() == [1, 1] + [-1] * 8


def test_mean_batch_counts_idle_time():
    tr = trace_from_rows([(0, 1, 2), (5, 1, 1)])  # busy [0, 2), idle [2, 5), busy [5, 6)
    res = simulate(tr, OrcaOracle(10, 10, placement="first-fit"))
    assert res.window() == (0.0, 5.0)
    assert res.mean_batch() == pytest.approx(2 / 5)
    assert res.time_average("free") == pytest.approx((2 * (10 - 3) + 3 * 10) / 5)
    shares = res.shares()
    assert sum(shares.values()) == pytest.approx(1.0)


SMALL = {
    "max": lambda: OrcaMax(600, 160),
    "pow2": lambda: OrcaPow2(600, 160),
    "oracle": lambda: OrcaOracle(600, 160, placement="best-fit"),
    "paged": lambda: PagedPolicy(600, 160, block_size=16),
    "paged-8": lambda: PagedPolicy(603, 160, block_size=8, watermark=0.0),
}


@pytest.fixture(scope="module")
def small_trace():
    tr = synthetic_trace(60, 3.0, "alpaca", seed=5)
    ok = tr.total_len <= 160
    return dataclasses.replace(tr, arrival_s=tr.arrival_s[ok], prompt_len=tr.prompt_len[ok],
                               output_len=tr.output_len[ok])


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_invariants_at_every_step(kind, small_trace):
    res = simulate(small_trace, SMALL[kind](), check=True, layouts=1, max_batch=12)
    assert len(res.layouts) == res.num_steps
    st = res.steps
    for i, lay in enumerate(res.layouts):
        counts = np.bincount(lay.category, minlength=5)
        assert counts.sum() == res.pool_slots
        assert counts.tolist() == [int(st[c][i]) for c in CATEGORIES]  # running sums == recount
        owners = lay.owner[lay.owner >= 0]
        assert len(np.unique(owners)) == st["running"][i]
        if kind.startswith("paged"):
            bs = res.block_size
            for r in np.unique(owners):
                empty = np.isin(lay.category[lay.owner == r], [1, 2]).sum()  # reserved + internal
                assert empty <= bs - 1
    assert st["running"].max() <= 12
    # every generated token is produced by exactly one running step (recomputes keep theirs)
    assert st["running"].sum() == small_trace.output_len.sum()
    assert np.all(np.isfinite(res.finish_s))
    assert np.all(res.finish_s - small_trace.arrival_s >= small_trace.output_len)  # >= 1 s per token


def test_prefill_budget_is_respected(small_trace):
    free = simulate(small_trace, OrcaOracle(600, 160))
    assert free.steps["prefill_tokens"].max() > 40  # the budget below binds
    res = simulate(small_trace, OrcaOracle(600, 160), max_prefill_tokens=40)
    st = res.steps
    several = st["admitted"] >= 2  # one prompt alone may exceed the budget; two may not
    assert several.any() and st["prefill_tokens"][several].max() <= 40
    assert st["prefill_tokens"].sum() == small_trace.prompt_len.sum()  # no preemption: each once
    single = simulate(small_trace, OrcaOracle(600, 160), max_prefill_tokens=1)
    assert single.steps["admitted"].max() == 1


def test_deterministic_under_a_seed():
    runs = [PAPER_SETUP.run("paged", trace=PAPER_SETUP.trace(seed=s, num_requests=150)) for s in (1, 1, 2)]
    for c in ("time_s", "running", "token_states", "free"):
        assert np.array_equal(runs[0].steps[c], runs[1].steps[c])
    assert not np.array_equal(runs[0].steps["running"], runs[2].steps["running"])


def test_bad_input():
    tr = trace_from_rows([(0, 10, 10)])
    with pytest.raises(ConfigError, match="never fit"):
        simulate(tr, OrcaOracle(100, 16))
    with pytest.raises(ConfigError, match="never fit"):
        simulate(tr, OrcaMax(15, 16))
    pol = OrcaOracle(100, 64)
    pol.admit(0, 1, 1, 0)
    with pytest.raises(ConfigError, match="fresh"):
        simulate(tr, pol)
    with pytest.raises(ConfigError, match="max_batch"):
        simulate(tr, OrcaOracle(100, 64), max_batch=0)
    with pytest.raises(ConfigError, match="base_s"):
        IterationTime(base_s=0)


# --- the paper's set-up (vLLM paper Fig. 2 / Fig. 13a) -------------------------------------
@pytest.fixture(scope="module")
def paper_runs():
    tr = PAPER_SETUP.trace(seed=0, num_requests=600)
    return {k: PAPER_SETUP.run(k, trace=tr) for k in ("max", "pow2", "oracle", "paged")}


def test_paper_pool_is_table1():
    # 12 GiB / (2 x 40 layers x 5120 x 2 bytes) per token = 15,728 slots ("15.7K", Table 1)
    assert PAPER_SETUP.kv_bytes_per_token == 2 * 40 * 5120 * 2
    assert PAPER_SETUP.pool_slots == 12 * 2**30 // (2 * 40 * 5120 * 2) == 15728


def test_paper_setup_orca_max_batch_is_memory_bound(paper_runs):
    cap = PAPER_SETUP.pool_slots // PAPER_SETUP.max_seq_len  # floor(15.7K / 2048) = 7
    assert cap == round(PAPER_RESULTS["mean_batch"]["max"])
    assert paper_runs["max"].steps["running"].max() == cap
    assert cap - 0.2 < paper_runs["max"].mean_batch() <= cap


def test_paper_setup_paged_waste_is_under_4_percent(paper_runs):
    used = paper_runs["paged"].used_shares()
    assert 1 - used["token_states"] < 0.04
    assert paper_runs["paged"].shares()["free"] < 0.25  # the pool is in use: the share means something


def test_paper_setup_ordering(paper_runs):
    b = {k: r.mean_batch() for k, r in paper_runs.items()}
    assert b["max"] < b["pow2"] < b["oracle"] < b["paged"]
    s = {k: r.used_shares()["token_states"] for k, r in paper_runs.items()}
    assert s["max"] < s["pow2"] < s["oracle"] < s["paged"]


def test_comparison_table(paper_runs):
    rows = comparison_rows(paper_runs)
    assert [r["batch (paper)"] for r in rows] == [7.00, 9.81, 13.62, 30.42]
    assert [r["token share (paper)"] for r in rows] == [0.204, 0.268, 0.382, 0.963]
    text = format_table(rows)
    assert "30.42" in text and "96.3%" in text and "38.2%" in text
    assert text.count("\n") == len(rows) + 1


# The paper's Fig. 2, read off the figure (token states / reservation / internal / external &
# others, %), typed here independently of PAPER_RESULTS.
FIG2 = {"max": (20.4, 13.3, 57.3, 8.9), "pow2": (26.8, 17.9, 13.6, 41.6), "oracle": (38.2, 25.2, 0.0, 36.6)}


def test_fig2_per_bar_table(paper_runs):
    rows = {r["policy"]: r for r in fig2_rows(paper_runs)}
    for key, bar in FIG2.items():
        row = rows[paper_runs[key].policy]
        assert [round(100 * row[f"{s} share (paper)"], 1) for s in FIG2_SEGMENTS] == list(bar)
        assert sum(bar) == pytest.approx(100, abs=0.15)  # each printed bar adds up (rounding)
        assert sum(row[f"{s} share (ours)"] for s in FIG2_SEGMENTS) == pytest.approx(1.0)
    vllm = rows[paper_runs["paged"].policy]
    assert vllm["token_states share (paper)"] == 0.963 and vllm["rest share (paper)"] == pytest.approx(0.037)
    assert all(np.isnan(vllm[f"{s} share (paper)"]) for s in FIG2_SEGMENTS[1:])
    assert vllm["rest share (ours)"] == pytest.approx(1 - paper_runs["paged"].used_shares()["token_states"])
    text = format_table(fig2_rows(paper_runs))
    assert "57.3%" in text and "41.6%" in text and "–" in text
    with pytest.raises(ConfigError, match="Fig. 2"):
        fig2_rows({"fifo": paper_runs["max"]})


def test_buddy_brings_the_orca_bars_near_the_papers(paper_runs):
    """The paper's Orca places regions with a buddy allocator (§6.1).  With it, Oracle's bar is
    nearer the paper's than exact-size first-fit's (stronger than the paper's baseline), segment
    distances summed, and has no internal fragmentation, as in the paper."""
    paper = PAPER_RESULTS["fig2"]["oracle"]
    dist = lambda res: sum(abs(res.used_shares()[s] - paper[s]) for s in FIG2_SEGMENTS)
    ff = PAPER_SETUP.run("oracle", trace=paper_runs["oracle"].trace, placement="first-fit")
    assert dist(paper_runs["oracle"]) < 0.15 < dist(ff)
    assert paper_runs["oracle"].used_shares()["internal"] == 0
    assert ff.used_shares()["token_states"] > paper["token_states"] + 0.08
    assert ff.mean_batch() > paper_runs["oracle"].mean_batch()


# --- figures and the live panel (chapter 4) --------------------------------------------------






# --- a burst (every request at one instant): the averaging window is the whole run --------------
def test_burst_averages_over_the_run():
    """Orca (Max), 16 slots, max length 8, three requests at t=0 (the chapter's internal trace).
    By hand: step 0 runs requests 0 (3 tokens) and 1 (4 tokens, finishes); step 1 runs 0 (4 tokens,
    finishes) and 2 (2 tokens); steps 2 and 3 run request 2 (3, then 4 tokens)."""
    tr = trace_from_rows([(0, 2, 2), (0, 3, 1), (0, 1, 3)])
    res = simulate(tr, OrcaMax(16, 8))
    assert res.window() == (0.0, 4.0)  # from the burst to the end of the last 1 s step
    assert res.mean_batch() == pytest.approx((2 + 2 + 1 + 1) / 4)
    assert res.time_average("token_states") == pytest.approx((7 + 6 + 3 + 4) / 4)
    assert res.summary()["mean_batch"] == pytest.approx(1.5)
    assert sum(res.used_shares().values()) == pytest.approx(1.0)
    # t0 == t1: the value at that instant (the step covering it, or the empty pool)
    assert res.time_average("running", 0.0, 0.0) == 2
    assert res.time_average("running", 2.5, 2.5) == 1
    assert res.time_average("running", 9.0, 9.0) == 0 and res.time_average("free", 9.0, 9.0) == 16


def test_single_request_summary():
    tr = trace_from_rows([(3, 2, 4)])  # steps at 3, 4, 5, 6 hold 3, 4, 5, 6 of its 6 reserved slots
    res = simulate(tr, OrcaOracle(10, 10, placement="first-fit"))
    assert res.window() == (3.0, 7.0)
    s = res.summary()
    assert s["mean_batch"] == pytest.approx(1.0) and s["steps"] == 4
    assert s["token_share_of_used"] == pytest.approx(4.5 / 6)  # mean tokens 4.5 of 6 slots held
    assert res.shares()["free"] == pytest.approx(4 / 10)


def test_time_average_bad_windows():
    res = simulate(trace_from_rows([(0, 1, 2)]), OrcaOracle(10, 10, placement="first-fit"))
    with pytest.raises(ConfigError, match="ends before"):
        res.time_average("running", 2.0, 1.0)
    with pytest.raises(ConfigError, match="t0"):
        res.time_average("running", float("nan"), 1.0)
    with pytest.raises(ConfigError, match="unknown step field"):
        res.time_average("batch")


# --- bad input: our exceptions, never a silent substitution --------------------------------------
def test_simulate_argument_checks():
    tr = trace_from_rows([(0, 2, 2), (0, 3, 1)])
    ok = simulate(tr, OrcaOracle(10, 10, placement="first-fit"), max_batch=np.int64(1), max_prefill_tokens=np.int32(3),
                  layouts=np.int64(2))
    assert ok.steps["running"].max() == 1 and len(ok.layouts) == (ok.num_steps + 1) // 2
    bad = [dict(max_batch=True), dict(max_batch=2.0), dict(max_prefill_tokens=0), dict(max_prefill_tokens=-1),
           dict(max_prefill_tokens=1.5), dict(layouts=True), dict(layouts=0), dict(layouts=["x"]),
           dict(layout_times=[float("nan")]), dict(layout_times=[-1.0]), dict(layout_times=5),
           dict(layout_times=["a"]), dict(iteration_time="fast")]
    for kw in bad:
        with pytest.raises(ConfigError):
            simulate(tr, OrcaOracle(10, 10, placement="first-fit"), **kw)
    with pytest.raises(ConfigError, match="no requests"):
        simulate(trace_from_rows([]), OrcaOracle(10, 10, placement="first-fit"))
    with pytest.raises(ConfigError, match="Trace"):
        simulate([(0, 1, 1)], OrcaOracle(10, 10, placement="first-fit"))
    with pytest.raises(ConfigError, match="MemoryPolicy"):
        simulate(tr, "oracle")


def test_iteration_time_checks():
    for kw in (dict(base_s="1"), dict(base_s=float("nan")), dict(base_s=float("inf")), dict(per_kv_token_s=-1)):
        with pytest.raises(ConfigError):
            IterationTime(**kw)
    args = (26e9, 819_200, 1.555e12, 312e12)
    ideal = IterationTime.roofline(*args, np.float32(1.0))
    assert ideal.base_s == pytest.approx(26e9 / 1.555e12)
    for eff in (0, -0.5, 5, float("nan"), "1", True):
        with pytest.raises(ConfigError, match="efficiency"):
            IterationTime.roofline(*args, eff)
    with pytest.raises(ConfigError, match="hbm_bytes_per_s"):
        IterationTime.roofline(26e9, 819_200, 0, 312e12)


def test_serving_setup_checks():
    bad = [dict(efficiency=0), dict(efficiency=5), dict(efficiency=float("nan")), dict(kv_gib=-1),
           dict(kv_gib=float("nan")), dict(kv_gib="12"), dict(kv_gib=1e-9), dict(num_requests=0),
           dict(num_requests=True), dict(num_requests=2.5), dict(max_seq_len=0), dict(rate_per_s=0),
           dict(lengths="imdb"), dict(model=13), dict(kv_dtype="fp7")]
    for kw in bad:
        with pytest.raises(ConfigError):
            ServingSetup(**kw)
    s = ServingSetup(num_requests=np.int64(5), max_seq_len=np.int32(1024))
    assert type(s.num_requests) is int and s.num_requests == 5 and s.max_seq_len == 1024
    assert len(s.trace()) == 5 and len(s.trace(num_requests=np.int64(7))) == 7
    for kw in (dict(rate_per_s=0), dict(num_requests=0), dict(num_requests=-3), dict(rate_per_s=-1)):
        with pytest.raises(ConfigError):  # 0 is an error, not a request for the default
            PAPER_SETUP.trace(**kw)




