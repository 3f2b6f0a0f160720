"""What a vLLM user expects when things end early: abort in every state, stop conditions and their
finish reasons, and a failed step that ends only the request whose part failed.

Every check ends with the pool whole (``check()``, every block free once nothing runs) and the
other requests' tokens equal to what they produce alone.
"""

from __future__ import annotations

import pytest
import torch

from paged_kv.engine import EngineConfig, LLMEngine
from paged_kv.engine import runner as runner_module

from paged_kv.errors import ConfigError, PagedKVError
from paged_kv.model import load_tiny_model
from paged_kv.sampling_params import SamplingParams

from fault_injection import BAD, fail_one_request  # tests/engine/fault_injection.py


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_tiny_model()


def engine(model, tok=None, **kw) -> LLMEngine:
    kw = {"block_size": 4, "num_gpu_blocks": 32, "watermark": 0.0} | kw
    return LLMEngine(model, EngineConfig(**kw), tokenizer=tok)


def solo(model, prompt, params, **kw):
    return engine(model, **kw).generate(prompt, params)[0].token_ids


def drain(e: LLMEngine, limit: int = 500) -> None:
    for _ in range(limit):
        if not e.has_unfinished_requests():
            break
        e.step()
        e.scheduler.check()
    assert not e.has_unfinished_requests()


def whole(e: LLMEngine) -> bool:
    m = e.scheduler.manager
    cpu = m.cpu_allocator is None or m.cpu_allocator.num_free_blocks == m.cpu_allocator.num_blocks
    return m.num_free_blocks == m.num_blocks and cpu and not m.seq_ids and not m.swapped_ids


# --- abort ------------------------------------------------------------------------------------------

STATES = ["waiting", "prefilling", "running", "forked group", "recomputed", "swapped"]


def reach(e, state, tok):
    """Add a victim and a bystander and step until the victim is in ``state``; returns their ids."""
    sp = SamplingParams(n=2, temperature=0.9, seed=4, max_tokens=12) if state == "forked group" else \
        SamplingParams(max_tokens=12)
    victim = e.add_request(tok.encode("To be, or not to be, that is"), sp, "victim")
    bystander = e.add_request(tok.encode("Thou art"), SamplingParams(max_tokens=10), "bystander")
    sch = e.scheduler
    req = sch.requests[victim]
    if state == "waiting":
        return victim, bystander
    e.step()
    if state == "prefilling":
        assert req.status == "running" and req.seqs[0].num_computed < req.prompt_len
        return victim, bystander
    while len(req.seqs[0].output) < 3:
        e.step()
    if state == "recomputed":
        sch.preempt(victim, "recompute")
    elif state == "swapped":
        sch.preempt(victim, "swap")
    assert req.status == {"recomputed": "waiting", "swapped": "swapped"}.get(state, "running")
    if state == "forked group":
        assert req.forked and len(req.seqs) == 2
    return victim, bystander


@pytest.mark.parametrize("state", STATES)
def test_abort_in_every_state_frees_each_block_once_and_the_others_go_on(tiny, state):
    model, tok = tiny
    e = engine(model, tok, num_cpu_blocks=32, max_num_batched_tokens=8)
    victim, bystander = reach(e, state, tok)
    out = e.abort_request(victim)
    e.scheduler.check()
    assert out.finished and set(out.finish_reason) == {"abort"}
    assert victim not in [r.request_id for q in (e.scheduler.waiting, e.scheduler.running, e.scheduler.swapped)
                          for r in q]
    assert e.abort_request(victim) is out                  # aborting again changes nothing
    drain(e)
    assert whole(e)
    assert e.output(bystander).token_ids == solo(model, tok.encode("Thou art"), SamplingParams(max_tokens=10))
    assert e.output(bystander).finish_reason == ["length"]


def test_abort_keeps_full_cached_blocks_cached(tiny):
    model, tok = tiny
    e = engine(model, tok, enable_prefix_caching=True)
    prompt = list(range(40, 57))                           # 17 tokens: 4 full blocks
    rid = e.add_request(prompt, SamplingParams(max_tokens=8))
    for _ in range(3):
        e.step()
    e.abort_request(rid)
    assert whole(e) and len(e.scheduler.manager.cache) >= 4
    again = e.add_request(prompt, SamplingParams(max_tokens=2))
    drain(e)
    assert e.output(again).cached_tokens == [16]


