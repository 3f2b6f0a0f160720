"""Automatic prefix caching on the tiny model: the issue's examples, golden cached == uncached
tokens and logits (also under preemption and chunked prefill), hit counters against a brute force."""

import pytest
import torch

from paged_kv.blocks import block_hashes
from paged_kv.engine import EngineConfig, LLMEngine
from paged_kv.errors import ConfigError
from paged_kv.model import load_tiny_model
from paged_kv.model.sampling import SamplingParams
from paged_kv.scheduling import Verdict


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_tiny_model()


def engine(model, **kw) -> LLMEngine:
    kw.setdefault("watermark", 0.0)
    kw.setdefault("block_size", 4)
    return LLMEngine(model, EngineConfig(**kw))


def capture(e: LLMEngine, results: list | None = None) -> list:
    """Record every SchedulerOutput the engine runs (the scheduler's plan, as planned), and into
    ``results`` every ModelRunnerOutput."""
    outs, plan, run = [], e.scheduler.schedule, e.runner.execute

    def schedule():
        outs.append(plan())
        return outs[-1]

    def execute(out):
        result = run(out)
        if results is not None:
            results.append(result)
        return result
    e.scheduler.schedule, e.runner.execute = schedule, execute
    return outs


def uncached(model, prompt, params, block_size=4, adapter_shift=None):
    """The request alone on an ample pool with caching off (no preemption, no hit)."""
    e = engine(model, num_gpu_blocks=256, block_size=block_size)
    kw = {}
    if adapter_shift is not None:
        e.load_adapter("a", adapter_shift)
        kw["adapter"] = "a"
    rid = e.add_request(prompt, params, **kw)
    while e.has_unfinished_requests():
        e.step()
    return e.output(rid).token_ids


def test_caching_is_off_by_default():
    assert EngineConfig(num_gpu_blocks=8).enable_prefix_caching is False
    with pytest.raises(ConfigError, match="recompute"):
        EngineConfig(num_gpu_blocks=8, num_cpu_blocks=4, preemption_mode="swap",
                     enable_prefix_caching=True).scheduler_config()


@pytest.mark.parametrize("salt", ["", 3, b"t1"])
def test_a_cache_salt_must_be_a_non_empty_str(tiny, salt):
    e = engine(tiny[0], num_gpu_blocks=8, enable_prefix_caching=True)
    with pytest.raises(ConfigError, match=f"cache_salt.*{salt!r}"):
        e.add_request([1, 2, 3], cache_salt=salt)
    assert not e.has_unfinished_requests()


def test_issue_hit_accounting_example(tiny):
    model, _ = tiny
    e = engine(model, num_gpu_blocks=6, max_num_batched_tokens=16, enable_prefix_caching=True)
    sch, m = e.scheduler, e.scheduler.manager
    outs = capture(e)
    R1 = list(range(1, 13))
    r1 = e.add_request(R1, SamplingParams(max_tokens=1))
    e.step()
    assert e.output(r1).finished
    r1_blocks = sorted(m.cache.entries())
    assert len(r1_blocks) == 3 and sorted(m.allocator.cached_free()) == r1_blocks   # 3 blocks cached, ref 0
    q = e.add_request([40, 41, 42, 43, 44, 45, 46], SamplingParams(max_tokens=2))
    e.step()
    assert len(m.block_table(sch.requests[q].seqs[0].seq_id)) == 2
    R2 = R1 + [20, 21, 22, 23, 24]
    r2 = e.add_request(R2, SamplingParams(max_tokens=2))
    before = (sch.prefix_queries, sch.prefix_hits, [m.allocator.ref_count(b) for b in range(6)])
    verdict = sch.admission(sch.requests[r2])
    assert verdict.verdict is Verdict.LATER and "needs 2 new blocks; 1 other blocks are free" in verdict.reason
    e.step()                                   # Q decodes and finishes; R2's admission fails
    assert e.output(q).finished and sch.requests[r2].status == "waiting"
    assert sch.requests[r2].cache_hits == [] and outs[-1].cache_hits == {}
    assert (sch.prefix_queries, sch.prefix_hits) == before[:2] == (12 + 7, 0)
    e.step()                                   # admitted: 12 tokens hit, positions 12..16 run
    assert outs[-1].cache_hits == {r2: 12}
    (c,) = outs[-1].chunks
    assert (c.start, c.query_len) == (12, 5)
    table = m.block_table(sch.requests[r2].seqs[0].seq_id).block_ids
    assert table[:3] == sorted(r1_blocks) and len(table) == 5        # the hits + 2 new blocks
    assert len(e.output(r2).token_ids[0]) == 1
    assert sch.preempt(r2) == "recompute"
    e.step()                                   # resumed: 16 tokens hit, positions 16..17 run
    assert outs[-1].cache_hits == {r2: 16}
    (c,) = outs[-1].chunks
    assert (c.start, c.query_len) == (16, 2)
    assert e.output(r2).finished and e.output(r2).cached_tokens == [12, 16]
    # first admissions and the re-admission after the preemption are counted apart (as vLLM does)
    assert (sch.prefix_queries, sch.prefix_hits) == (12 + 7 + 17, 12)
    assert (sch.preempted_prefix_queries, sch.preempted_prefix_hits) == (18, 16)
    assert e.output(r2).token_ids == uncached(model, R2, SamplingParams(max_tokens=2))
    assert m.num_free_blocks == 6
    sch.check()


