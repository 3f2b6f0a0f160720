"""Latency against load (paged_kv.sim.rate_sweep): the paper's metric by hand, the one rate loop
(same trace for every system, where a curve stops), the capacity read off a curve, and Fig. 14's
sweep of sharing groups."""

import math

import numpy as np
import pytest

from paged_kv.errors import ConfigError
from paged_kv.sim import (GroupContiguousPolicy, IterationTime, PagedPolicy, ServingSetup, SharedPagedPolicy, Sharing,
                          capacity, finish_rate, latency_sweep, normalized_latency, simulate, sustained_rate,
                          sweep_rates, trace_from_rows)

SMALL = ServingSetup(kv_gib=2.0, num_requests=40, lengths="alpaca")


def test_normalized_latency_by_hand():
    trace = trace_from_rows([(0, 4, 2), (1, 3, 5), (2, 8, 1)])
    finish = [4.0, 11.0, 3.0]
    # (4 - 0) / 2, (11 - 1) / 5, (3 - 2) / 1
    assert normalized_latency(trace, finish) == pytest.approx((2 + 2 + 1) / 3)
    with pytest.raises(ConfigError, match="one time per request"):
        normalized_latency(trace, finish[:2])


def test_normalized_latency_of_a_simulated_run_request_by_request():
    trace = trace_from_rows([(0, 5, 4), (0, 9, 2), (1, 3, 6), (2.5, 12, 3)])
    res = simulate(trace, PagedPolicy(64, block_size=4, watermark=0.0), iteration_time=IterationTime())
    by_hand = sum((f - a) / o for f, a, o in zip(res.finish_s, trace.arrival_s, trace.output_len)) / len(trace)
    assert normalized_latency(trace, res.finish_s) == pytest.approx(by_hand)


def test_sweep_rates_hands_every_system_the_same_trace_and_stops_a_curve():
    seen = {"a": [], "b": []}

    def measure(name, limit):
        def run(trace):
            seen[name].append((trace.arrival_s.tolist(), trace.output_len.tolist()))
            return None if len(seen[name]) > limit else float(trace.arrival_s[-1])
        return run

    out = sweep_rates(SMALL, [1, 2, 4], {"a": measure("a", 3), "b": measure("b", 1)}, num_requests=20, seed=3)
    assert seen["a"][:1] == seen["b"][:1]                    # the same trace at a rate, whatever the system
    assert out["a"][0] == [1.0, 2.0, 4.0] and out["b"] == ([1.0], [out["a"][1][0]])   # None stops "b"
    assert out["a"][1] == [SMALL.trace(3, 20, r).arrival_s[-1] for r in (1, 2, 4)]
    early = sweep_rates(SMALL, [1, 2, 4], {"a": lambda trace: 10.0}, num_requests=5, stop_above=5.0)
    assert early["a"] == ([1.0], [10.0])                     # past stop_above: the higher rates are skipped


@pytest.mark.parametrize("rates", [[2, 1], [0, 1], [1, 1]])
def test_sweep_rates_wants_increasing_positive_rates(rates):
    with pytest.raises(ConfigError):
        sweep_rates(SMALL, rates, {"a": lambda trace: 0.0})


def test_capacity_interpolates_the_crossing():
    assert capacity([1, 2, 4], [0.1, 0.3, 0.9], 0.6) == pytest.approx(3.0)   # halfway from 0.3 to 0.9
    assert capacity([1, 2], [0.7, 0.9], 0.6) == 1.0                          # starts above
    assert capacity([1, 2], [0.1, 0.2], 0.6) == 2.0                          # never reaches it
    assert math.isnan(capacity([], [], 0.6))


def test_latency_sweep_names_its_policies_and_paging_with_sharing_queues_least():
    curves = latency_sweep(SMALL, Sharing("parallel", 2), [4.0], policies=("paged", "oracle", "max"),
                           num_requests=40)
    assert list(curves) == ["paged (vLLM)", "Orca (Oracle)", "Orca (Max)"]      # the same at every width
    # two regions of max_seq_len (2 x 2,048 slots) exceed the 2,621-slot pool: no point at all
    assert SMALL.pool_slots < 2 * SMALL.max_seq_len and curves["Orca (Max)"] == ([], [])
    lat = {k: ys[0] for k, (_, ys) in curves.items() if ys}
    assert lat["paged (vLLM)"] <= lat["Orca (Oracle)"]
    trace = SMALL.trace(seed=0, num_requests=40, rate_per_s=4.0)   # the paged point, run by hand
    res = simulate(trace, SharedPagedPolicy(SMALL.pool_slots, SMALL.max_seq_len, sharing=Sharing("parallel", 2)),
                   iteration_time=SMALL.iteration_time())
    by_hand = np.mean([(f - a) / o for f, a, o in zip(res.finish_s, trace.arrival_s, trace.output_len)])
    assert lat["paged (vLLM)"] == pytest.approx(by_hand)
    with pytest.raises(ConfigError, match="unknown policy"):
        latency_sweep(SMALL, Sharing("parallel", 2), [1.0], policies=("fifo",))


