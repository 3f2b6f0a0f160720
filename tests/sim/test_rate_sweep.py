"""Latency against load (paged_kv.sim.rate_sweep): the paper's metric by hand, the one rate loop
(same trace for every system, where a curve stops), the capacity read off a curve, and Fig. 14's
sweep of sharing groups."""

import math

import numpy as np
import pytest

from paged_kv.errors import ConfigError
from paged_kv.sim import (IterationTime, PagedPolicy, ServingSetup, SharedPagedPolicy, Sharing, capacity, latency_sweep,
                          normalized_latency, simulate, sweep_rates, trace_from_rows)

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
    assert list(curves) == ["paged (parallel x2)", "Orca (Oracle) x2", "Orca (Max) x2"]
    # two regions of max_seq_len (2 x 2,048 slots) exceed the 2,621-slot pool: no point at all
    assert SMALL.pool_slots < 2 * SMALL.max_seq_len and curves["Orca (Max) x2"] == ([], [])
    lat = {k: ys[0] for k, (_, ys) in curves.items() if ys}
    assert lat["paged (parallel x2)"] <= lat["Orca (Oracle) x2"]
    trace = SMALL.trace(seed=0, num_requests=40, rate_per_s=4.0)   # the paged point, run by hand
    res = simulate(trace, SharedPagedPolicy(SMALL.pool_slots, SMALL.max_seq_len, sharing=Sharing("parallel", 2)),
                   iteration_time=SMALL.iteration_time())
    by_hand = np.mean([(f - a) / o for f, a, o in zip(res.finish_s, trace.arrival_s, trace.output_len)])
    assert lat["paged (parallel x2)"] == pytest.approx(by_hand)
    with pytest.raises(ConfigError, match="unknown policy"):
        latency_sweep(SMALL, Sharing("parallel", 2), [1.0], policies=("fifo",))