def test_issue_what_goes_into_the_hash(tiny):
    model, _ = tiny
    e = engine(model, num_gpu_blocks=16, enable_prefix_caching=True)
    P = [5, 9, 13, 17, 21, 25, 29, 33, 37]
    greedy, sampled = SamplingParams(max_tokens=4), SamplingParams(max_tokens=5, temperature=0.8, seed=3)
    e.load_adapter("one", 7)
    runs = [(None, greedy, None), ("one", greedy, 7), ("one", greedy, 7), (None, sampled, None), ("one", greedy, 11)]
    hits, keys = [], []
    for i, (adapter, params, shift) in enumerate(runs):
        if i == 4:
            e.load_adapter("one", 11)            # reloaded: a different K/V effect, the same name
        rid = e.add_request(P, params, adapter=adapter)
        while e.has_unfinished_requests():
            e.step()
        hits.append(e.output(rid).cached_tokens[0])
        keys.append(e.scheduler.requests[rid].extra_key)
        assert e.output(rid).token_ids == uncached(model, P, params, adapter_shift=shift)
    assert hits == [0, 0, 8, 8, 0]
    assert e.scheduler.manager.cache.evictions == []          # pool 16: nothing evicted
    chains = {k: block_hashes(P, 4, k) for k in (keys[0], keys[1], keys[4])}
    assert len(chains) == 3 and keys[3] == keys[0] and keys[2] == keys[1]
    for i in range(2):                                        # differ per key from block 0 on
        assert len({c[i] for c in chains.values()}) == 3


@pytest.mark.parametrize("prompt_len,hit", [(32, 16), (40, 32)])
def test_full_hit_still_runs_the_last_token(tiny, prompt_len, hit):
    model, _ = tiny
    prompt = [(7 * i + 3) % 200 + 1 for i in range(prompt_len)]
    params = SamplingParams(max_tokens=3)
    e = engine(model, num_gpu_blocks=32, block_size=16, enable_prefix_caching=True)
    outs = capture(e)
    first = e.generate(prompt, params)[0]
    second = e.generate(prompt, params)[0]
    assert first.cached_tokens == [0] and second.cached_tokens == [hit]
    prefill = [c for o in outs[-3:] for c in o.chunks if c.start == hit]
    assert prefill and prefill[0].query_len == prompt_len - hit        # the uncached tail, never 0 tokens
    want = uncached(model, prompt, params, block_size=16)
    assert first.token_ids == second.token_ids == want


def test_a_colliding_hash_never_hands_out_a_wrong_block(tiny):
    model, _ = tiny
    params = SamplingParams(max_tokens=3)
    e = engine(model, num_gpu_blocks=32, enable_prefix_caching=True,
               prefix_caching_hash_algo=lambda parent, tokens, key: 0)   # every block collides
    A, B = [11, 12, 13, 14], [21, 22, 23, 24]
    prompts = [A + B + [1], B + B + [1], A + A + [1], A + B + [2]]
    got = [e.generate(p, params)[0] for p in prompts]
    # A+B+[2] shares A+B with the first prompt; the others share no block-aligned prefix with anyone
    assert [o.cached_tokens[0] for o in got] == [0, 0, 4, 8]
    for p, o in zip(prompts, got):
        assert o.token_ids == uncached(model, p, params)


def run_trace(model, prompts, params, caching, **kw):
    """Serve all prompts at once; returns (token ids, logits per (request, sample, position), engine)."""
    e = engine(model, enable_prefix_caching=caching, **kw)
    logits, results = {}, []
    outs = capture(e, results)
    ids = [e.add_request(p, sp) for p, sp in zip(prompts, params)]
    while e.has_unfinished_requests():
        e.step()
        for c in outs[-1].chunks:
            if c.sample:
                logits[(c.request_id, c.index, c.start + c.query_len - 1)] = results[-1].logits[c.seq_id].clone()
    return [e.output(i).token_ids for i in ids], logits, e


def shared_prefix_prompts(n=8):
    system = [(3 * i + 1) % 250 + 1 for i in range(13)]
    shots = [[(5 * i + j) % 250 + 1 for i in range(9)] for j in range(2)]
    return [system + shots[k % 2] + [(11 * k + i) % 250 + 1 for i in range(2 + k % 5)] for k in range(n)]


@pytest.mark.parametrize("kw", [dict(num_gpu_blocks=64, max_num_batched_tokens=512),      # ample
                                dict(num_gpu_blocks=14, max_num_batched_tokens=512),      # preemption
                                dict(num_gpu_blocks=64, max_num_batched_tokens=7),        # chunked prefill
                                dict(num_gpu_blocks=16, max_num_batched_tokens=9)])       # both