def test_abort_after_a_swap_preempt_between_steps_drops_its_pending_copies(tiny):
    """preempt(swap) between steps leaves its GPU -> CPU copies for the next step; an abort before
    that step frees the CPU blocks, so the copies must go too (the new-user trial: a second swap-out
    was handed the same CPU blocks and the next step refused the destinations named twice)."""
    model, tok = tiny
    e = engine(model, tok, num_cpu_blocks=8)
    a = e.add_request("To be, or not to be", SamplingParams(max_tokens=10))
    b = e.add_request("Thou art a villain", SamplingParams(max_tokens=10))
    for _ in range(3):
        e.step()
    e.scheduler.preempt(a, "swap")
    e.abort_request(a)
    e.scheduler.check()                       # no copy left into blocks nobody holds
    e.scheduler.preempt(b, "swap")
    drain(e)
    want = solo(model, tok.encode("Thou art a villain"), SamplingParams(max_tokens=10))
    assert e.output(b).finish_reason == ["length"] and e.output(b).token_ids == want
    assert e.output(a).finish_reason == ["abort"] and whole(e)


def test_check_finds_a_swap_out_into_blocks_nobody_holds(tiny):
    model, tok = tiny
    e = engine(model, tok, num_cpu_blocks=8)
    a = e.add_request("To be, or not to be", SamplingParams(max_tokens=10))
    e.step()
    e.scheduler.preempt(a, "swap")
    e.scheduler._carry.swap_out.append((0, 7))           # a copy no swapped sequence owns
    with pytest.raises(PagedKVError, match=r"CPU blocks \[7\]"):
        e.scheduler.check()


def test_abort_of_an_unknown_request_names_it(tiny):
    model, tok = tiny
    with pytest.raises(PagedKVError, match="'nobody'"):
        engine(model, tok).abort_request("nobody")
    with pytest.raises(PagedKVError, match=r"hashable, got \[1\]"):
        engine(model, tok).abort_request([1])


def test_abort_of_a_request_added_to_the_scheduler_directly(tiny):
    model, tok = tiny
    e = engine(model, tok)
    e.scheduler.add("direct", tok.encode("To be"), sampling_params=SamplingParams(max_tokens=5))
    e.step()
    assert e.abort_request("direct").finish_reason == ["abort"] and whole(e)


# --- stop conditions ----------------------------------------------------------------------------------

def test_stop_strings_cut_the_text_and_free_the_blocks_at_once(tiny):
    model, tok = tiny
    free = solo(model, tok.encode("ROMEO:\n"), SamplingParams(max_tokens=40), block_size=4)[0]
    text = tok.decode(free)
    stop = text[9:12]                                      # three characters the free run produces
    assert len(stop) == 3 and stop in text
    for include in (False, True):
        e = engine(model, tok)
        rid = e.add_request("ROMEO:\n", SamplingParams(max_tokens=40, stop=[stop, "never appears"],
                                                         include_stop_str_in_output=include))
        drain(e)
        o = e.output(rid)
        at = text.index(stop)
        assert o.text == [text[:at + len(stop)] if include else text[:at]]
        assert o.finish_reason == ["stop"] and len(o.token_ids[0]) < 40 and whole(e)
        assert tok.decode(o.token_ids[0]).startswith(text[:at + len(stop)])   # tokens kept up to the stop


def test_a_stop_string_spanning_tokens_and_the_bytes_of_one_character(tiny, monkeypatch):
    """The sampler is scripted to emit the bytes of "abécd" ('é' is two bytes, c3 a9): the stop
    string "bé" spans three tokens and completes only with the second byte of 'é'."""
    model, tok = tiny
    script = list("abécd".encode())

    def scripted(self, logits, c):
        return [script[len(c.output_token_ids)]]
    monkeypatch.setattr(runner_module.ModelRunner, "_sample", scripted)
    e = engine(model, tok)
    rid = e.add_request("x", SamplingParams(max_tokens=6, stop="bé", frequency_penalty=0.5))   # penalty: outputs sent
    seen = []
    while e.has_unfinished_requests():
        e.step()
        seen.append((list(e.output(rid).token_ids[0]), e.output(rid).finish_reason[0]))
    assert seen[2] == ([0x61, 0x62, 0xC3], None)            # half a character: no stop yet
    assert seen[-1] == ([0x61, 0x62, 0xC3, 0xA9], "stop")
    assert e.output(rid).text == ["a"] and whole(e)


def test_stop_token_ids_end_each_sample_on_its_own(tiny):
    model, tok = tiny
    sp = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=30)
    free = solo(model, tok.encode("Thou art"), sp)
    stop_id = free[0][4]                                   # a token sample 0 draws fifth
    e = engine(model, tok)
    rid = e.add_request("Thou art", SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=30,
                                                   stop_token_ids=[stop_id]))
    drain(e)
    o = e.output(rid)
    for got, want, reason in zip(o.token_ids, free, o.finish_reason):
        cut = want.index(stop_id) + 1 if stop_id in want else len(want)
        assert got == want[:cut]                           # the stop token is kept, as vLLM keeps it
        assert reason == ("stop" if stop_id in want else "length")
    assert whole(e)


def test_stop_strings_need_a_tokenizer(tiny):
    model, _ = tiny
    with pytest.raises(ConfigError, match="need text"):
        engine(model).add_request([1, 2, 3], SamplingParams(stop="\n"))


