"""The engine with a timing model: the chapter 4 simulator and the engine agree step by step; traces."""

import numpy as np
import pytest

from paged_kv.engine.serving import engine_config_for, rate_sweep, serve_trace
from paged_kv.engine import EngineConfig
from paged_kv.errors import AdmissionError, ConfigError
from paged_kv.sim import IterationTime, PagedPolicy, ServingSetup, simulate, trace_from_rows

ROWS = [(0, 5, 4), (0, 9, 2), (1, 3, 6), (2.5, 12, 3), (2.5, 1, 1), (9, 4, 5), (9.5, 7, 2)]


def test_engine_and_simulator_agree_step_by_step():
    """Same trace, same FCFS rules, 1 s per step, memory to spare: the same steps admit, run and
    finish the same requests, at the same times.  The one convention that differs is named: the
    simulator counts the first output token's slot at admission (P + 1), the engine allocates the
    prompt (P) and the token's slot when it is fed back, as vLLM does; so it holds one token fewer
    per running request."""
    trace = trace_from_rows(ROWS)
    sim = simulate(trace, PagedPolicy(200, block_size=4, watermark=0.0), iteration_time=IterationTime())
    res = serve_trace(trace, EngineConfig(block_size=4, num_gpu_blocks=50, watermark=0.0), IterationTime())
    st = res.stats
    assert st.steps == sim.num_steps
    assert st.admitted == sim.steps["admitted"].tolist()
    assert st.finished == sim.steps["finished"].tolist()
    assert st.running == sim.steps["running"].tolist()
    np.testing.assert_array_equal(res.finish_s, sim.finish_s)
    assert np.all(res.first_token_s == sim.first_admit_s + 1)      # the first token ends the admitting step
    per_request = [(f - a) / o for f, a, o in zip(res.finish_s, trace.arrival_s, trace.output_len)]
    assert res.normalized_latency == pytest.approx(sum(per_request) / len(trace))


def test_both_preempt_under_the_same_pressure():
    trace = trace_from_rows([(0, 8, 20), (0, 8, 20), (0, 8, 20)])
    sim = simulate(trace, PagedPolicy(48, block_size=4, watermark=0.0))
    res = serve_trace(trace, EngineConfig(block_size=4, num_gpu_blocks=12, watermark=0.0), IterationTime())
    assert sim.preemptions.sum() > 0 and res.stats.preemptions > 0
    assert res.finish_s.max() >= sim.finish_s.max() - 1   # the engine never needs more room than the simulator


def test_rate_sweep_orders_the_configs():
    """Small set-up: at a rate that loads the pool, reserving max_model_len per request queues far
    more than paging; an exact reservation sits in between."""
    setup = ServingSetup(kv_gib=2.0, num_requests=40)
    configs = {"paged": engine_config_for(setup), "oracle": engine_config_for(setup, "oracle"),
               "max": engine_config_for(setup, "max")}
    out = rate_sweep(setup, [1.5], configs, num_requests=40)
    lat = {k: v[1][0] for k, v in out.items()}
    assert lat["paged"] <= lat["oracle"] < lat["max"]


def test_serve_trace_refuses_what_never_fits():
    trace = trace_from_rows([(0, 50, 20)])
    with pytest.raises(AdmissionError, match="the pool has 4"):
        serve_trace(trace, EngineConfig(block_size=4, num_gpu_blocks=4), IterationTime())
    with pytest.raises(ConfigError, match="Trace"):
        serve_trace([(0, 1, 1)], EngineConfig(block_size=4, num_gpu_blocks=4), IterationTime())


def test_parallel_samples_share_and_finish():
    trace = trace_from_rows([(0, 20, 5), (0.5, 33, 4)])
    res = serve_trace(trace, EngineConfig(block_size=4, num_gpu_blocks=40, watermark=0.0), IterationTime(), n=3)
    assert np.all(np.isfinite(res.finish_s)) and res.stats.generated == 3 * (5 + 4)
