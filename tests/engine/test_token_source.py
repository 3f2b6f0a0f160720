"""Token sources (``paged_kv.engine.token_source``) and the loops that take one without a model:
``RecordedTokens`` against a toy greedy "model" it is recorded from, its stand-in against the
prompt repeated by hand; ``TimingRunner(next_token=)`` in ``LLMEngine(runner=)`` and
``LiveRequests(next_token=)`` against iterating the source on the prompt alone, through prefix-cache
hits, forks, chunked prefill and preemption by recompute and by swap.  No tensors: fast."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv.engine import EngineConfig, LiveRequests, LLMEngine, RecordedTokens, TimingRunner
from paged_kv.engine.token_source import smallest_period
from paged_kv.errors import ConfigError, PagedKVError, PromptError
from paged_kv.model import ByteTokenizer
from paged_kv.sampling_params import SamplingParams

TOK = ByteTokenizer()


def toy_model(seq_id, tokens) -> int:
    """A greedy stand-in for a model: the next byte depends on every token and its position, so a
    context missing or shifted by one gives another token."""
    return (sum((i + 1) * t for i, t in enumerate(tokens)) * 7 + len(tokens)) % 128   # ASCII: one byte, one char


def greedy(source, prompt_ids, n) -> list[int]:
    """The oracle: ``n`` tokens by feeding the source its own output, from the prompt alone."""
    toks = list(prompt_ids)
    for _ in range(n):
        toks.append(source(0, tuple(toks)))
    return toks[len(prompt_ids):]


def record(prompt: str, n: int) -> str:
    """What a recording script does: the toy model's greedy continuation, as text."""
    return TOK.decode(greedy(toy_model, TOK.encode(prompt), n))


# --- RecordedTokens --------------------------------------------------------------------------------
def test_recorded_prompts_replay_the_recording_token_by_token():
    # one offered prompt inside another's recording (as one model's greedy runs are), multi-byte text
    recordings = {"The cat": " sat on the mat.", "The cat sat": " on the mat.", "Hi": "\u00e9t\u00e9"}
    src = RecordedTokens(recordings, TOK)
    for prompt, cont in recordings.items():
        p, c = TOK.encode(prompt), TOK.encode(cont)
        for k in range(len(c)):
            assert src.is_recorded(p + c[:k]) and src(5, tuple(p + c[:k])) == c[k], (prompt, k)
        assert not src.is_recorded(p + c)                  # the recording's end: nothing recorded after it
    # 5 bytes recorded, then the stand-in: "Hi\u00e9t\u00e9" repeated from its first byte
    assert greedy(src, TOK.encode("Hi"), 6) == TOK.encode("\u00e9t\u00e9") + [ord("H")]


def test_a_recording_is_what_greedy_decoding_of_its_model_gives():
    """Recorded from the toy model, the source agrees with the model on every prefix it covers,
    and on a typed prompt that is an offered prompt plus the start of its continuation."""
    prompts = ["Four score", "It was the best", "a"]
    src = RecordedTokens({p: record(p, 12) for p in prompts}, TOK)
    for p in prompts:
        ids = TOK.encode(p)
        assert greedy(src, ids, 12) == greedy(toy_model, ids, 12)
    typed = TOK.encode("Four score") + greedy(toy_model, TOK.encode("Four score"), 3)
    assert src.is_recorded(typed) and src(0, tuple(typed)) == toy_model(0, tuple(typed))


def test_the_stand_in_repeats_the_prompt_and_says_it_is_one():
    src = RecordedTokens({"The cat": " sat"}, TOK)
    for prompt in ("xyz", "hello", "The ca", "abca", "q"):
        ids = TOK.encode(prompt)
        assert not src.is_recorded(ids)
        out = greedy(src, ids, 11)
        period = next(p for p in range(1, len(ids) + 1) if all(ids[i] == ids[i - p] for i in range(p, len(ids))))
        assert out == [ids[(len(ids) + i) % period] for i in range(11)], prompt
    assert TOK.decode(greedy(src, TOK.encode("hello"), 7)) == "hellohe"      # a prompt with no repeat: whole
    past_end = TOK.encode("The cat sat")
    assert not src.is_recorded(past_end)                                       # the recording ran out
    assert src(0, tuple(past_end)) == past_end[0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=30))
def test_smallest_period_is_the_brute_force_one(tokens):
    brute = next(p for p in range(1, len(tokens) + 1) if all(tokens[i] == tokens[i - p] for i in range(p, len(tokens))))
    assert smallest_period(tokens) == brute


