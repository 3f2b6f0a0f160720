"""Blocks registered when their step is scheduled (vLLM v1's ``allocate_slots`` -> ``cache_blocks``), on
the tiny model: requests admitted in one step share what that step writes, and a hit never reads K/V
that was not written, whether the block's writer is a prefill chunk or a decode token, and whether its
part of the step ran, failed, or its request was aborted afterwards.

A witness wraps the runner's passes: before each pass it checks that every context slot a chunk
attends to holds the K/V of exactly that chunk's prefix (same tokens up to that position, same
adapter), written by an earlier pass or by this one (each layer stores a pass's K/V before it
attends), and it records a pass's slots only once the pass has run.  Tokens and sampled logits are
also compared with a cache-off run of the same requests.
"""

from __future__ import annotations

import pytest
import torch

from paged_kv.engine import EngineConfig, LLMEngine
from paged_kv.engine import runner as runner_module

from paged_kv.model import load_tiny_model
from paged_kv.sampling_params import SamplingParams

from fault_injection import BAD, fail_one_request  # tests/engine/fault_injection.py


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_tiny_model()


def engine(model, tok=None, **kw) -> LLMEngine:
    kw = {"block_size": 4, "num_gpu_blocks": 64, "watermark": 0.0} | kw
    return LLMEngine(model, EngineConfig(**kw), tokenizer=tok)


class WitnessError(BaseException):
    """A read of K/V that was not written (a BaseException: the runner isolates a failing request by
    catching Exception, and must not take the witness's finding for one)."""


