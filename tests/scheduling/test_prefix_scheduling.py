"""The scheduler with prefix caching (pure: no model; sampled tokens are made up): the lookup comes
before the tokens to run, a failed admission counts nothing, a preempted request looks up again."""

import pytest

from paged_kv.errors import ConfigError, PagedKVError
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


# --- schedule-time registration (vLLM v1's allocate_slots -> cache_blocks) ---------------------------

def caching_scheduler(**kw):
    return Scheduler(SchedulerConfig(**({"num_gpu_blocks": 16, "block_size": 4, "watermark": 0.0,
                                          "max_num_batched_tokens": 64, "enable_prefix_caching": True} | kw)))


def test_requests_admitted_in_one_step_share_the_blocks_that_step_writes():
    """Two requests with the same 9-token system prompt submitted together: the first computes it,
    the second, admitted later in the same schedule(), hits its two full blocks and runs only its own
    tokens; the step names the writer (``same_step_hits``).  A third, sharing one block with the
    second's own tokens, reads blocks written by both."""
    sch = caching_scheduler()
    system = list(range(1, 10))
    sch.add("a", system + [50], max_tokens=2)
    sch.add("b", system + [60, 61, 62], max_tokens=2)
    sch.add("c", [99, 98, 97, 96], max_tokens=2)                       # shares nothing
    out = sch.schedule()
    blocks_a = sch.manager.block_ids(sch.requests["a"].leader.seq_id)
    assert out.cache_hits == {"a": 0, "b": 8, "c": 0}
    assert out.same_step_hits == {"b": ("a",)}
    assert [(c.request_id, c.start, c.query_len) for c in out.chunks] == [("a", 0, 10), ("b", 8, 4), ("c", 0, 4)]
    assert sch.manager.block_ids(sch.requests["b"].leader.seq_id)[:2] == blocks_a[:2]
    assert out.readers_of({"a"}) == {"b"} and out.readers_of({"b"}) == set() and out.readers_of({"c"}) == set()
    assert out.prefill_tokens == 10 + 4 + 4
    sch.update(out, {c.seq_id: [0] for c in out.chunks if c.sample})
    assert (sch.prefix_queries, sch.prefix_hits) == (10 + 12 + 4, 8)
    sch.check()


def test_a_failed_writer_s_blocks_leave_the_cache_and_its_readers_wait_again():
    """The writer's part fails: the blocks registered for it in the step are dropped (not counted as
    evictions), its reader and the reader's reader (which hit the reader's blocks) go back to waiting
    in arrival order as if not admitted (their hits uncounted), a bystander is served; next step the
    readers look up again, and nothing hits the dropped blocks."""
    sch = caching_scheduler()
    system = list(range(1, 10))
    sch.add("a", system + [50], max_tokens=2)
    sch.add("b", system + [60, 61, 62, 63, 64, 65, 66], max_tokens=2)     # own block 8..11 full
    sch.add("x", [90, 91, 92], max_tokens=2)                               # a bystander
    sch.add("c", system + [60, 61, 62, 63, 70], max_tokens=2)             # hits a's and b's blocks
    out = sch.schedule()
    assert out.cache_hits == {"a": 0, "b": 8, "x": 0, "c": 12}
    assert out.same_step_hits == {"b": ("a",), "c": ("a", "b")}
    assert out.readers_of({"a"}) == {"b", "c"} and out.readers_of({"b"}) == {"c"}
    entries_before = len(sch.manager.cache)
    a_blocks = sch.manager.block_ids(sch.requests["a"].leader.seq_id)
    sampled = {c.seq_id: [0] for c in out.chunks if c.sample and c.request_id == "x"}
    done = sch.update(out, sampled, failed={"a": "RuntimeError: kernel failed"})
    assert [r.request_id for r in done] == ["a"] and sch.requests["a"].finish_reason == "error"
    assert [r.request_id for r in sch.waiting] == ["b", "c"]
    assert [r.request_id for r in sch.running] == ["x"]
    assert sch.requests["b"].cache_hits == [] and sch.requests["c"].cache_hits == []
    assert (sch.prefix_queries, sch.prefix_hits) == (10 + 3, 0)          # a and x; b and c uncounted
    assert not set(a_blocks) & set(sch.manager.cache.entries())           # a's blocks cache nothing
    assert sch.manager.cache.evictions == [] and len(sch.manager.cache) < entries_before
    assert all(s.num_computed == 0 for r in ("b", "c") for s in sch.requests[r].seqs)
    sch.check()
    out = sch.schedule()                                                 # b computes the prompt; c hits b
    assert out.cache_hits == {"b": 0, "c": 12} and out.same_step_hits == {"c": ("b",)}
    sch.update(out, {c.seq_id: [0] for c in out.chunks if c.sample})
    while sch.has_unfinished:
        o = sch.schedule()
        sch.update(o, {c.seq_id: [0] for c in o.chunks if c.sample})
        sch.check()
    assert sch.manager.num_free_blocks == 16


def test_readers_of_a_failed_part_need_no_tokens_and_may_not_send_any():
    sch = caching_scheduler()
    sch.add("a", list(range(1, 10)), max_tokens=2)
    sch.add("b", list(range(1, 10)) + [7], max_tokens=2)
    out = sch.schedule()
    b_seq = sch.requests["b"].leader.seq_id
    with pytest.raises(PagedKVError, match=rf"unexpected for \[{b_seq}\]"):   # b cannot have run
        sch.update(out, {b_seq: [0]}, failed={"a": "failed"})
    sch.update(out, {}, failed={"a": "failed"})
    assert sch.requests["b"].status == "waiting"


def test_a_scheduled_request_is_never_a_preemption_victim():
    """Its blocks may already be other requests' hits: choose_victim must pick among the candidates
    (the running requests not yet scheduled in the step), and a rule that returns another is refused
    by name.  Between schedule() and update() nothing ends or preempts a request."""
    sch = caching_scheduler(num_gpu_blocks=4)
    sch.add("a", [1, 2, 3, 4, 5], max_tokens=2)
    sch.add("b", [1, 2, 3, 4, 6], max_tokens=2)
    out = sch.schedule()
    assert out.same_step_hits == {"b": ("a",)}
    with pytest.raises(PagedKVError, match="in flight"):
        sch.finish_request("a")
    with pytest.raises(PagedKVError, match="in flight"):
        sch.preempt("a")
    sch.update(out, {c.seq_id: [0] for c in out.chunks if c.sample})
    # three requests of one block each fill 3 of 4 blocks; their second decode step needs a block
    # each: a takes the last one, b must preempt, and the rule names a, already scheduled in the step
    sch = caching_scheduler(num_gpu_blocks=4)
    for rid, first in (("a", 10), ("b", 20), ("c", 30)):
        sch.add(rid, [first, first + 1, first + 2], max_tokens=8)
    for _ in range(2):
        o = sch.schedule()
        sch.update(o, {c.seq_id: [0] for c in o.chunks if c.sample})
    committed = sch.requests["a"]
    sch.choose_victim = lambda candidates: committed                    # a broken victim rule
    with pytest.raises(PagedKVError, match="choose_victim returned 'a', not one of the candidates"):
        sch.schedule()