def test_token_source_errors_name_the_bad_value():
    with pytest.raises(ConfigError, match="recordings"):
        RecordedTokens([("a", "b")], TOK)
    with pytest.raises(ConfigError, match="non-empty prompt"):
        RecordedTokens({"": "b"}, TOK)
    with pytest.raises(ConfigError, match="non-empty prompt"):
        RecordedTokens({"a": 3}, TOK)
    with pytest.raises(ConfigError, match="tokenizer"):
        RecordedTokens({"a": "b"}, "bytes")
    src = RecordedTokens({"a": "b"}, TOK)
    with pytest.raises(PromptError, match="at least one token"):
        src(0, ())
    with pytest.raises(PromptError, match="ints >= 0"):
        src.is_recorded((1, -2))
    with pytest.raises(PromptError, match="at least one token"):
        smallest_period([])


# --- TimingRunner(next_token=) through LLMEngine(runner=) ------------------------------------------
def step_time(kv_tokens, prefill_tokens):
    return 1e-3 * kv_tokens + 1e-2


class Calls:
    """A token source that records who asked, wrapping the toy model."""

    def __init__(self):
        self.seen = []

    def __call__(self, seq_id, tokens):
        self.seen.append((seq_id, tokens))
        return toy_model(seq_id, tokens)


def serve(config: EngineConfig, requests, source=None):
    runner = TimingRunner(step_time, block_size=config.block_size, next_token=source)
    e = LLMEngine(None, config, TOK, runner=runner)
    # n > 1 needs sampling (greedy samples would agree); a token source is greedy whatever it is asked
    ids = [e.add_request(prompt, SamplingParams(max_tokens=m, n=n, **({"temperature": 1.0, "seed": 0} if n > 1 else {})))
           for prompt, m, n in requests]
    steps = 0
    while e.has_unfinished_requests():
        e.step()
        steps += 1
        assert steps < 500
    return e, [e.output(i) for i in ids]


@pytest.mark.parametrize("case", ["plain", "prefix hits", "samples", "recompute", "swap", "chunked"])
def test_a_timing_runner_asks_the_source_with_each_sequences_tokens_so_far(case):
    """Whatever the scheduler does in between (a hit that skips the cached prompt, samples forked
    at the prompt's end, a recompute or a swap, a prompt in chunks), every sample's tokens are the
    source iterated on its prompt alone, as greedy decoding of a model gives them."""
    shared = "A shared system prompt, long enough: "
    requests = [("Hello there", 6, 1), ("general Kenobi", 5, 1)]
    kw = dict(block_size=4, num_gpu_blocks=64, watermark=0.0)
    if case == "prefix hits":
        requests = [(shared + "one", 5, 1), (shared + "two", 5, 1), (shared + "one!", 4, 1)]
        kw |= dict(enable_prefix_caching=True, max_num_seqs=1)
    elif case == "samples":
        requests = [("Fork me", 6, 3), ("and me", 4, 2)]
    elif case in ("recompute", "swap"):
        requests = [("abcdefgh", 12, 1), ("ijklmnop", 12, 1), ("qrstuvwx", 12, 1)]
        kw |= dict(num_gpu_blocks=10, preemption_mode=case, num_cpu_blocks=16 if case == "swap" else None)
    elif case == "chunked":
        requests = [("x" * 30 + "tail", 5, 1), ("short", 6, 1)]
        kw |= dict(max_num_batched_tokens=8)
    source = Calls()
    e, outs = serve(EngineConfig(**kw), requests, source)
    for (prompt, m, n), o in zip(requests, outs):
        want = greedy(toy_model, TOK.encode(prompt), m)
        assert o.token_ids == [want] * n, (case, prompt)
        assert o.text == [TOK.decode(want)] * n                       # decoded: a runner's tokens are real
    assert source.seen and all(isinstance(t, tuple) for _, t in source.seen)
    if case == "prefix hits":
        assert e.stats.prefix_hits > 0
    if case in ("recompute", "swap"):
        assert e.stats.preemptions > 0 and (e.stats.swaps > 0) == (case == "swap")


