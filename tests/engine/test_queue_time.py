"""Queue time: a request's wait from arrival to its first admission (``RequestOutput.first_scheduled``,
``ServeResult.queue_s``; vLLM's ``scheduled_ts`` and its queue-time metric)."""

import numpy as np
import pytest

from paged_kv.engine import EngineConfig
from paged_kv.engine.serving import serve_static, serve_trace
from paged_kv.errors import ConfigError
from paged_kv.sim import IterationTime, PagedPolicy, simulate, trace_from_rows

ROWS = [(0, 5, 4), (0, 9, 2), (1, 3, 6), (2.5, 12, 3), (2.5, 1, 1), (9, 4, 5), (9.5, 7, 2)]


def test_first_admission_is_the_simulators():
    """The chapter 4 simulator records each request's first admission on its own; with the same
    trace, rules and step times (memory to spare) the engine's admission times are the same."""
    trace = trace_from_rows(ROWS)
    sim = simulate(trace, PagedPolicy(200, block_size=4, watermark=0.0), iteration_time=IterationTime())
    res = serve_trace(trace, EngineConfig(block_size=4, num_gpu_blocks=50, watermark=0.0), IterationTime())
    np.testing.assert_array_equal(res.first_scheduled_s, sim.first_admit_s)
    np.testing.assert_array_equal(res.queue_s, sim.first_admit_s - trace.arrival_s)


def test_one_at_a_time_the_second_waits_until_the_first_is_done():
    """``max_num_seqs = 1`` and 1 s per step: the second request starts in the step after the first
    finishes, so its queue time is the first one's finish; both wait at least nothing, and never
    longer than their TTFT; a preemption later on does not move the first admission."""
    trace = trace_from_rows([(0, 4, 3), (0, 4, 2)])
    res = serve_trace(trace, EngineConfig(block_size=4, num_gpu_blocks=8, max_num_seqs=1), lambda kv, p: 1.0)
    assert res.queue_s[0] == 0 and res.queue_s[1] == res.finish_s[0]
    assert np.all(res.queue_s < res.ttft_s)
    tight = serve_trace(trace_from_rows([(0, 8, 12), (0.5, 8, 12)]),
                        EngineConfig(block_size=4, num_gpu_blocks=6, watermark=0.0), lambda kv, p: 1.0)
    assert tight.stats.preemptions > 0
    assert list(tight.queue_s) == [0.0, 0.5]      # admitted in the first step after each arrival


def test_static_batching_records_no_admissions():
    res = serve_static(trace_from_rows([(0, 4, 3)]), 2, lambda kv, p: 1.0)
    assert res.first_scheduled_s is None
    with pytest.raises(ConfigError, match="admission times"):
        res.queue_s
