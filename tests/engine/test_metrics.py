"""Latency distributions and goodput (``paged_kv.engine.metrics``), each against a brute force:
percentiles against a scan of the sorted values, inter-token gaps against the engine's clock read
step by step from outside, SLO attainment and goodput against a loop over requests, DistServe's
goodput rate against a dense grid.  Runs use a timing model (no tensors): cheap and exact."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv.engine import (DISTSERVE_CHATBOT_OPT13B, SLO, EngineConfig, LLMEngine, engine_config_for,
                             goodput_rate, inter_token_latencies, percentile, rate_sweep, request_goodput,
                             serve_static, serve_sweep, serve_trace, slo_attainment, summarize)
from paged_kv.engine.metrics import pairwise_sum
from paged_kv.errors import ConfigError
from paged_kv.model.sampling import SamplingParams
from paged_kv.sim import IterationTime, ServingSetup, trace_from_rows


def brute_percentile(values, q):
    """The definition in words: sorted value i sits at percent 100 i / (n - 1); between two such
    points, go along the straight line joining them."""
    x = sorted(v for v in values if not math.isnan(v))
    if len(x) == 1:
        return x[0]
    at = [100 * i / (len(x) - 1) for i in range(len(x))]
    for i in range(len(x) - 1):
        if at[i] <= q <= at[i + 1]:
            return x[i] + (q - at[i]) / (at[i + 1] - at[i]) * (x[i + 1] - x[i])
    raise AssertionError("q outside 0..100")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=40),
       st.floats(0, 100, allow_nan=False))
def test_percentile_is_the_line_between_the_two_nearest_ranks(values, q):
    assert percentile(values, q) == pytest.approx(brute_percentile(values, q), abs=1e-12)


def _random_samples():
    """Samples of many sizes and scales (heavy tails, negatives, repeats, a NaN), seeded."""
    rng = np.random.default_rng(24)
    sizes = [*range(1, 140), 255, 256, 257, 1000, 1029, 4097]
    for n in sizes:
        x = rng.lognormal(0.0, 3.0, n) * rng.choice([-1.0, 1.0], n)
        if n % 7 == 0:
            x[rng.integers(n)] = x[0]                       # a repeated value
        if n % 11 == 0:
            x[rng.integers(n)] = math.nan                   # left out, as numpy's nan-free sample
        yield x


def test_percentile_and_mean_are_numpys_to_the_last_bit():
    """The plain-Python metrics (the browser build has no numpy) against numpy itself: ==, not approx."""
    qs = [0, 1, 10, 25, 33.3, 50, 66.7, 90, 95, 99, 99.9, 100]
    checked = 0
    for x in _random_samples():
        kept = x[~np.isnan(x)]
        values = x.tolist()
        for q in qs:
            assert percentile(values, q) == float(np.percentile(kept, q)), (len(values), q)
        s = summarize(values, qs=(50, 99))
        assert s["mean"] == float(kept.mean()) and s["max"] == float(kept.max()), len(values)
        assert s["p99"] == float(np.percentile(kept, 99))
        assert pairwise_sum(kept.tolist()) == float(np.add.reduce(kept))
        checked += 1
    assert checked > 140
    # the check tells summation orders apart: a running sum misses numpy's on these samples
    x = np.random.default_rng(1).normal(size=4097)
    assert pairwise_sum(x.tolist()) == float(np.sum(x)) != sum(x.tolist())


def test_percentile_edges_and_errors():
    assert percentile([3.0, math.nan, 1.0, 2.0], 50) == 2.0           # NaNs (one-token TPOTs) left out
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ConfigError, match="q"):
        percentile([1.0], 101)
    with pytest.raises(ConfigError, match="values"):
        percentile(["a"], 50)


def test_summarize_reports_what_a_benchmark_prints():
    rng = np.random.default_rng(0)
    x = rng.exponential(1.0, 101).tolist()
    s = summarize(x, qs=(50, 99))
    ordered = sorted(x)
    assert s["n"] == 101 and s["p50"] == ordered[50] and s["max"] == ordered[-1]    # 101 values: exact ranks
    assert s["p99"] == pytest.approx(ordered[99])
    assert s["mean"] == pytest.approx(sum(x) / len(x))
    assert set(s) == {"n", "mean", "p50", "p99", "max"}
    assert summarize([])["n"] == 0 and math.isnan(summarize([])["p50"])


def _varying_steps():
    """Step k costs k ms: every gap is different, so a gap put in the wrong place shows."""
    state = {"k": 0}

    def step_time(kv_tokens, prefill_tokens):
        state["k"] += 1
        return state["k"] * 1e-3
    return step_time


def test_inter_token_latencies_are_every_gap_of_every_request():
    """Oracle from outside the engine: after each step, read the clock and which requests got a
    token in it (their token counts grew); a request's gaps are the differences of those clocks."""
    e = LLMEngine(None, EngineConfig(block_size=4, num_gpu_blocks=6, watermark=0.0, max_num_batched_tokens=8),
                  iteration_time=_varying_steps())
    ids = [e.add_request([1] * p, SamplingParams(max_tokens=m)) for p, m in ((3, 6), (9, 4), (2, 7))]
    seen = {i: [] for i in ids}
    counts = {i: 0 for i in ids}
    late = None
    step = 0
    while e.has_unfinished_requests():
        e.step()
        step += 1
        if step == 2:
            late = e.add_request([2] * 5, SamplingParams(max_tokens=5, n=2, temperature=1.0, seed=0))
            seen[late], counts[late] = [], 0
        for i in seen:
            now = len(e.output(i).token_ids[0])
            if now > counts[i]:
                seen[i].append(e.clock)
                counts[i] = now
    want = [b - a for i in seen for a, b in zip(seen[i], seen[i][1:])]
    got = inter_token_latencies(e.outputs())
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert len(got) == sum(len(e.output(i).token_ids[0]) - 1 for i in seen)
    for i in seen:       # TPOT is the mean of a request's own gaps
        o = e.output(i)
        assert o.tpot == pytest.approx(np.mean(o.itl)) and o.max_itl == max(o.itl)
        assert o.ttft_steps == o.token_steps[0] - o.arrival_step >= 1
    with pytest.raises(ConfigError, match="RequestOutput"):
        inter_token_latencies([0.1, 0.2])