def test_a_timing_runner_without_a_source_gives_zeros_and_the_same_clock():
    requests = [("Hello there", 6, 1), ("general Kenobi", 5, 2)]
    cfg = EngineConfig(block_size=4, num_gpu_blocks=12, watermark=0.0)
    plain, outs = serve(cfg, requests)
    sourced, _ = serve(cfg, requests, Calls())
    assert [o.token_ids for o in outs] == [[[0] * 6], [[0] * 5] * 2]
    assert plain.clock == sourced.clock and plain.stats.steps == sourced.stats.steps   # lengths alone set time
    e = LLMEngine(None, cfg, iteration_time=step_time)                  # the timing engine of before
    for prompt, m, n in requests:
        e.add_request(TOK.encode(prompt), SamplingParams(max_tokens=m, n=n, **({"temperature": 1.0, "seed": 0} if n > 1 else {})))
    while e.has_unfinished_requests():
        e.step()
    assert e.clock == plain.clock


def test_a_runner_with_a_source_runs_each_step_once_in_order():
    runner = TimingRunner(step_time, block_size=4, next_token=toy_model)
    e = LLMEngine(None, EngineConfig(block_size=4, num_gpu_blocks=8), runner=runner)
    e.add_request([1, 2, 3], SamplingParams(max_tokens=3))
    out = e.scheduler.schedule()
    runner.execute(out)
    with pytest.raises(PagedKVError, match="once, in order"):
        runner.execute(out)


def test_engine_and_runner_errors_name_the_bad_value():
    cfg = EngineConfig(block_size=4, num_gpu_blocks=8)
    runner = TimingRunner(step_time, block_size=4)
    with pytest.raises(ConfigError, match="not both.*model"):
        LLMEngine(object(), cfg, runner=runner)
    with pytest.raises(ConfigError, match="not both.*iteration_time"):
        LLMEngine(None, cfg, iteration_time=step_time, runner=runner)
    with pytest.raises(ConfigError, match="execute"):
        LLMEngine(None, cfg, runner=object())
    with pytest.raises(ConfigError, match="block_size 16 is not the config's 4"):
        LLMEngine(None, cfg, runner=TimingRunner(step_time))
    with pytest.raises(ConfigError, match="next_token"):
        TimingRunner(step_time, next_token="abc")
    with pytest.raises(ConfigError, match="a model, or model=None"):
        LLMEngine(None, cfg)


# --- LiveRequests(next_token=) ---------------------------------------------------------------------
def test_live_requests_without_a_model_take_their_tokens_from_the_source():
    """Forks continue as their parent (greedy), a preempted request is recomputed and goes on as
    before: every text is the prompt with the source iterated on it."""
    src = RecordedTokens({"abcd": record("abcd", 20)}, TOK)
    live = LiveRequests(None, TOK, num_blocks=4, block_size=4, next_token=src)
    a, b = live.add("abcd"), live.add("ef")
    notes = []
    for _ in range(3):
        notes += live.step()
    child = live.fork(a)
    for _ in range(3):
        notes += live.step()
    assert any("preempted" in n for n in notes), notes
    texts = {}
    for seq in live.requests:
        if seq in live.running:
            texts[seq] = live.tokens[seq] + [live.pending[seq]]
            live.finish(seq)                      # room for the preempted ones to be recomputed
    for _ in range(8):
        notes += live.step()
        if not live.waiting:                      # both recomputed
            break
    assert any("readmitted" in n for n in notes), notes
    texts |= {seq: live.tokens[seq] + [live.pending[seq]] for seq in live.running}
    assert {a, b, child} <= set(texts)
    for seq, toks in texts.items():
        ids = TOK.encode("ef" if seq == b else "abcd")
        assert toks[len(ids):] == greedy(src, ids, len(toks) - len(ids)), seq
    assert src.is_recorded(texts[a][:-1]) and not src.is_recorded(texts[b])
    assert not live.waiting and live.running
    live.manager.check()


def test_live_requests_take_one_source_of_tokens():
    with pytest.raises(ConfigError, match="without a model"):
        LiveRequests(object(), TOK, next_token=toy_model)
    with pytest.raises(ConfigError, match="callable"):
        LiveRequests(None, TOK, next_token=3)
    live = LiveRequests(None, TOK, num_blocks=4, block_size=4)       # no source: zeros, as before
    s = live.add("ab")
    live.step()
    assert live.tokens[s] == TOK.encode("ab") + [0] and live.pending[s] == 0
    with pytest.raises(ConfigError, match="next_token's token for request 0"):
        LiveRequests(None, TOK, next_token=lambda seq, tokens: -1).add("ab")