def test_golden_cached_equals_uncached(tiny, kw):
    model, _ = tiny
    prompts = shared_prefix_prompts()
    params = [SamplingParams(max_tokens=6 + k % 3, n=2 if k == 3 else 1,
                             temperature=0.7 if k == 3 else 0.0, seed=k) for k in range(len(prompts))]
    # requests arrive in two waves so the second wave can hit the first one's blocks
    off_tokens, off_logits, _ = run_trace(model, prompts, params, False, **kw)
    on_tokens, on_logits, e = run_trace(model, prompts, params, True, **kw)
    assert on_tokens == off_tokens
    assert on_logits.keys() == off_logits.keys()
    for k in off_logits:
        torch.testing.assert_close(on_logits[k], off_logits[k], rtol=1e-4, atol=1e-4)
    e.scheduler.check()
    assert e.scheduler.manager.num_free_blocks == kw["num_gpu_blocks"]
    if kw["num_gpu_blocks"] == 14:
        assert e.stats.preemptions > 0
    if kw["max_num_batched_tokens"] < 10:
        assert e.stats.prefix_hits > 0


def brute_force_hits(history, prompt, block_size):
    """Tokens of ``prompt`` found as a block-aligned prefix of any earlier request's computed tokens
    (prompt + output but its last token), at most (len - 1) // BS blocks: the definition, directly."""
    best = 0
    for done in history:
        k = 0
        while k < len(prompt) and k < len(done) and prompt[k] == done[k]:
            k += 1
        best = max(best, k)
    return min(best // block_size, (len(prompt) - 1) // block_size) * block_size


def test_hit_counters_equal_a_brute_force_count(tiny):
    model, _ = tiny
    prompts = shared_prefix_prompts(10) + [shared_prefix_prompts(1)[0][:6] + [99, 98]]
    e = engine(model, num_gpu_blocks=128, enable_prefix_caching=True)
    history, want = [], []
    for p in prompts:                          # one after the other: the cache holds all earlier ones
        out = e.generate(p, SamplingParams(max_tokens=5))[0]
        want.append(brute_force_hits(history, p, 4))
        history.append(p + out.token_ids[0][:-1])
        assert out.cached_tokens == [want[-1]]
    assert e.stats.prefix_hits == sum(want) > 0
    assert e.stats.prefix_queries == sum(len(p) for p in prompts)
    assert e.stats.prompt_tokens == sum(len(p) for p in prompts) - sum(want)    # the prefill saved


def test_shared_prefix_workload_and_serve_trace_with_prompts():
    from paged_kv.engine.serving import shared_prefix_workload, serve_trace
    from paged_kv.sim import IterationTime
    w = shared_prefix_workload(12, 8, None, num_prefixes=2, warm=True, seed=3)
    firsts = {tuple(p[:8]) for p in w.prompts}
    assert firsts <= {tuple(range(1, 9)), tuple(range(9, 17))}
    assert all(min(p[8:]) > 16 for p in w.prompts)                 # own tokens never repeat a prefix
    assert [len(p) for p in w.prompts] == w.trace.prompt_len.tolist()
    assert w.trace.arrival_s[0] < w.trace.arrival_s[1:].min()      # warm: the first comes alone
    cfg = EngineConfig(block_size=4, num_gpu_blocks=256, watermark=0.0, enable_prefix_caching=True)
    r = serve_trace(w.trace, cfg, IterationTime(), prompts=w.prompts)
    # request 0 computes its prefix alone; the others arrive after it and are admitted together: every
    # request hits the 8 prefix tokens of any request before it with the same prefix, in an earlier step
    # or in the same one (blocks are registered when scheduled, as in vLLM v1)
    want = 8 * sum(any(q[:8] == p[:8] for q in w.prompts[:i]) for i, p in enumerate(w.prompts))
    others = [p for p in w.prompts if p[:8] != w.prompts[0][:8]]
    assert r.stats.prefix_hits == want and len(others) >= 2        # the other prefix is shared in one step
    with pytest.raises(ConfigError, match="prompts must be"):
        serve_trace(w.trace, cfg, IterationTime(), prompts=w.prompts[:-1])


def test_the_hit_rate_counts_first_admissions_only(tiny):
    """Prompts that share nothing, under pressure that preempts by recompute: a re-admitted request
    re-finds its own blocks, which says nothing about sharing; the hit rate stays 0 and the
    re-admissions' hits are counted apart."""
    model, _ = tiny
    prompts = [[7 + i] + [100 + 10 * i + k for k in range(11)] for i in range(4)]   # no common prefix
    e = engine(model, num_gpu_blocks=12, max_num_batched_tokens=64, enable_prefix_caching=True)
    e.generate(prompts, SamplingParams(max_tokens=14))
    assert e.stats.recomputes > 0 and e.stats.preempted_prefix_hits > 0
    assert e.stats.prefix_hits == 0 and e.stats.prefix_hit_rate == 0
    assert e.stats.prefix_queries == sum(len(p) for p in prompts)
