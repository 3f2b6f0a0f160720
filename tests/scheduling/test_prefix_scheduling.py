"""The scheduler with prefix caching (pure: no model; sampled tokens are made up): the lookup comes
before the tokens to run, a failed admission counts nothing, a preempted request looks up again."""

import pytest

from paged_kv.errors import ConfigError
from paged_kv.scheduling import Scheduler, SchedulerConfig, Verdict


def step(sch, token=0):
    out = sch.schedule()
    sch.update(out, {c.seq_id: [token] * c.num_samples for c in out.chunks if c.sample})
    return out


def test_prefix_caching_refuses_swap_and_reservations():
    with pytest.raises(ConfigError, match="recompute"):
        SchedulerConfig(8, 4, num_cpu_blocks=4, preemption_mode="swap", enable_prefix_caching=True)
    with pytest.raises(ConfigError, match="reservation"):
        SchedulerConfig(8, 4, reservation="oracle", enable_prefix_caching=True)
    with pytest.raises(ConfigError, match="True or False"):
        SchedulerConfig(8, 4, enable_prefix_caching=1)


def test_a_failed_admission_changes_no_counter_and_the_next_lookup_sees_the_new_cache():
    sch = Scheduler(SchedulerConfig(6, 4, watermark=0.0, max_num_batched_tokens=16, enable_prefix_caching=True))
    sch.add("r1", list(range(1, 13)), max_tokens=1)
    step(sch)
    sch.add("q", [40, 41, 42, 43, 44, 45, 46], max_tokens=2)
    step(sch)
    r2 = list(range(1, 13)) + [20, 21, 22, 23, 24]
    sch.add("r2", r2, max_tokens=2)
    hit = sch.manager.cache_hit(r2)
    counters = (sch.prefix_queries, sch.prefix_hits)
    assert len(hit) == 3 and sch.admission(sch.requests["r2"]).verdict is Verdict.LATER
    out = step(sch)                                    # q finishes, r2 waits
    assert "r2" not in out.admitted and out.cache_hits == {}
    assert (sch.prefix_queries, sch.prefix_hits) == counters == (12 + 7, 0)
    assert [sch.manager.allocator.ref_count(b) for b in hit] == [0, 0, 0]   # the lookup touched nothing
    out = step(sch)
    assert out.cache_hits == {"r2": 12} and [(c.start, c.query_len) for c in out.chunks] == [(12, 5)]
    sch.preempt("r2")
    out = step(sch)
    assert out.cache_hits == {"r2": 16} and [(c.start, c.query_len) for c in out.chunks] == [(16, 2)]
    assert sch.requests["r2"].cache_hits == [12, 16]
    assert sch.manager.num_free_blocks == 6
    sch.check()


def test_the_budget_pays_only_for_the_uncached_suffix():
    def run(caching):
        sch = Scheduler(SchedulerConfig(16, 4, watermark=0.0, max_num_batched_tokens=12,
                                        enable_prefix_caching=caching, enable_chunked_prefill=False))
        shared = list(range(1, 9))
        sch.add("a", shared + [9], max_tokens=1)
        step(sch)
        sch.add("b", shared + [20, 21, 22, 23], max_tokens=1)
        sch.add("c", shared + [30, 31, 32, 33], max_tokens=1)
        return step(sch)
    on, off = run(True), run(False)
    assert on.cache_hits == {"b": 8, "c": 8} and on.prefill_tokens == 8       # 4 + 4 uncached tokens
    assert off.admitted == ["b"] and off.prefill_tokens == 12                 # c waits: 12 + 12 > 12
