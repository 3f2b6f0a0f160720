"""Speculative decoding in the engine: the scheduler's verify chunks and lookahead slots, the
runner's verification, the rollback; greedy output equal to plain greedy's under every setting."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paged_kv.engine import EngineConfig, LLMEngine, TimingRunner
from paged_kv.errors import ConfigError, PagedKVError
from paged_kv.model import load_tiny_model
from paged_kv.sampling_params import SamplingParams
from paged_kv.scheduling import Scheduler, SchedulerConfig
from paged_kv.spec_decode import NgramProposer, replay_speculation

from conftest import peak_blocks, serve_arrivals

NGRAM = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 3, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_tiny_model()


class Fixed:
    """A stub proposer: always the same draft (cut to the limit); records its calls."""

    def __init__(self, draft):
        self.draft, self.calls, self.released = list(draft), [], []

    def propose(self, token_ids, limit=None, *, seq_id=None):
        self.calls.append((tuple(token_ids), limit, seq_id))
        return self.draft[:limit]

    def release(self, seq_id=None):
        self.released.append(seq_id)


def source(seq_id, tokens):
    """A token source that repeats with period 3 after the prompt: 7, 8, 9, 7, 8, 9, ..."""
    return 7 + len(tokens) % 3


# --- the measurement, through the engine ---------------------------------------------
def test_ngram_on_the_tiny_model_equals_the_replay(tiny):
    """ROMEO:\n, 249 greedy bytes (the most the tiny model's 256 positions allow), k = 6, 3-gram: the
    engine's output is plain greedy's, and its steps, drafts and rollbacks are those of the
    model-free replay of the same continuation (``replay_speculation``, an independent loop; the
    prompt has no recurring 3-gram, so neither drafts at the prefill)."""
    model, tok = tiny
    params = SamplingParams(max_tokens=249)
    plain = LLMEngine(model, EngineConfig(num_gpu_blocks=64), tokenizer=tok)
    spec = LLMEngine(model, EngineConfig(num_gpu_blocks=64, speculative_config=NGRAM), tokenizer=tok)
    a, b = plain.generate("ROMEO:\n", params)[0], spec.generate("ROMEO:\n", params)[0]
    assert b.token_ids == a.token_ids and b.text == a.text
    trace = replay_speculation(tok.encode("ROMEO:\n"), a.token_ids[0], NgramProposer(6, 3, 3),
                               block_size=16, num_blocks=64)
    s = spec.stats
    assert plain.stats.steps == 249 and s.steps == trace.passes < 249
    assert (s.num_draft_tokens, s.num_accepted_tokens) == (trace.drafted, trace.accepted)
    assert s.generated == 249 and math.isclose(s.acceptance_rate, trace.acceptance_rate)
    assert spec.scheduler.manager.num_free_blocks == 64


def test_draft_model_is_lossless_and_releases_its_cache(tiny):
    model, tok = tiny
    params = SamplingParams(max_tokens=60)
    plain = LLMEngine(model, EngineConfig(num_gpu_blocks=32), tokenizer=tok).generate(["ROMEO:\n", "To be"], params)
    e = LLMEngine(model, EngineConfig(num_gpu_blocks=32, speculative_config={
        "method": "draft_model", "num_speculative_tokens": 3, "draft_num_layers": 2}), tokenizer=tok)
    outs = e.generate(["ROMEO:\n", "To be"], params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert e.stats.steps < 2 * 60 and e.stats.num_accepted_tokens > 0
    m = e.scheduler.proposer.manager                   # the draft's own pool: every block back
    assert m.num_free_blocks == m.num_blocks == 64


# --- greedy equality under every setting (hypothesis) ----------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_greedy_output_is_plain_greedy_hypothesis(small_model, data):
    """Every method, k, block size, n > 1 (forks; near-zero temperature, so each sample is the argmax),
    preemption by recompute or swap, prefix caching, tight budgets and pools: every request's tokens
    equal its solo run without speculation, and both pools end whole."""
    torch.set_num_threads(1)
    bs = data.draw(st.sampled_from([1, 2, 3, 4, 8]), label="block_size")
    caching = data.draw(st.booleans(), label="prefix caching")
    mode = "recompute" if caching else data.draw(st.sampled_from(["recompute", "swap"]), label="mode")
    method = data.draw(st.sampled_from(["ngram", "draft_model"]), label="method")
    k = data.draw(st.integers(1, 5), label="k")
    spec = {"method": method, "num_speculative_tokens": k}
    if method == "ngram":
        spec["prompt_lookup_min"] = data.draw(st.integers(1, 3), label="n-gram")
    system = data.draw(st.lists(st.integers(0, 3), min_size=0, max_size=6), label="shared prefix")
    arrivals = []
    for i in range(data.draw(st.integers(1, 4), label="requests")):
        n = data.draw(st.sampled_from([1, 1, 2]), label="n")
        params = SamplingParams(max_tokens=data.draw(st.integers(1, 12), label="max_tokens"), n=n,
                                temperature=0.0 if n == 1 else 1e-9, seed=None if n == 1 else i)
        prompt = system + data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=10), label="prompt")
        arrivals.append((data.draw(st.integers(0, 5), label="arrival step"), prompt, params))
    need = max(peak_blocks(len(p), sp.n, sp.max_tokens, bs) for _, p, sp in arrivals)
    pool = need + data.draw(st.integers(0, 3), label="spare blocks")
    knobs = dict(block_size=bs, num_gpu_blocks=pool, watermark=0.0, preemption_mode=mode,
                 num_cpu_blocks=0 if caching else pool, enable_prefix_caching=caching,
                 max_num_batched_tokens=data.draw(st.integers(1, 16), label="budget"))
    e = LLMEngine(small_model, EngineConfig(**knobs, speculative_config=spec))
    ids = serve_arrivals(e, arrivals, max_steps=3000)
    for rid, prompt, params in ids:
        solo = LLMEngine(small_model, EngineConfig(block_size=bs, num_gpu_blocks=256)).generate(prompt, params)[0]
        assert e.output(rid).token_ids == solo.token_ids, (rid, prompt, params)
    m = e.scheduler.manager
    assert m.num_free_blocks == pool
    assert 0 <= e.stats.num_accepted_tokens <= e.stats.num_draft_tokens
    if method == "draft_model":
        d = e.scheduler.proposer.manager
        assert d.num_free_blocks == d.num_blocks


# --- the scheduler's rules, on the timing runner ---------------------------------------------
def timing_engine(proposer_draft=None, k=3, **knobs):
    knobs.setdefault("block_size", 4)
    knobs.setdefault("num_gpu_blocks", 16)
    knobs.setdefault("watermark", 0.0)
    config = EngineConfig(**knobs, speculative_config={"method": "ngram", "num_speculative_tokens": k})
    e = LLMEngine(None, config, runner=TimingRunner(lambda kv, pre: 0.01, block_size=config.block_size,
                                                    next_token=source))
    if proposer_draft is not None:
        e.scheduler.proposer = Fixed(proposer_draft)
    return e


def test_golden_trace_a_draft_across_a_block_boundary():
    """Block size 4, 16 blocks handed out 0, 1, 2, ...; the token source gives 7 + (length % 3).
    A 5-token prompt prefills into blocks 0, 1 and samples 9 (6 tokens).  Step 2 feeds 9 at
    position 5 with the drafts [7, 9, 9] at 6..8: position 8 takes block 2.  The source gives 7
    after 6 tokens (accepted) and 8 after 7 (the draft 9 is rejected): 2 tokens emitted, 7
    computed, and block 2, wholly past the cut, goes back to the tail of the free queue, behind
    3 .. 15 (FIFO, no prefix cache)."""
    e = timing_engine([7, 9, 9])
    rid = e.add_request([1, 2, 3, 4, 5], SamplingParams(max_tokens=10))
    e.step()                                           # the prefill; the source after 5 tokens: 9
    seq = e.scheduler.requests[rid].seqs[0]
    assert seq.tokens == [1, 2, 3, 4, 5, 9] and e.scheduler.manager.block_ids(seq.seq_id) == (0, 1)
    out = e.scheduler.schedule()
    (c,) = out.chunks
    assert c.token_ids == (9, 7, 9, 9) and c.spec_token_ids == (7, 9, 9) and c.start == 5
    assert c.block_table == (0, 1, 2) and c.slot_mapping == (5, 6, 7, 8)
    assert (out.decode_tokens, out.num_draft_tokens, out.num_tokens) == (1, 3, 4)
    result = e.runner.execute(out)
    assert result.sampled_token_ids[seq.seq_id] == [7, 8]          # source: 7 after 6, 8 after 7 tokens
    e.scheduler.update(out, result.sampled_token_ids)
    assert seq.tokens == [1, 2, 3, 4, 5, 9, 7, 8] and seq.num_computed == 7
    assert e.scheduler.manager.block_ids(seq.seq_id) == (0, 1)
    assert e.scheduler.manager.allocator.free_list() == list(range(3, 16)) + [2]
    assert (e.scheduler.num_draft_tokens, e.scheduler.num_accepted_tokens) == (3, 1)
    e.scheduler.check()


def test_the_draft_is_capped_by_max_tokens_and_the_budget():
    e = timing_engine([7, 8, 9, 7, 8], k=5, max_num_batched_tokens=3)
    e.add_request([1, 2, 3], SamplingParams(max_tokens=5))
    e.step()
    prop = e.scheduler.proposer
    e.step()                                           # budget 3: the fed token and 2 drafts
    assert prop.calls[-1][1] == 2
    while e.has_unfinished_requests():
        e.step()
    assert all(limit <= 5 - (len(t) - 3) - 1 for t, limit, _ in prop.calls)    # never past max_tokens
    assert len(e.outputs()[0].token_ids[0]) == 5
    assert prop.released == [e.scheduler.finished[0].seqs[0].seq_id]


def test_no_draft_for_a_prefill_and_none_that_preempts():
    """The drafts' blocks must fit beside what the running requests still to schedule need now.
    Pool of 3 blocks of 4: after the prefills A holds 3 of block 0's slots, B all of block 1, and
    one block is free.  A's drafts would take it and leave B's next token without one, so A decodes
    without speculation; B, scheduled last, speculates in that block.  Nobody is preempted."""
    e = timing_engine([7, 8, 9], num_gpu_blocks=3, k=3)
    a = e.add_request([1, 2, 3], SamplingParams(max_tokens=6))
    b = e.add_request([4, 5, 6, 1], SamplingParams(max_tokens=6))
    out = e.scheduler.schedule()                        # both prefill: no drafts in a prefill
    assert not any(c.spec_token_ids for c in out.chunks)
    e.scheduler.update(out, e.runner.execute(out).sampled_token_ids)
    assert e.scheduler.manager.num_free_blocks == 1
    out = e.scheduler.schedule()
    chunks = {c.request_id: c for c in out.chunks}
    assert chunks[a].spec_token_ids == () and chunks[a].query_len == 1
    assert chunks[b].spec_token_ids == (7, 8, 9) and chunks[b].block_table == (1, 2)
    assert out.preempted == [] and e.scheduler.manager.num_free_blocks == 0
    e.scheduler.update(out, e.runner.execute(out).sampled_token_ids)
    e.scheduler.check()
    while e.has_unfinished_requests():
        e.step()
        e.scheduler.check()
    assert e.scheduler.manager.num_free_blocks == 3


def test_drafts_are_never_cached_before_they_are_verified():
    """Prefix caching on, block size 4: a 7-token prompt fills block 0 (registered) and 3 slots of
    block 1; the verify chunk feeds the sampled token at position 7 (block 1 is then full of verified
    tokens: registered) and 4 drafts at 8..11 (block 2: never registered).  The source rejects the
    first draft, so block 2 is freed, uncached, to the head of the free queue (it caches nothing)."""
    e = timing_engine([5, 5, 5, 5], k=4, enable_prefix_caching=True)
    rid = e.add_request([1, 2, 3, 4, 5, 6, 7], SamplingParams(max_tokens=8))
    e.step()
    cache = e.scheduler.manager.cache
    seq = e.scheduler.requests[rid].seqs[0]
    assert 0 in cache and 1 not in cache
    out = e.scheduler.schedule()
    (c,) = out.chunks
    assert c.spec_token_ids == (5, 5, 5, 5) and c.block_table == (0, 1, 2)
    assert 1 in cache and 2 not in cache
    e.scheduler.update(out, e.runner.execute(out).sampled_token_ids)
    assert seq.num_computed == 8 and len(seq.tokens) == 9
    assert 2 not in cache and e.scheduler.manager.allocator.free_list()[0] == 2
    e.scheduler.check()


def test_a_runner_must_return_the_accepted_prefix():
    e = timing_engine([7, 8, 9])
    e.add_request([1, 2, 3], SamplingParams(max_tokens=8))
    e.step()
    out = e.scheduler.schedule()
    (c,) = out.chunks
    assert c.spec_token_ids
    d = list(c.spec_token_ids)
    for bad in ([], [d[0] + 1, 0], d + [0, 0]):
        with pytest.raises(PagedKVError, match="accepted drafts and one token more"):
            e.scheduler.update(out, {c.seq_id: bad})
    e.scheduler.update(out, {c.seq_id: d[:1] + [5]})      # one accepted, then the target's own
    e.scheduler.check()


def test_stop_strings_and_stop_tokens_cut_an_accepted_run(tiny):
    """A stop string completed by an accepted draft ends the sample there: the later accepted tokens
    are dropped, as plain decoding never produced them."""
    model, tok = tiny
    for params in (SamplingParams(max_tokens=120, stop=["the"]), SamplingParams(max_tokens=120, stop=["e", "o"]),
                   SamplingParams(max_tokens=120, stop_token_ids=[tok.encode("e")[0]]),
                   SamplingParams(max_tokens=120, stop=["he"], include_stop_str_in_output=True)):
        plain = LLMEngine(model, EngineConfig(num_gpu_blocks=64), tokenizer=tok).generate("ROMEO:\n", params)[0]
        e = LLMEngine(model, EngineConfig(num_gpu_blocks=64, speculative_config={
            "method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 1}), tokenizer=tok)
        got = e.generate("ROMEO:\n", params)[0]
        assert (got.token_ids, got.text, got.finish_reason) == \
            (plain.token_ids, plain.text, plain.finish_reason), params
        assert e.scheduler.manager.num_free_blocks == 64


def test_refusals(tiny):
    model, tok = tiny
    with pytest.raises(ConfigError, match="eagle"):
        EngineConfig(num_gpu_blocks=8, speculative_config={"method": "eagle"})
    with pytest.raises(ConfigError, match="give LLMEngine the model"):
        LLMEngine(None, EngineConfig(num_gpu_blocks=8, speculative_config={"method": "draft_model"}),
                  iteration_time=lambda kv, pre: 0.0)
    with pytest.raises(ConfigError, match="a draft of 5 layers: the target has only 4"):
        LLMEngine(model, EngineConfig(num_gpu_blocks=8, speculative_config={
            "method": "draft_model", "draft_num_layers": model.cfg.num_layers + 1}))
    with pytest.raises(ConfigError, match="both a proposer and num_lookahead_tokens"):
        Scheduler(SchedulerConfig(num_gpu_blocks=8, num_lookahead_tokens=2))
    with pytest.raises(ConfigError, match="both a proposer and num_lookahead_tokens"):
        Scheduler(SchedulerConfig(num_gpu_blocks=8), NgramProposer(2))
    with pytest.raises(ConfigError, match="propose"):
        Scheduler(SchedulerConfig(num_gpu_blocks=8, num_lookahead_tokens=2), object())
    e = timing_engine([7, 8, 9, 7])
    e.scheduler.proposer.draft = None
    e.scheduler.proposer.propose = lambda t, limit=None, seq_id=None: [1] * (limit + 1)
    e.add_request([1, 2, 3], SamplingParams(max_tokens=8))
    e.step()
    with pytest.raises(ConfigError, match="more than its limit 3"):
        e.scheduler.schedule()


def chi2_sf(x: float, df: int) -> float:
    """P(chi-square with an even ``df`` > x): exp(-x/2) * sum_{i < df/2} (x/2)^i / i! (closed form)."""
    assert df % 2 == 0
    term = total = 1.0
    for i in range(1, df // 2):
        term *= (x / 2) / i
        total += term
    return math.exp(-x / 2) * total


def test_chi2_sf_against_a_brute_force():
    """The closed form against a Monte Carlo of sums of squared normals."""
    g = torch.Generator().manual_seed(0)
    draws = (torch.randn(200_000, 4, generator=g, dtype=torch.float64) ** 2).sum(1)
    for x in (1.0, 4.0, 9.0):
        assert abs(chi2_sf(x, 4) - float((draws > x).double().mean())) < 0.005


def test_sampling_with_speculation_keeps_the_target_distribution(small_model):
    """The engine's sampled path (the rejection rule, ``q`` one-hot) against the exact distribution
    of the first three tokens under top-k 3 (27 outcomes, by full forwards), by a chi-square test
    at the 0.001 level over 1,200 seeded requests.  The draft is the *second* most likely token
    after the first, so both acceptance and the residual draw are exercised.  The same test rejects
    a runner that accepts every draft (the planted bug): it has the power to see one."""
    torch.set_num_threads(1)
    prompt, N = [5, 6, 7, 5, 6, 7, 5, 6], 1200
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=3, seed=s) for s in range(N)]

    with torch.no_grad():
        def top3(ctx):
            logits = small_model(torch.tensor([ctx]))[0, -1].double()
            vals, idx = torch.topk(logits, 3)
            return dict(zip(idx.tolist(), torch.softmax(vals, 0).tolist()))
        exact, second = {}, {}
        for a, pa in top3(prompt).items():
            after = top3(prompt + [a])
            second[tuple(prompt + [a])] = sorted(after, key=after.get)[-2]
            for b, pb in after.items():
                for c, pc in top3(prompt + [a, b]).items():
                    exact[(a, b, c)] = pa * pb * pc

    class SecondBest:
        def propose(self, tokens, limit=None, *, seq_id=None):
            t = second.get(tuple(tokens))
            return [t] if t is not None and limit else []

    def run(accept_all=False):
        e = LLMEngine(small_model, EngineConfig(block_size=4, num_gpu_blocks=3 * N, max_num_seqs=N,
                                                max_num_batched_tokens=8 * N, watermark=0.0,
                                                speculative_config={"method": "ngram", "num_speculative_tokens": 1}))
        e.scheduler.proposer = SecondBest()
        if accept_all:
            e.runner._verify = lambda logits, c: (list(c.spec_token_ids) + [int(logits[-1].argmax())],
                                                  len(c.spec_token_ids))
        outs = e.generate([prompt] * N, params)
        assert e.stats.num_draft_tokens == N             # every request verified one draft
        return [tuple(o.token_ids[0]) for o in outs]

    keys = sorted(exact)

    def p_value(samples):
        counts = [samples.count(key) for key in keys]
        assert sum(counts) == N                         # every outcome is one of the 27
        stat = sum((c - exact[k] * N) ** 2 / (exact[k] * N) for c, k in zip(counts, keys))
        return chi2_sf(stat, len(keys) - 1)

    assert p_value(run()) > 1e-3
    assert p_value(run(accept_all=True)) < 1e-3


def test_a_stop_token_inside_an_accepted_run_ends_it_there():
    """The source gives 7, 8, 9, 7, ...; the draft [8, 9, 7] is wholly accepted after the first
    token 7, but 9 is a stop token id: the sample ends at it, as plain decoding would (7, 8, 9)."""
    e = timing_engine([8, 9, 7])
    rid = e.add_request([1, 2, 3], SamplingParams(max_tokens=10, stop_token_ids=[9]))
    while e.has_unfinished_requests():
        e.step()
    o = e.output(rid)
    assert o.token_ids == [[7, 8, 9]] and o.finish_reason == ["stop"]
    assert e.stats.num_accepted_tokens == 3 and e.scheduler.manager.num_free_blocks == 16


def test_a_recorded_step_says_it_verified_drafts():
    e = timing_engine([7, 8, 9])
    e.record = True
    e.add_request([1, 2, 3], SamplingParams(max_tokens=6), request_id="A")
    e.step()
    e.step()
    assert e.records[-1].text == "verify A: 3 drafts; 1 decode token"


def test_the_engine_equals_the_replay_on_a_prompt_that_repeats_itself(tiny):
    """A prompt whose own n-grams recur ("To be, or not to be"): the engine drafts nothing with the
    prefill, as the replay's default, so their counts agree pass for pass."""
    model, tok = tiny
    prompt, params = "To be, or not to be", SamplingParams(max_tokens=48)
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 2}
    e = LLMEngine(model, EngineConfig(num_gpu_blocks=64, block_size=4, speculative_config=spec), tokenizer=tok)
    out = e.generate(prompt, params)[0]
    trace = replay_speculation(tok.encode(prompt), out.token_ids[0], NgramProposer(4, 2, 2), block_size=4,
                               num_blocks=64)
    assert trace.steps[0].drafted == ()
    assert (e.stats.steps, e.stats.num_draft_tokens, e.stats.num_accepted_tokens) == \
        (trace.passes, trace.drafted, trace.accepted)
