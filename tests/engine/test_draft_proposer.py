"""DraftModelProposer: its drafts over its own paged cache, rolled back by truncate, equal the draft
model's plain greedy continuation recomputed from scratch, for histories that accept 0..k drafts or
diverge earlier; the pool is checked after every call and empty after release; speculation with
it is lossless (the target's plain greedy output)."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from paged_kv.decoding import speculative_greedy
from paged_kv.engine.draft_proposer import DraftModelProposer
from paged_kv.errors import BlockError, ConfigError, OutOfBlocksError, PromptError
from paged_kv.model import SamplingParams, probabilities, truncated_draft
from paged_kv.model.checkpoint import load_tiny_model
from paged_kv.spec_decode import NgramProposer

K, BS = 4, 4


@pytest.fixture(scope="module")
def tiny():
    return load_tiny_model()


@pytest.fixture(scope="module")
def draft(tiny):
    return truncated_draft(tiny[0], 2)


@torch.no_grad()
def recompute_greedy(model, history, k):
    """k greedy tokens by full recompute (no cache): one forward pass over the whole prefix each."""
    seq = list(history)
    for _ in range(k):
        seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(history):]


@torch.no_grad()
def recompute_logits(model, seq):
    return model(torch.tensor([list(seq)]))[0, -1:]                      # (1, V)


def check_pool(proposer):
    proposer.manager.check()
    for key, toks in proposer._tokens.items():
        assert proposer.manager.num_tokens(key) == len(toks)


# A history walk: each step accepts a of the last drafts and adds a token of the target's (a
# rollback of k - a), or cuts the history back to an earlier length and adds new tokens (an earlier
# divergence), or moves to another sequence.
steps = st.lists(st.one_of(
    st.tuples(st.just("accept"), st.integers(0, K), st.integers(32, 122)),
    st.tuples(st.just("diverge"), st.integers(1, 30), st.lists(st.integers(32, 122), min_size=1, max_size=6)),
    st.tuples(st.just("switch"), st.sampled_from([None, 0, "b"]), st.just(0)),
), min_size=1, max_size=7)


@settings(max_examples=12, derandomize=True, deadline=None)
@given(steps)
def test_drafts_equal_recomputed_greedy(tiny, draft, walk):
    _, tok = tiny
    proposer = DraftModelProposer(draft, K, block_size=BS, num_blocks=64)
    histories = {None: tok.encode("ROMEO:\n"), 0: tok.encode("JULIET:\nO"), "b": tok.encode("First")}
    last = {}
    sid = None
    for op, x, y in [("switch", None, 0)] + walk:
        h = histories[sid]
        if op == "accept" and sid in last:
            h = h + last[sid][:x] + [y]
        elif op == "diverge":
            h = h[:max(1, min(x, len(h)))] + y
        elif op == "switch":
            sid = x
            h = histories[sid]
        histories[sid] = h
        got = proposer.propose(h, seq_id=sid)
        assert got == recompute_greedy(draft, h, K), (sid, h)
        assert proposer.cached_tokens(sid) == h + got[:-1]
        last[sid] = got
        check_pool(proposer)
    for sid in (None, 0, "b"):
        proposer.release(sid)
    check_pool(proposer)
    assert proposer.manager.num_free_blocks == proposer.manager.num_blocks
    assert proposer.manager.seq_ids == []


def test_rollback_frees_the_draft_blocks(tiny, draft):
    """Block size 4, a 6-token history: 3 drafts of which 2 are written (slots 6, 7: block 1 full),
    none accepted: the next call truncates to 6 tokens, and no block is held past ceil(7/4)."""
    _, tok = tiny
    proposer = DraftModelProposer(draft, 3, block_size=4, num_blocks=8)
    h = tok.encode("ROMEO:")
    assert len(h) == 6
    d = proposer.propose(h, seq_id=1)
    assert proposer.manager.num_tokens(0) == 8 and len(proposer.manager.block_ids(0)) == 2
    other = (d[0] + 1) % 256                       # the target rejects the first draft
    proposer.propose(h + [other], seq_id=1)
    assert proposer.manager.num_tokens(0) == 7 + 2 and len(proposer.manager.block_ids(0)) == 3
    check_pool(proposer)
    assert proposer.release(1) and proposer.manager.num_free_blocks == 8


@pytest.mark.parametrize("k", [1, 3, 5])
def test_speculation_with_the_draft_is_lossless(tiny, draft, k):
    model, tok = tiny
    prompt = tok.encode("ROMEO:\n")
    proposer = DraftModelProposer(draft, k, block_size=BS, num_blocks=40)
    res = speculative_greedy(model, prompt, 80, proposer)
    plain = speculative_greedy(model, prompt, 80, NgramProposer(1, 200))     # one token a pass
    assert res.token_ids == plain.token_ids
    assert res.accepted_tokens + res.target_passes == 80 and res.target_passes < 80
    check_pool(proposer)
    proposer.release()
    assert proposer.manager.num_free_blocks == 40


def test_limit_and_context_end(tiny, draft):
    _, tok = tiny
    proposer = DraftModelProposer(draft, K, block_size=BS, num_blocks=80)
    h = tok.encode("ROMEO:\n")
    assert proposer.propose(h, limit=0) == [] and proposer.cached_tokens() == []
    assert proposer.propose(h, limit=2) == recompute_greedy(draft, h, 2)
    assert proposer.propose(h, limit=-3) == []
    near_end = [65] * (draft.cfg.max_seq_len - 2)                          # room for 2 drafts
    assert len(proposer.propose(near_end, seq_id=5)) == 2
    check_pool(proposer)


def test_probs_greedy_and_sampled(tiny, draft):
    _, tok = tiny
    proposer = DraftModelProposer(draft, K, block_size=BS, num_blocks=40)
    h = tok.encode("ROMEO:\n")
    toks, q = proposer.propose_with_probs(h, seq_id=0)
    assert toks == recompute_greedy(draft, h, K)
    assert q.shape == (K, 256) and torch.equal(q.argmax(-1), torch.tensor(toks)) and torch.equal(q.sum(-1), torch.ones(K))
    params = SamplingParams(0.9, top_k=20, seed=0)
    runs = [proposer.propose_with_probs(h, seq_id=0, params=params, generator=torch.Generator().manual_seed(3))
            for _ in range(2)]
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])   # seeded: reproducible
    toks, q = runs[0]
    for i, t in enumerate(toks):                                            # row i: q after h + toks[:i]
        expected = probabilities(recompute_logits(draft, h + toks[:i]), params)[0]
        torch.testing.assert_close(q[i], expected, atol=1e-4, rtol=1e-3)
        assert q[i, t] > 0
    check_pool(proposer)


def test_pool_too_small_names_the_numbers_and_changes_nothing(tiny, draft):
    _, tok = tiny
    proposer = DraftModelProposer(draft, K, block_size=BS, num_blocks=3)
    h = tok.encode("ROMEO:\n")                      # 7 + 3 drafts = 10 tokens: 3 blocks
    proposer.propose(h, seq_id="a")
    before = proposer.cached_tokens("a")
    with pytest.raises(OutOfBlocksError, match=r"3 blocks of 4 tokens.*holding 0 .*needed 2, free 0"):
        proposer.propose(tok.encode("Hi"), seq_id="b")
    assert proposer.cached_tokens("a") == before and proposer.cached_tokens("b") == []
    check_pool(proposer)
    proposer.release("a")
    assert len(proposer.propose(tok.encode("Hi"), seq_id="b")) == K


def test_refusals(tiny, draft):
    proposer = DraftModelProposer(draft, K, block_size=BS, num_blocks=8)
    with pytest.raises(PromptError, match="empty"):
        proposer.propose([])
    with pytest.raises(PromptError, match="0..255"):
        proposer.propose([1, 300])
    with pytest.raises(PromptError):
        proposer.propose([1, 2.0])
    with pytest.raises(BlockError, match="sequence id"):
        proposer.propose([1, 2], seq_id=True)
    with pytest.raises(ConfigError, match="Generator"):
        proposer.propose_with_probs([1, 2], params=SamplingParams(1.0, seed=0))
    for bad in (dict(num_speculative_tokens=0), dict(block_size=0), dict(num_blocks=0)):
        args = dict(num_speculative_tokens=K, block_size=BS, num_blocks=8) | bad
        with pytest.raises(ConfigError):
            DraftModelProposer(draft, args.pop("num_speculative_tokens"), **args)
    with pytest.raises(ConfigError, match="TinyLlama"):
        DraftModelProposer(torch.nn.Linear(2, 2), K, num_blocks=8)
    assert proposer.release("never seen") == [] and proposer.manager.num_free_blocks == 8