@pytest.mark.parametrize("bad", [[""], [3], 5, None])
def test_bad_stop_values_are_refused_by_name(bad):
    with pytest.raises(ConfigError, match="stop"):
        SamplingParams(stop=bad)


# --- a failed step -----------------------------------------------------------------------------------



@pytest.mark.parametrize("where", ["sampler", "kernel"])
def test_a_failing_request_ends_with_an_error_and_the_others_are_served(tiny, monkeypatch, where):
    model, tok = tiny
    prompts = {"a": tok.encode("First Citizen:"), "bad": [BAD] + tok.encode(" speak"), "c": tok.encode("Thou")}
    params = {"a": SamplingParams(n=2, temperature=0.9, seed=1, max_tokens=8), "bad": SamplingParams(max_tokens=8),
              "c": SamplingParams(max_tokens=8)}
    want = {k: solo(model, prompts[k], params[k]) for k in ("a", "c")}
    e = engine(model, tok)
    fail_one_request(monkeypatch, model, where, "bad")
    for k in prompts:
        e.add_request(prompts[k], params[k], k)
    drain(e)
    bad = e.output("bad")
    assert bad.finished and bad.finish_reason == ["error"] and "failed" in bad.error
    for k in ("a", "c"):
        assert e.output(k).token_ids == want[k], k
    assert whole(e)


def test_a_failing_copy_ends_the_step_s_requests_and_the_engine_serves_the_next(tiny, monkeypatch):
    """A fault outside any one request's part (a copy-on-write copy) ends every request of that step
    with 'error'; nothing is left held or stuck, and a request added afterwards is served."""
    model, tok = tiny
    e = engine(model, tok)
    real = e.runner.cache.copy_blocks

    def failing(copies, backend="torch"):
        if copies:
            raise RuntimeError("copy failed")
        return real(copies, backend)
    monkeypatch.setattr(e.runner.cache, "copy_blocks", failing)
    rid = e.add_request("Thou art,", SamplingParams(n=2, temperature=0.9, seed=2, max_tokens=6))  # 9 tokens: a copy
    drain(e)
    assert e.output(rid).finish_reason == ["error", "error"] and "copy failed" in e.output(rid).error
    assert whole(e)
    monkeypatch.setattr(e.runner.cache, "copy_blocks", real)
    later = e.add_request("Thou", SamplingParams(max_tokens=4))
    drain(e)
    assert e.output(later).token_ids == solo(model, tok.encode("Thou"), SamplingParams(max_tokens=4))


# --- stop conditions as vLLM's detokenizer applies them (new-user trial) -------------------------

def _stream(e, rid):
    seen = []
    while e.has_unfinished_requests():
        e.step()
        seen.append(e.output(rid).text[0])
    return seen


@pytest.mark.parametrize("stop", [[" is "], ["enat"], ["the p", "x"], ["e"]])
def test_a_running_text_is_a_prefix_of_the_final_text_with_stop_strings(tiny, stop):
    """The trial's snapshots 'The senate i', 'The senate is' came before the final 'The senate':
    a running text holds back what could start a stop string."""
    model, tok = tiny
    e = engine(model, tok)
    rid = e.add_request("ROMEO:\n", SamplingParams(max_tokens=40, stop=stop))
    seen = _stream(e, rid)
    final = e.output(rid).text[0]
    assert all(final.startswith(t) for t in seen), (seen, final)
    assert not any(s in final for s in stop) and e.output(rid).finish_reason == ["stop"]


def test_a_stop_tokens_text_is_left_out_unless_included(tiny):
    model, tok = tiny
    free = tok.decode(solo(model, tok.encode("ROMEO:\n"), SamplingParams(max_tokens=20))[0])
    space = tok.encode(" ")[0]
    cut = free.index(" ")
    for kw, want in [({}, free[:cut]), ({"include_stop_str_in_output": True}, free[:cut + 1]),
                     ({"stop": [" "]}, free[:cut])]:
        e = engine(model, tok)
        rid = e.add_request("ROMEO:\n", SamplingParams(max_tokens=20, stop_token_ids=[space], **kw))
        seen = _stream(e, rid)
        o = e.output(rid)
        assert o.text == [want] and o.finish_reason == ["stop"], kw
        assert o.token_ids[0][-1] == space                     # the token itself is kept
        assert all(want.startswith(t) for t in seen)


def test_stop_given_as_a_generator_keeps_every_string():
    assert SamplingParams(stop=(s for s in ["\n", "ab"])).stop == ("\n", "ab")


@pytest.mark.parametrize("kw", [{"temperature": 10 ** 400, "seed": 0}, {"top_p": 10 ** 400},
                                {"frequency_penalty": -10 ** 400}])
def test_an_int_past_floats_range_is_a_config_error(kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        SamplingParams(**kw)