def test_finish_rate_by_hand():
    finish = [0.5 * i for i in (10, 3, 0, 7, 1, 9, 4, 8, 2, 6, 5)]   # 11 finishes, 2 per second, unsorted
    # sorted, i0 = int(0.2 * 10) = 2 (1.0 s) and i1 = int(0.8 * 10) = 8 (4.0 s): 6 finishes in 3 s
    assert finish_rate(finish) == pytest.approx(2.0)
    assert finish_rate(finish, (0.0, 1.0)) == pytest.approx(10 / 5.0)
    for bad in [(0.8, 0.2), (0.5,), (-0.1, 0.5), (0.2, 1.5), "ab", 3]:
        with pytest.raises(ConfigError, match="window"):
            finish_rate(finish, bad)
    with pytest.raises(ConfigError, match="use more requests"):
        finish_rate([1.0, 1.0, 1.0, 2.0])                    # the 20% and 80% finishes coincide


def test_a_burst_finishes_in_waves_at_the_rate_a_brute_force_count_gives():
    # 101 identical requests (prompt 3, 5 tokens) all at t = 0; the pool holds exactly 10 Oracle
    # regions of 8 slots; 1 s per step: every 5 steps a wave of 10 finishes, so 2 requests per second
    m, P, O, N = 10, 3, 5, 101
    trace = trace_from_rows([(0, P, O)] * N)
    res = simulate(trace, GroupContiguousPolicy(m * (P + O), 64, "oracle", 1), iteration_time=IterationTime())
    waves = [(i // m + 1) * O for i in range(N)]              # the brute-force finish times
    assert sorted(res.finish_s.tolist()) == waves
    assert finish_rate(res.finish_s) == pytest.approx(m / O)


def test_sustained_rate_is_a_burst_run_and_the_rate_where_the_queue_starts_to_grow():
    sh = Sharing("parallel", 2)
    rate = sustained_rate(SMALL, sh, policies=("paged", "oracle"), num_requests=600)
    assert list(rate) == ["paged (vLLM)", "Orca (Oracle)"] and rate["paged (vLLM)"] > rate["Orca (Oracle)"]
    lengths = SMALL.trace(seed=0, num_requests=600)                # by hand: the same lengths, all at 0
    burst = trace_from_rows([(0, int(p), int(o)) for p, o in zip(lengths.prompt_len, lengths.output_len)])
    res = simulate(burst, SharedPagedPolicy(SMALL.pool_slots, SMALL.max_seq_len, sharing=sh),
                   iteration_time=SMALL.iteration_time())
    assert rate["paged (vLLM)"] == pytest.approx(finish_rate(res.finish_s))
    mu = rate["paged (vLLM)"]
    wait = {}
    for f in (0.6, 1.5):                                         # below and above it, 800 Poisson arrivals
        trace = SMALL.trace(seed=1, num_requests=800, rate_per_s=f * mu)
        res = simulate(trace, SharedPagedPolicy(SMALL.pool_slots, SMALL.max_seq_len, sharing=sh),
                       iteration_time=SMALL.iteration_time())
        w = res.first_admit_s - trace.arrival_s
        wait[f] = (w[:200].mean(), w[-200:].mean())
    assert wait[0.6][1] < 0.5                                    # below: the last requests hardly wait
    assert wait[1.5][1] > 10 and wait[1.5][1] > 5 * wait[1.5][0]  # above: the queue grows with the trace


def test_sustained_rate_gives_nan_to_a_system_that_cannot_hold_a_request():
    rate = sustained_rate(SMALL, Sharing("parallel", 2), policies=("max",), num_requests=50)
    assert math.isnan(rate["Orca (Max)"])                        # 2 x 2,048 slots > the pool
    with pytest.raises(ConfigError, match="unknown policy"):
        sustained_rate(SMALL, Sharing("parallel", 2), policies=("fifo",), num_requests=50)
