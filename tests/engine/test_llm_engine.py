"""The serving engine on real K/V: the issue's examples, nothing lost under preemption, metrics, errors."""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paged_kv.blocks import BlockSpaceManager
from paged_kv.decoding import generate
from paged_kv.engine import EngineConfig, LLMEngine
from paged_kv.errors import AdmissionError, ConfigError, PagedKVError, PromptError
from paged_kv.model import load_tiny_model
from paged_kv.model.sampling import SamplingParams

from conftest import peak_blocks, serve_arrivals


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)   # tiny matmuls: one thread is fastest and immune to a busy machine
    return load_tiny_model()


def engine(model, tokenizer=None, **kw) -> LLMEngine:
    kw.setdefault("watermark", 0.0)
    kw.setdefault("block_size", 4)
    return LLMEngine(model, EngineConfig(**kw), tokenizer=tokenizer)


def solo(model, prompt, params, block_size=4):
    """The request alone on an ample pool: what it must produce under any pressure."""
    return engine(model, num_gpu_blocks=256, block_size=block_size).generate(prompt, params)[0].token_ids


def test_issue_admission_example_on_the_tiny_model(tiny):
    model, tok = tiny
    e = engine(model, tok, num_gpu_blocks=6)
    X, Y, Z, W = (tok.encode(s) for s in ("a" * 22, "Thou a", "The k", "What is the matter, s"))
    with pytest.raises(AdmissionError, match="7 blocks of 4 tokens .* the pool has 6"):
        e.add_request(X, SamplingParams(max_tokens=4))
    y = e.add_request(Y, SamplingParams(max_tokens=4))
    z = e.add_request(Z, SamplingParams(max_tokens=3))
    while e.has_unfinished_requests():
        e.step()
    assert e.stats.preemptions == e.stats.swaps == 0
    # the engine's tokens are plain greedy decoding's (an independent path: generate, contiguous cache)
    assert e.output(y).token_ids == [generate(model, [Y], 4).tokens[0]]
    assert e.output(z).token_ids == [generate(model, [Z], 3).tokens[0]]
    w = e.add_request(W, SamplingParams(max_tokens=4))
    e.step()
    assert e.scheduler.manager.num_free_blocks == 0          # W alone fills the pool: 6 blocks
    while e.has_unfinished_requests():
        e.step()
    assert e.output(w).token_ids == [generate(model, [W], 4).tokens[0]]
    with pytest.raises(AdmissionError, match="25 stored tokens"):
        e.add_request(W, SamplingParams(max_tokens=5))
    assert e.stats.preemptions == 0 and e.scheduler.manager.num_free_blocks == 6


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("budget", [64, 5])
def test_preempted_request_is_rebuilt_exactly(tiny, mode, budget):
    """Issue example: BS 4, pool 8, greedy + frequency penalty, prompt 5, 12 new, preempted after
    token 7: the re-prefill runs 12 tokens and samples nothing before all are in, holds 3 blocks,
    the next token is token 8, and the output equals the run that was never preempted."""
    model, tok = tiny
    prompt, params = tok.encode("Thou "), SamplingParams(max_tokens=12, frequency_penalty=1.5)
    reference = solo(model, prompt, params)
    assert reference == [generate(model, [prompt], 12, sampling=params).tokens[0]]
    e = engine(model, num_gpu_blocks=8, num_cpu_blocks=8, max_num_batched_tokens=budget, preemption_mode=mode)
    rid = e.add_request(prompt, params)
    while len(e.output(rid).token_ids[0]) < 7:
        e.step()
    assert e.scheduler.preempt(rid) == mode
    sch, req = e.scheduler, e.scheduler.requests[rid]
    runs = []
    while len(req.seqs[0].output) == 7:
        out = sch.schedule()
        (chunk,) = out.chunks
        runs.append((chunk.start, chunk.query_len, chunk.sample))
        sch.update(out, e.runner.execute(out).sampled_token_ids)
        assert len(sch.manager.block_table(chunk.seq_id)) == 3     # ceil(12 / 4) right after
    if mode == "recompute":
        chunks = [(0, 12)] if budget >= 12 else [(0, 5), (5, 5), (10, 2)]
        assert runs == [(s, n, s + n == 12) for s, n in chunks]
    else:
        assert runs == [(11, 1, True)]         # swapped back: only the pending token runs
    assert req.seqs[0].output == reference[0][:8]                  # token 8 is the unpreempted one
    assert req.seqs[0].prompt_len == 5                              # the penalty counts 7 outputs
    while e.has_unfinished_requests():
        e.step()
    assert e.output(rid).token_ids == reference
    # the test can fail: misfiling the 7 outputs as prompt changes what follows
    misfiled = solo(model, prompt + reference[0][:7], SamplingParams(max_tokens=5, frequency_penalty=1.5))
    assert misfiled[0] != reference[0][7:]