def test_preemptions_are_stamped_with_their_step_and_show_as_a_gap_or_in_ttft():
    """Preempted in a step by the scheduler, or by hand between steps: each preemption is stamped
    with the step it takes effect in (checked against the per-step count the engine keeps), and a
    request preempted after its first token has a gap of more than one step."""
    e = LLMEngine(None, EngineConfig(block_size=4, num_gpu_blocks=5, watermark=0.0), iteration_time=lambda kv, pf: 0.01)
    a = e.add_request([1] * 3, SamplingParams(max_tokens=9))
    b = e.add_request([2] * 3, SamplingParams(max_tokens=9))
    c = e.add_request([3] * 3, SamplingParams(max_tokens=9))
    e.step()
    e.step()
    e.scheduler.preempt(c)                         # by hand, between steps 2 and 3
    while e.has_unfinished_requests():
        e.step()
    outs = [e.output(i) for i in (a, b, c)]
    stamped = sorted(s for o in outs for s in o.preempted_steps)
    by_step = sorted(s for s, k in enumerate(e.stats.preempted_now, start=1) for _ in range(k))
    assert 3 in e.output(c).preempted_steps
    assert sorted(stamped) == sorted(by_step + [3])     # in-step ones as the engine counted them, plus the hand one
    assert [len(o.preempted_steps) for o in outs] == [o.preemptions for o in outs]
    for o in outs:
        after_first = [s for s in o.preempted_steps if s > o.token_steps[0]]
        assert (max(o.itl_steps) > 1) == bool(after_first)
        assert all(g >= 1 for g in o.itl_steps)


def brute_met(ttft, tpot, slo):
    return [t <= slo.ttft_s and (math.isnan(p) or p <= slo.tpot_s) for t, p in zip(ttft, tpot)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.one_of(st.just(math.nan), st.floats(0, 0.3))), min_size=1, max_size=30),
       st.floats(0.01, 1), st.floats(0.01, 0.3), st.floats(0.5, 100))
def test_attainment_and_goodput_count_requests_meeting_both_bounds(reqs, ttft_slo, tpot_slo, duration):
    ttft, tpot = [r[0] for r in reqs], [r[1] for r in reqs]
    slo = SLO(ttft_slo, tpot_slo)
    good = brute_met(ttft, tpot, slo)
    assert slo.met(ttft, tpot) == good
    assert slo.met(np.array(ttft), tpot).tolist() == good           # numpy in, numpy out
    assert slo_attainment(ttft, tpot, slo) == pytest.approx(sum(good) / len(good))
    assert request_goodput(ttft, tpot, slo, duration) == pytest.approx(sum(good) / duration)