class Witness:
    """What each slot of the paged cache holds: the prefix (adapter shift, tokens up to its position)
    whose K/V its last successful pass wrote there.  ``reads`` counts the slots checked, ``same_pass``
    those read in the pass that wrote them."""

    def __init__(self, e: LLMEngine, monkeypatch) -> None:
        self.e, self.written, self.reads, self.same_pass = e, {}, 0, 0
        prepare, run = runner_module.prepare_paged_batch, runner_module.run_paged_batch
        bs = e.scheduler.config.block_size

        def tokens(c):
            req = e.scheduler.requests[c.request_id]
            return next(s.tokens for s in req.seqs if s.seq_id == c.seq_id)

        execute = e.runner.execute

        def noted(out):                                  # the step being run, to find each row's chunk
            self.out = out
            return execute(out)
        e.runner.execute = noted

        def prepared(rows, phase, device=None):          # rows carry no request: find their chunks
            batch = prepare(rows, phase, device)
            by_slots = {c.slot_mapping: c for c in self.out.chunks}
            batch.rows = [by_slots[tuple(r.slot_mapping)] for r in rows]
            return batch

        def checked_run(model, cache, batch, backend="torch", reduction=None):
            writes = {}
            for c in batch.rows:
                toks = tokens(c)
                for p, slot in zip(c.positions, c.slot_mapping):
                    writes[slot] = (c.adapter_shift, tuple(toks[:p + 1]))
            for c in batch.rows:
                toks = tokens(c)
                for p in range(c.start):
                    slot = c.block_table[p // bs] * bs + p % bs
                    want = (c.adapter_shift, tuple(toks[:p + 1]))
                    got = writes.get(slot, self.written.get(slot))
                    if got != want:
                        raise WitnessError(f"request {c.request_id!r} reads position {p} from slot {slot}, "
                                           f"which holds {'nothing' if got is None else 'another prefix'}")
                    self.reads += 1
                    self.same_pass += slot in writes
            logits = run(model, cache, batch, backend, reduction)
            self.written.update(writes)
            return logits
        monkeypatch.setattr(runner_module, "prepare_paged_batch", prepared)
        monkeypatch.setattr(runner_module, "run_paged_batch", checked_run)


def capture(e: LLMEngine) -> tuple[list, dict]:
    """Every SchedulerOutput the engine runs, and the logits of every sampled position."""
    outs, logits = [], {}
    plan, run = e.scheduler.schedule, e.runner.execute

    def schedule():
        outs.append(plan())
        return outs[-1]

    def execute(out):
        result = run(out)
        for c in out.chunks:
            if c.seq_id in result.logits:
                logits[(c.request_id, c.index, c.seq_len - 1)] = result.logits[c.seq_id].clone()
        return result
    e.scheduler.schedule, e.runner.execute = schedule, execute
    return outs, logits


def drain(e: LLMEngine) -> None:
    while e.has_unfinished_requests():
        e.step()
        e.scheduler.check()


def cache_off(model, requests) -> tuple[dict, dict]:
    """The same requests, submitted the same way, with caching off: tokens and logits."""
    e = engine(model)
    _, logits = capture(e)
    for rid, prompt, params in requests:
        e.add_request(prompt, params, rid)
    drain(e)
    return {rid: e.output(rid).token_ids for rid, _, _ in requests}, logits


def assert_same(tokens, logits, ref_tokens, ref_logits, rids) -> None:
    for rid in rids:
        assert tokens[rid] == ref_tokens[rid], rid
    keys = [k for k in ref_logits if k[0] in rids]
    assert keys and all(k in logits for k in keys)
    for k in keys:
        torch.testing.assert_close(logits[k], ref_logits[k], rtol=1e-4, atol=1e-4)


def test_two_requests_submitted_together_compute_their_system_prompt_once(tiny, monkeypatch):
    """The review's case: a 36-token system prompt, two requests added before the first step.  The
    second hits its 9 full blocks in that very step (this engine used to register only after the step
    and shared nothing here), and its tokens and logits equal the cache-off run's."""
    model, tok = tiny
    system = tok.encode("KING: Speak the speech, I pray you, ")
    requests = [("A", system + tok.encode("as I"), SamplingParams(max_tokens=6)),
                ("B", system + tok.encode("trippingly"), SamplingParams(max_tokens=6, temperature=0.8, seed=2))]
    ref_tokens, ref_logits = cache_off(model, requests)
    e = engine(model, max_num_batched_tokens=256, enable_prefix_caching=True)
    witness = Witness(e, monkeypatch)
    outs, logits = capture(e)
    for rid, prompt, params in requests:
        e.add_request(prompt, params, rid)
    e.step()
    assert len(system) == 36 and outs[0].cache_hits == {"A": 0, "B": 36}
    assert outs[0].same_step_hits == {"B": ("A",)}
    assert outs[0].prefill_tokens == len(requests[0][1]) + len(requests[1][1]) - 36
    drain(e)
    assert_same({r: e.output(r).token_ids for r, _, _ in requests}, logits, ref_tokens, ref_logits, ["A", "B"])
    assert witness.same_pass >= 36                      # B read A's 36 slots in the pass that wrote them
    assert e.stats.prefix_hits == 36 and e.stats.prefix_queries == sum(len(p) for _, p, _ in requests)


def test_a_hit_on_a_block_that_a_decode_token_completes_in_the_same_step(tiny, monkeypatch):
    """A decodes the token that fills its second block in the step B is admitted, and B's prompt is
    A's prompt plus A's first two output tokens (known from a cache-off run): B hits both blocks,
    one of them completed by A's decode token in that step.  The runner runs decode tokens first and
    B's one-token-or-more chunk with the prefill chunks, so B reads the slot after it is written."""
    model, _ = tiny
    P = [5, 9, 13, 17, 21, 25]                           # 6 tokens: block 0 full, block 1 half
    greedy = SamplingParams(max_tokens=6)
    alone = engine(model).generate(P, greedy)[0].token_ids[0]
    B = P + alone[:2] + [40, 41]                         # 10 tokens: at most 2 blocks hit
    ref_tokens, ref_logits = cache_off(model, [("A", P, greedy), ("B", B, greedy)])
    for rid in ("A", "B"):                               # submitted apart, so compare each alone
        assert ref_tokens[rid] == engine(model).generate(P if rid == "A" else B, greedy)[0].token_ids
    e = engine(model, enable_prefix_caching=True)
    witness = Witness(e, monkeypatch)
    outs, logits = capture(e)
    e.add_request(P, greedy, "A")
    e.step()                                             # A's prompt: positions 0-5, samples alone[0]
    e.step()                                             # decodes alone[0] at position 6
    e.add_request(B, greedy, "B")
    e.step()                                             # decodes alone[1] at 7, filling block 1; B hits it
    a_chunk = next(c for c in outs[-1].chunks if c.request_id == "A")
    assert (a_chunk.start, a_chunk.query_len) == (7, 1)
    assert outs[-1].cache_hits == {"B": 8} and outs[-1].same_step_hits == {"B": ("A",)}
    drain(e)
    assert_same({r: e.output(r).token_ids for r in "AB"}, logits, ref_tokens, ref_logits, ["A", "B"])
    assert witness.reads > 0


def test_a_one_token_reader_of_a_prefill_runs_after_it(tiny, monkeypatch):
    """B's prompt is A's first 8 tokens and one more: B hits 2 blocks that A's prefill writes in the same
    step and runs one token, which looks like a decode token; it runs with the prefill chunks, after
    the pass's K/V are stored, not in the decode pass before them."""
    model, _ = tiny
    system = [7, 11, 13, 17, 19, 23, 29, 31]
    greedy = SamplingParams(max_tokens=5)
    requests = [("A", system + [3, 5], greedy), ("B", system + [40], greedy)]
    ref_tokens, ref_logits = cache_off(model, requests)
    e = engine(model, enable_prefix_caching=True)
    Witness(e, monkeypatch)
    outs, logits = capture(e)
    for rid, prompt, params in requests:
        e.add_request(prompt, params, rid)
    e.step()
    b = next(c for c in outs[0].chunks if c.request_id == "B")
    assert (b.start, b.query_len, b.sample) == (8, 1, True) and outs[0].same_step_hits == {"B": ("A",)}
    drain(e)
    assert_same({r: e.output(r).token_ids for r in "AB"}, logits, ref_tokens, ref_logits, ["A", "B"])




@pytest.mark.parametrize("where", ["kernel", "sampler"])
def test_a_failed_writer_s_readers_never_read_what_it_did_not_write(tiny, monkeypatch, where):
    """A and B share a prompt and are admitted together; C is a bystander.  A's part of the step
    fails (its forward pass, or its sampler after it wrote its K/V).  A ends with an error; B, whose
    hit reads A's blocks, is not run and waits again; the blocks registered for A leave the cache.
    B then computes the prompt itself, and B, C and a later D (hitting B's blocks) produce exactly
    what they produce with caching off."""
    model, tok = tiny
    system = tok.encode("ROMEO: But soft, what light ")
    requests = {"A": system + [BAD] + tok.encode("x"), "B": system + tok.encode("through yonder"),
                "C": tok.encode("Thou art"), "D": system + tok.encode("breaks")}
    params = {"A": SamplingParams(max_tokens=4), "B": SamplingParams(max_tokens=5, temperature=0.9, seed=7),
              "C": SamplingParams(max_tokens=5), "D": SamplingParams(max_tokens=4)}
    ref_tokens, ref_logits = cache_off(model, [(r, requests[r], params[r]) for r in "BCD"])
    for r in "BCD":
        assert ref_tokens[r] == engine(model).generate(requests[r], params[r])[0].token_ids
    fail_one_request(monkeypatch, model, where, "A")
    e = engine(model, enable_prefix_caching=True)
    witness = Witness(e, monkeypatch)
    outs, logits = capture(e)
    for r in "ABC":
        e.add_request(requests[r], params[r], r)
    hit = len(system) // 4 * 4                           # the system prompt's full blocks
    e.step()
    assert outs[0].same_step_hits == {"B": ("A",)} and outs[0].cache_hits["B"] == hit > 0
    sch = e.scheduler
    assert e.output("A").finish_reason == ["error"] and "failed" in e.output("A").error
    assert sch.requests["B"].status == "waiting" and sch.requests["B"].cache_hits == []
    assert not any(b in sch.manager.cache for b in outs[0].hit_blocks)   # A's blocks: dropped, not cached
    sch.check()
    e.step()                                             # B again: nothing to hit now, computes it all
    assert outs[1].cache_hits == {"B": 0}
    drain(e)
    e.add_request(requests["D"], params["D"], "D")
    drain(e)
    assert e.output("D").cached_tokens == [hit]          # B's blocks, written
    assert_same({r: e.output(r).token_ids for r in "BCD"}, logits, ref_tokens, ref_logits, ["B", "C", "D"])
    assert e.stats.prefix_hits == hit and witness.reads > 0
    m = sch.manager
    assert m.num_free_blocks == m.num_blocks


def test_after_an_abort_the_full_cached_blocks_it_computed_are_hit_and_exact(tiny, monkeypatch):
    """A and B share a prompt and are admitted together; A is aborted after the step that wrote its
    blocks: its full blocks stay cached (B holds them; then cached-free), and a later C hits them.  B's
    and C's tokens and logits equal the cache-off run's."""
    model, tok = tiny
    system = tok.encode("JULIET: O Romeo, Romeo, wherefore ")
    requests = [("A", system + tok.encode("art"), SamplingParams(max_tokens=8)),
                ("B", system + tok.encode("thou"), SamplingParams(max_tokens=6)),
                ("C", system + tok.encode("Romeo?"), SamplingParams(max_tokens=6))]
    ref_tokens, ref_logits = cache_off(model, requests[1:])
    e = engine(model, enable_prefix_caching=True)
    Witness(e, monkeypatch)
    outs, logits = capture(e)
    for rid, prompt, params in requests[:2]:
        e.add_request(prompt, params, rid)
    e.step()
    e.step()
    assert outs[0].same_step_hits == {"B": ("A",)}
    e.abort_request("A")
    drain(e)
    e.add_request(requests[2][1], requests[2][2], "C")
    drain(e)
    hit = len(system) // 4 * 4
    assert e.output("B").cached_tokens == [hit] and e.output("C").cached_tokens == [hit]
    assert e.output("A").finish_reason == ["abort"]
    assert_same({r: e.output(r).token_ids for r in "BC"}, logits, ref_tokens, ref_logits, ["B", "C"])