@pytest.mark.parametrize("budget", [5, 3, 7])
def test_chunked_prefill_slots_and_values(tiny, budget):
    """Issue example: BS 4, a 13-token prompt, block table [6, 2, 9, 0], the cache pre-filled with a
    sentinel: token t lands in slot table[t // 4] * 4 + t % 4 whatever the budget; nothing is
    sampled before token 12 is in; every other slot keeps the sentinel; the cache and last logits
    equal a one-shot prefill's (to fp32 rounding: see the chapter on batch invariance)."""
    model, tok = tiny
    prompt = tok.encode("Now is the wi")
    assert len(prompt) == 13
    sentinel = -7.25

    def run(max_tokens_per_step):
        e = engine(model, num_gpu_blocks=10, max_num_batched_tokens=max_tokens_per_step)
        e.scheduler.manager = BlockSpaceManager(10, 4, free_order=[6, 2, 9, 0, 1, 3, 4, 5, 7, 8])
        e.runner.cache.k_cache.fill_(sentinel)
        e.runner.cache.v_cache.fill_(sentinel)
        rid = e.add_request(prompt, SamplingParams(max_tokens=1))
        chunks = []
        while e.has_unfinished_requests():
            out = e.scheduler.schedule()
            chunks += [(c.start, c.query_len, c.slot_mapping, c.sample) for c in out.chunks]
            result = e.runner.execute(out)
            logits = dict(result.logits)
            e.scheduler.update(out, result.sampled_token_ids)
        return e, chunks, next(iter(logits.values())), e.output(rid).token_ids

    table = [6, 2, 9, 0]
    e, chunks, logits, tokens = run(budget)
    for start, n, slots, sample in chunks:
        assert list(slots) == [table[t // 4] * 4 + t % 4 for t in range(start, start + n)]
        assert sample == (start + n == 13)
    if budget == 5:
        assert [c[2][0] for c in chunks] == [24, 9, 38] and chunks[-1][2][-1] == 0
    one_shot, _, logits1, tokens1 = run(64)
    k, k1 = e.runner.cache.k_cache, one_shot.runner.cache.k_cache                 # (L, NB, BS, Hkv, D)
    written = torch.zeros(10 * 4, dtype=torch.bool)
    written[[table[t // 4] * 4 + t % 4 for t in range(13)]] = True
    flat = k.flatten(1, 2)                                                        # (L, NB*BS, Hkv, D)
    assert (flat[:, ~written] == sentinel).all()
    assert (e.runner.cache.v_cache.flatten(1, 2)[:, ~written] == sentinel).all()
    assert not (flat[:, written] == sentinel).any()
    torch.testing.assert_close(k, k1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(e.runner.cache.v_cache, one_shot.runner.cache.v_cache, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, logits1, rtol=1e-4, atol=1e-4)
    assert tokens == tokens1


def _serve(model, arrivals, **config):
    """Run ``arrivals`` = [(step, prompt, params)] through one engine; returns (engine, ids)."""
    e = engine(model, **config)
    return e, serve_arrivals(e, arrivals)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_nothing_is_lost_under_pressure(tiny, mode):
    """The chapter's golden test: under pressure that preempts, every request (single samples,
    n = 2 groups) ends with exactly its solo tokens, and both pools are whole at the end."""
    model, tok = tiny
    texts = ["First Citizen:", "Before we proceed", "You are all resolved", "Speak, speak.", "We know't"]
    arrivals = []
    for i, t in enumerate(texts):
        n = 2 if i % 2 else 1
        params = SamplingParams(max_tokens=10 + i, temperature=0.9, seed=i, n=n, frequency_penalty=0.3)
        arrivals.append((i, tok.encode(t), params))
    blocks = max(peak_blocks(len(p), sp.n, sp.max_tokens, 4) for _, p, sp in arrivals)   # brute force, not the formula
    e, ids = _serve(model, arrivals, num_gpu_blocks=blocks + 2, num_cpu_blocks=blocks + 2,
                    preemption_mode=mode, max_num_batched_tokens=9)
    assert e.stats.preemptions >= 2
    if mode == "swap":
        assert e.stats.swaps >= 1 and e.stats.swapped_blocks >= 1
    for rid, prompt, params in ids:
        assert e.output(rid).token_ids == solo(model, prompt, params), f"request {rid} lost tokens"
    m = e.scheduler.manager
    assert m.num_free_blocks == m.num_blocks and (m.cpu_allocator is None or m.cpu_allocator.num_free_blocks
                                                 == m.cpu_allocator.num_blocks)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_group_resumes_when_its_leader_finished_first(tiny, mode):
    """A budget of 3 re-prefills sample 0 before sample 1 after a recompute, so sample 0 finishes
    a step earlier; preempting the group then must resume it from sample 1 (it used to re-admit
    the finished sample and stall) and still give the solo tokens."""
    model, tok = tiny
    prompt, params = tok.encode("Thou"), SamplingParams(max_tokens=6, n=2, temperature=0.9, seed=3)
    e = engine(model, num_gpu_blocks=32, num_cpu_blocks=32, max_num_batched_tokens=3, preemption_mode=mode)
    rid = e.add_request(prompt, params)
    req = e.scheduler.requests[rid]
    while min(s.num_generated for s in req.seqs) < 3:
        e.step()
    e.scheduler.preempt(rid, "recompute")
    while req.seqs[0].num_generated < params.max_tokens:
        e.step()
    assert req.seqs[1].num_generated < params.max_tokens            # the leader finished first
    assert e.scheduler.preempt(rid) == mode
    for _ in range(100):
        if not e.has_unfinished_requests():
            break
        e.step()
        e.scheduler.check()
    assert e.output(rid).token_ids == solo(model, prompt, params)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_nothing_is_lost_hypothesis(small_model, data):
    """Random arrivals, lengths, n, budgets, block sizes and modes on a small random model."""
    torch.set_num_threads(1)
    bs = data.draw(st.sampled_from([1, 2, 3, 4, 8]), label="block_size")
    mode = data.draw(st.sampled_from(["recompute", "swap"]), label="mode")
    arrivals = []
    for i in range(data.draw(st.integers(1, 5), label="requests")):
        n = data.draw(st.sampled_from([1, 1, 2, 3]), label="n")
        greedy = n == 1 and data.draw(st.booleans(), label="greedy")
        params = SamplingParams(max_tokens=data.draw(st.integers(1, 9), label="max_tokens"),
                                temperature=0.0 if greedy else 1.0, seed=None if greedy else i, n=n)
        prompt = data.draw(st.lists(st.integers(0, 255), min_size=1, max_size=14), label="prompt")
        arrivals.append((data.draw(st.integers(0, 6), label="arrival step"), prompt, params))
    need = max(peak_blocks(len(p), sp.n, sp.max_tokens, bs) for _, p, sp in arrivals)   # brute force, not the formula
    pool = need + data.draw(st.integers(0, 4), label="spare blocks")
    e, ids = _serve(small_model, arrivals, block_size=bs, num_gpu_blocks=pool, num_cpu_blocks=pool,
                    preemption_mode=mode, max_num_batched_tokens=data.draw(st.integers(1, 20), label="budget"))
    for rid, prompt, params in ids:
        assert e.output(rid).token_ids == solo(small_model, prompt, params, bs)
    m = e.scheduler.manager
    assert m.num_free_blocks == pool and m.cpu_allocator.num_free_blocks == pool


def test_metrics(tiny):
    model, tok = tiny
    e = engine(model, tok, num_gpu_blocks=16)
    outs = e.generate(["To be", "or not to be"], SamplingParams(max_tokens=5), use_tqdm=True)
    assert all(o.finished and len(o.token_ids[0]) == 5 and o.text[0] for o in outs)
    for o in outs:
        assert 0 < o.ttft <= o.latency and o.tpot > 0
        assert math.isclose(o.latency, o.ttft + 4 * o.tpot)
    s = e.stats
    assert s.generated == 10 and s.throughput > 0 and 0 < s.peak_kv_usage <= 1
    assert len(s.kv_usage) == len(s.running) == s.steps
    # printing the stats shows the counters and the per-step lists' lengths, not every value
    text = repr(s)
    assert "generated=10" in text and f"kv_usage=[{s.steps} per-step values]" in text
    assert str(s.kv_usage[0]) not in text.replace(f"[{s.steps} per", "")


def test_errors(tiny):
    model, tok = tiny
    e = engine(model, num_gpu_blocks=16)
    with pytest.raises(PromptError, match="tokenizer"):
        e.add_request("text")
    with pytest.raises(PromptError, match="300"):
        e.add_request([300])
    with pytest.raises(PromptError, match="empty"):
        e.add_request([])
    ctx = model.cfg.max_seq_len            # the model's context, tokens: prompt + max_tokens fit it
    with pytest.raises(PromptError, match=f"prompt {ctx - 19} \\+ max_tokens 20 tokens exceed the model's max_seq_len {ctx}"):
        e.add_request([1] * (ctx - 19), SamplingParams(max_tokens=20))   # one token past the context
    with pytest.raises(PromptError, match="max_seq_len"):
        e.add_request([1] * (ctx + 1), SamplingParams(max_tokens=1))
    roomy = engine(model, num_gpu_blocks=ctx // 4 + 1)                  # a pool that holds the context
    assert roomy.check_admissible([1] * (ctx - 20), SamplingParams(max_tokens=20)) is None  # exactly the context
    with pytest.raises(ConfigError, match="one of them"):
        EngineConfig()
    with pytest.raises(AdmissionError):
        e.generate([[1, 2], [1] * 100], SamplingParams(max_tokens=1))
    assert not e.has_unfinished_requests()      # refused before anything was queued


def test_errors_a_student_meets(tiny):
    """Found by trying the engine as a new user: each names the bad value, and the engine stays usable."""
    model, tok = tiny
    e = engine(model, num_gpu_blocks=30, max_num_seqs=2)
    with pytest.raises(AdmissionError, match="n = 3 .* max_num_seqs = 2"):   # used to wedge every later step
        e.add_request([1, 2], SamplingParams(max_tokens=3, n=3, temperature=1.0, seed=0))
    assert e.generate([1, 2], SamplingParams(max_tokens=2))[0].finished
    for bad in (100.0, math.nan, "x"):
        with pytest.raises(ConfigError, match="arrival"):
            e.add_request([1, 2], arrival=bad)
    with pytest.raises(ConfigError, match="hashable"):
        e.add_request([1, 2], None, ["a"])
    with pytest.raises(ConfigError, match="SamplingParams"):
        e.generate([1, 2], {"max_tokens": 2})
    with pytest.raises(ConfigError, match="SamplingParams"):
        e.generate([[1, 2]], [{"max_tokens": 2}])
    for bad in (None, 65):
        with pytest.raises(PromptError, match="prompts must be"):
            e.generate(bad)
    assert not e.has_unfinished_requests()
    # one prompt as a tensor, an array or a list of numpy ints is one prompt, as add_request reads it
    want = e.generate([65, 66, 67], SamplingParams(max_tokens=2))[0].token_ids
    for same in (torch.tensor([65, 66, 67]), np.array([65, 66, 67]), list(np.array([65, 66, 67]))):
        (out,) = e.generate(same, SamplingParams(max_tokens=2))
        assert out.token_ids == want
    with pytest.raises(ConfigError, match="num_blocks=1000000000 .* cannot be allocated"):
        LLMEngine(model, EngineConfig(block_size=4, num_gpu_blocks=10**9))
    # a max_model_len the model has no positions for is refused at once, not when a long prompt comes
    with pytest.raises(ConfigError, match=f"max_model_len = 1,000,000 .* max_seq_len {model.cfg.max_seq_len:,}"):
        LLMEngine(model, EngineConfig(num_gpu_blocks=16, max_model_len=10**6))
    assert LLMEngine(model, EngineConfig(num_gpu_blocks=16, max_model_len=model.cfg.max_seq_len))
    for bad, words in ((dict(max_model_len="512"), "max_model_len .* got '512'"), (dict(max_model_len=1e9), "1000000000.0"),
                       (dict(block_size=None), "block_size .* got None")):
        with pytest.raises(ConfigError, match=words):
            LLMEngine(model, EngineConfig(num_gpu_blocks=16, **bad))
    with pytest.raises(ConfigError, match="TinyLlama .* got 'tiny'"):
        LLMEngine("tiny", EngineConfig(num_gpu_blocks=16))
    with pytest.raises(ConfigError, match="ByteTokenizer .* swapped"):
        LLMEngine(tok, EngineConfig(num_gpu_blocks=16), tokenizer=model)
    with pytest.raises(ConfigError, match="encode"):
        LLMEngine(model, EngineConfig(num_gpu_blocks=16), tokenizer="x")


def test_generate_queues_nothing_when_a_later_prompt_is_too_long(tiny):
    """Found by a new-user trial: the first prompt used to be queued, and ran in the next call."""
    model, tok = tiny
    e = engine(model, tok, num_gpu_blocks=400)
    assert model.cfg.max_seq_len < 600
    with pytest.raises(PromptError, match=f"600 .* max_seq_len {model.cfg.max_seq_len}"):
        e.generate(["short", "x" * 600], SamplingParams(max_tokens=4))
    assert not e.has_unfinished_requests() and e.outputs() == []
    (out,) = e.generate(["again"], SamplingParams(max_tokens=3))
    assert e.stats.generated == 3 and [o.request_id for o in e.outputs()] == [out.request_id]


def test_memory_budget_in_bytes(tiny):
    model, _ = tiny
    per_block = 4 * 2 * model.cfg.num_layers * model.cfg.num_kv_heads * model.cfg.head_dim * 4   # fp32
    e = LLMEngine(model, EngineConfig(block_size=4, gpu_memory_bytes=10 * per_block + 5))
    assert e.scheduler.config.num_gpu_blocks == 10
    assert e.runner.cache.nbytes == 10 * per_block


def test_triton_backend_gives_the_same_tokens(small_model):
    prompts = [[5, 6, 7, 8, 9], [1, 2, 3]]
    params = SamplingParams(max_tokens=3)
    out = {b: LLMEngine(small_model, EngineConfig(block_size=4, num_gpu_blocks=8, backend=b,
                                                  max_num_batched_tokens=4)).generate(prompts, params)
           for b in ("torch", "triton")}
    assert [o.token_ids for o in out["torch"]] == [o.token_ids for o in out["triton"]]


def test_a_preemption_shows_as_one_long_inter_token_gap():
    """Constant 10 ms steps, no model, 3 blocks of 4: alone, every gap is one step (max ITL = TPOT);
    a request preempted by recompute waits for blocks, so its longest gap spans the wait."""
    step = 0.010
    e = LLMEngine(None, EngineConfig(block_size=4, num_gpu_blocks=3, watermark=0.0), iteration_time=lambda kv, pf: step)
    a = e.add_request([1] * 3, SamplingParams(max_tokens=6))
    b = e.add_request([2] * 3, SamplingParams(max_tokens=6))
    for _ in range(2):
        e.step()                                    # each holds 1 block and has 2 tokens
    e.scheduler.preempt(b)
    while e.has_unfinished_requests():
        e.step()
    oa, ob = e.output(a), e.output(b)
    assert math.isclose(oa.max_itl, step) and math.isclose(oa.tpot, step)
    # by hand: a grows to 2 blocks at step 3 and finishes at step 6 (tokens 3-6), leaving 1 free block
    # until then; b needs 2 blocks for its 5 tokens, so it re-prefills and samples token 3 at step 7:
    # 5 steps after its token 2
    assert math.isclose(ob.max_itl, 5 * step) and ob.tpot < ob.max_itl


def test_a_step_runs_once_and_a_hand_driven_engine_reports_finished(tiny):
    """Running a step twice would draw different tokens (the generators move on): refused. Driving
    the scheduler and the runner by hand, as chapter 7 does, gives the tokens generate() gives."""
    model, tok = tiny
    sp = SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=4)
    want = engine(model, num_gpu_blocks=16).generate(tok.encode("To be, or not"), sp)[0].token_ids
    e = engine(model, num_gpu_blocks=16)
    rid = e.add_request(tok.encode("To be, or not"), sp)
    out = e.scheduler.schedule()
    result = e.runner.execute(out)
    with pytest.raises(PagedKVError, match="runs each scheduled step once"):
        e.runner.execute(out)
    e.scheduler.update(out, result.sampled_token_ids)
    while e.has_unfinished_requests():
        out = e.scheduler.schedule()
        e.scheduler.update(out, e.runner.execute(out).sampled_token_ids)
    assert e.output(rid).token_ids == want and e.output(rid).finished


def test_a_request_added_to_the_scheduler_directly_still_gets_an_output(tiny):
    model, tok = tiny
    e = engine(model, num_gpu_blocks=16)
    e.scheduler.add("raw", [1, 2, 3], max_tokens=2)
    while e.has_unfinished_requests():
        e.step()
    assert e.output("raw").finished and len(e.output("raw").token_ids[0]) == 2
