"""The waiting queue's policy: FCFS, or longest prefix match first (``SchedulerConfig.policy="lpm"``,
SGLang's ``--schedule-policy lpm``).  Pure: no model; the sampled tokens are made up.

The order against a brute force over every permutation; LPM equal to FCFS, step for step, whenever
nothing can be found in the cache; a later arrival with a hit passing an earlier one without; the
starvation the docstring of :func:`~paged_kv.scheduling.rules.admission_order` describes; and a
preempted request, put back in arrival order, re-admitted first because it re-finds its own blocks.
"""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv.engine import EngineConfig
from paged_kv.errors import AdmissionError, ConfigError
from paged_kv.scheduling import POLICIES, Scheduler, SchedulerConfig, admission_order


# --- the order alone -----------------------------------------------------------------------------
def brute_force_lpm(queue, hits, arrival):
    """The one permutation of ``queue`` in which every earlier request has a longer hit than every later
    one, or the same hit and an earlier arrival: found by trying them all."""
    def ok(p):
        return all(hits[a] > hits[b] or (hits[a] == hits[b] and arrival[a] < arrival[b])
                   for i, a in enumerate(p) for b in p[i + 1:])
    found = [list(p) for p in itertools.permutations(queue) if ok(p)]
    assert len(found) == 1, f"{len(found)} orders satisfy the rule"
    return found[0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50)), min_size=0, max_size=6, unique_by=lambda t: t[1]))
def test_lpm_order_is_the_brute_force_one(rows):
    """Small random queues (hits of 0-3 blocks, often tied; distinct arrivals, given in arrival order as
    the scheduler keeps them)."""
    rows = sorted(rows, key=lambda t: t[1])
    queue = [f"r{a}" for _, a in rows]
    hits = {f"r{a}": 16 * h for h, a in rows}
    arrival = {f"r{a}": a for _, a in rows}
    got = admission_order(queue, "lpm", hits.__getitem__, arrival.__getitem__)
    assert got == brute_force_lpm(queue, hits, arrival)
    assert admission_order(queue, "fcfs") == queue and admission_order(queue, "fcfs") is not queue
    if len(set(hits.values())) <= 1:                     # nothing to tell them apart: arrival order
        assert got == queue


def test_arrival_numbers_break_ties_when_no_key_is_given():
    assert admission_order([3, 1, 2], "lpm", {1: 0, 2: 4, 3: 4}.__getitem__) == [2, 3, 1]


def test_an_unknown_policy_and_a_missing_hit_are_refused():
    with pytest.raises(ConfigError, match="'LPM'"):
        admission_order([1], "LPM", lambda r: 0)
    with pytest.raises(ConfigError, match="cached_tokens"):
        admission_order([1], "lpm")
    with pytest.raises(ConfigError, match=r"policy must be one of \('fcfs', 'lpm'\), got 'priority'"):
        SchedulerConfig(8, 4, policy="priority")
    assert POLICIES == ("fcfs", "lpm")
    assert EngineConfig(num_gpu_blocks=8, policy="lpm").scheduler_config().policy == "lpm"


# --- the scheduler: LPM is FCFS when nothing is cached ---------------------------------------------
def step(sch):
    out = sch.schedule()
    sch.update(out, {c.seq_id: [500 + c.seq_id] * c.num_samples for c in out.chunks if c.sample})
    return out


def run(cfg, requests):
    """Serve ``requests`` (``(prompt, n, max_tokens)``, all queued at once; one that could never run
    here is refused and left out) to the end; every step as plain data."""
    sch = Scheduler(cfg)
    for i, (prompt, n, max_tokens) in enumerate(requests):
        try:
            sch.add(f"r{i}", prompt, n=n, max_tokens=max_tokens)
        except AdmissionError:
            pass
    steps = []
    while sch.has_unfinished:
        out = step(sch)
        steps.append((out.admitted, [(c.request_id, c.seq_id, c.start, c.query_len) for c in out.chunks],
                      out.preempted, out.cache_hits))
        sch.check()
    return steps


workloads = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 12), st.integers(1, 3), st.integers(1, 5)),
                     min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(workloads, st.integers(6, 24), st.sampled_from([1, 2, 256]))
def test_lpm_is_fcfs_step_for_step_without_prefix_caching(reqs, blocks, max_num_seqs):
    """Prompts that share prefixes, a pool small enough to preempt: with caching off nothing is ever
    found, and the two policies schedule exactly the same steps."""
    requests = [([1] * shared + [10 + i] * tail, n, m) for i, (shared, tail, n, m) in enumerate(reqs)]
    cfg = dict(num_gpu_blocks=blocks, block_size=2, watermark=0.0, max_num_seqs=max_num_seqs,
               max_num_batched_tokens=8)
    assert run(SchedulerConfig(**cfg, policy="lpm"), requests) == run(SchedulerConfig(**cfg), requests)