def test_slo_errors_name_the_bad_value():
    with pytest.raises(ConfigError, match="ttft_s"):
        SLO(0.0, 0.1)
    with pytest.raises(ConfigError, match="tpot_s"):
        SLO(0.25, -1)
    with pytest.raises(ConfigError, match="2 TTFTs and 1 TPOTs"):
        SLO(1, 1).met([0.1, 0.2], [0.1])
    with pytest.raises(ConfigError, match="no first token"):
        slo_attainment([math.nan], [0.1], SLO(1, 1))
    with pytest.raises(ConfigError, match="duration_s"):
        request_goodput([0.1], [0.1], SLO(1, 1), 0)
    with pytest.raises(ConfigError, match="SLO"):
        slo_attainment([0.1], [0.1], (0.25, 0.1))
    assert DISTSERVE_CHATBOT_OPT13B.ttft_s == 0.25 and DISTSERVE_CHATBOT_OPT13B.tpot_s == 0.1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=8), st.floats(0.05, 1))
def test_goodput_rate_is_where_attainment_first_falls_below_the_goal(att, goal):
    rates = [0.5 * (i + 1) for i in range(len(att))]
    got = goodput_rate(rates, att, goal)
    if att[0] < goal:
        assert got == 0.0
        return
    # brute force: walk a dense grid along the piecewise-linear curve, stop at the first point below
    grid = np.linspace(rates[0], rates[-1], 20001)
    below = np.nonzero(np.interp(grid, rates, att) < goal - 1e-12)[0]
    want = rates[-1] if below.size == 0 else grid[below[0]]
    assert got == pytest.approx(want, abs=(rates[-1] - rates[0]) / 20000 + 1e-9)


def test_goodput_rate_errors():
    for rates, att, msg in (([1, 2], [1.0], "one attainment per rate"), ([2, 1], [1, 1], "increase"),
                            ([1, 2], [1.0, 1.5], "0 to 1")):
        with pytest.raises(ConfigError, match=msg):
            goodput_rate(rates, att)
    with pytest.raises(ConfigError, match="goal"):
        goodput_rate([1], [1.0], goal=0)


ROWS = [(0, 5, 4), (0, 9, 2), (1, 3, 6), (2.5, 12, 3), (2.5, 1, 1), (9, 4, 5), (9.5, 7, 2)]


def test_serve_results_carry_tpot_itl_and_goodput():
    """A request's TPOT equals the mean of its own gaps in the pooled ITL sample (two computations:
    finish and first-token times, and the gaps the engine stamped token by token); goodput is the
    loop over requests.  Static batching's gaps too."""
    trace = trace_from_rows(ROWS)
    for res in (serve_trace(trace, EngineConfig(block_size=4, num_gpu_blocks=12, watermark=0.0), _varying_steps()),
                serve_static(trace, 3, _varying_steps())):
        per_request = np.split(res.itl_s, np.cumsum(trace.output_len - 1)[:-1])
        for gaps, tpot, first, finish in zip(per_request, res.tpot_s, res.first_token_s, res.finish_s):
            if len(gaps):
                assert tpot == pytest.approx(gaps.mean()) and gaps.sum() == pytest.approx(finish - first)
            else:
                assert math.isnan(tpot)
        slo = SLO(2.5e-3 * 10, 8e-3)
        good = brute_met(res.ttft_s, res.tpot_s, slo)
        assert res.slo_attainment(slo) == pytest.approx(sum(good) / len(trace))
        assert res.goodput(slo) == pytest.approx(sum(good) / (res.finish_s.max() - trace.arrival_s.min()))


def test_serve_sweep_keeps_the_runs_behind_the_latency_curves():
    setup = ServingSetup(kv_gib=2.0, num_requests=12)
    configs = {"paged": engine_config_for(setup), "max": engine_config_for(setup, "max")}
    runs = serve_sweep(setup, [1.5], configs, num_requests=12)
    curves = rate_sweep(setup, [1.5], configs, num_requests=12)
    for name in configs:
        xs, results = runs[name]
        assert xs == curves[name][0] and [r.normalized_latency for r in results] == curves[name][1]
        assert all(len(r.trace) == 12 and r.itl_s.size == int((r.trace.output_len - 1).sum()) for r in results)