@settings(max_examples=60, deadline=None)
@given(workloads, st.sampled_from([1, 2, 256]))
def test_lpm_is_fcfs_step_for_step_when_no_prompt_hits(reqs, max_num_seqs):
    """Caching on, but every prompt starts with its own first block, and the pool is large enough that
    nobody is preempted (a preempted request would re-find its own blocks), so the cache never holds
    anything a waiting request could find."""
    requests = [([100 + i] * 2 + [1] * shared + [10 + i] * tail, n, m)
                for i, (shared, tail, n, m) in enumerate(reqs)]
    cfg = dict(num_gpu_blocks=512, block_size=2, watermark=0.0, max_num_seqs=max_num_seqs,
               max_num_batched_tokens=8, enable_prefix_caching=True)
    fcfs = run(SchedulerConfig(**cfg), requests)
    assert run(SchedulerConfig(**cfg, policy="lpm"), requests) == fcfs
    assert all(h == 0 for *_, preempted, hits in fcfs for h in hits.values()) and not any(p for *_, p, _ in fcfs)


# --- the scheduler: what LPM changes ---------------------------------------------------------------
SHARED = list(range(1, 13))         # three blocks of 4


def warm(policy, max_num_seqs=1):
    """A scheduler whose cache holds ``SHARED`` (three cached-free blocks), nothing running."""
    sch = Scheduler(SchedulerConfig(64, 4, watermark=0.0, max_num_seqs=max_num_seqs, max_num_batched_tokens=64,
                                    enable_prefix_caching=True, policy=policy))
    sch.add("w", SHARED + [99], max_tokens=1)
    while sch.has_unfinished:
        step(sch)
    return sch


def admissions(sch):
    order = []
    while sch.has_unfinished:
        order += step(sch).admitted
        sch.check()
    return order


@pytest.mark.parametrize("policy", POLICIES)
def test_a_later_arrival_with_a_hit_goes_first_under_lpm_only(policy):
    sch = warm(policy)
    sch.add("cold", [50 + t for t in range(13)], max_tokens=2)
    sch.add("hot", SHARED + [77], max_tokens=2)
    out = step(sch)
    assert out.admitted == (["hot"] if policy == "lpm" else ["cold"])
    assert out.cache_hits == ({"hot": 12} if policy == "lpm" else {"cold": 0})
    assert [r.request_id for r in sch.waiting] == [("cold" if policy == "lpm" else "hot")]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_starvation_a_cold_request_is_passed_by_every_hot_one_behind_it(k):
    """What ``admission_order``'s docstring says: under LPM a request is passed over by every waiting
    request with a longer hit, including later arrivals, so its wait grows with them (here one request
    runs at a time, each for 2 steps); it is admitted once none is ahead, and the run finishes.  Under
    FCFS it goes first whatever comes after it."""
    got = {}
    for policy in POLICIES:
        sch = warm(policy)
        sch.add("cold", [50 + t for t in range(13)], max_tokens=2)
        for i in range(k):
            sch.add(f"hot{i}", SHARED + [70 + i], max_tokens=2)
        start = sch._step
        order, admitted_at = [], None
        while sch.has_unfinished:
            out = step(sch)
            order += out.admitted
            if "cold" in out.admitted:
                admitted_at = sch._step - start
        got[policy] = order, admitted_at
        assert sch.requests["cold"].status == "finished"
    hot = [f"hot{i}" for i in range(k)]
    assert got["lpm"][0] == hot + ["cold"] and got["fcfs"][0] == ["cold"] + hot
    assert got["fcfs"][1] == 1 and got["lpm"][1] == 2 * k + 1        # 2 steps per hot request ahead


def test_a_preempted_request_requeues_in_arrival_order_and_lpm_readmits_it_first():
    """``hot`` (arrived after ``cold``) runs first under LPM; preempted after its prefill, it goes back
    to ``waiting`` in arrival order, behind ``cold``, as under FCFS.  Its own full blocks are cached now,
    so it finds more than ``cold`` does and LPM admits it again first; the hit counts as a re-admission's."""
    sch = warm("lpm")
    sch.add("cold", [50 + t for t in range(13)], max_tokens=3)
    hot = SHARED + [77, 78, 79, 80, 81]               # 17 tokens: four full blocks once prefilled
    sch.add("hot", hot, max_tokens=3)
    assert step(sch).admitted == ["hot"]
    sch.preempt("hot")
    assert [r.request_id for r in sch.waiting] == ["cold", "hot"]      # arrival order kept
    before = sch.preempted_prefix_hits
    out = step(sch)
    assert out.admitted == ["hot"] and out.cache_hits == {"hot": 16}
    assert sch.preempted_prefix_hits - before == 16
    assert admissions(sch) == ["cold"]
