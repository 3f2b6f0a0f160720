"""Beam search on shared blocks equals a plain beam search with no cache and no sharing."""

import math

import pytest
import torch

from paged_kv.decoding import beam_search, select_candidates
from paged_kv.errors import ConfigError, OutOfBlocksError
from paged_kv.model import AttentionMetadata

PROMPT = [12, 7, 33, 5, 90, 2, 61, 18, 4, 77]


def plain_beam_search(model, prompt, k, steps):
    """The textbook algorithm, written for this test: recompute every beam from scratch at every
    step, rank all (beam, token) candidates by cumulative log-probability, keep the best k (ties:
    lower beam, then lower token)."""
    beams = [([], 0.0)]
    for _ in range(steps):
        cands = []
        for bi, (toks, score) in enumerate(beams):
            seq = torch.tensor([prompt + toks])
            with torch.no_grad():
                logits = model(seq, AttentionMetadata.for_prefill(torch.tensor([seq.shape[1]]), seq.shape[1]))
            logp = torch.log_softmax(logits[0, -1].double(), -1).tolist()
            cands += [(score + lp, bi, t) for t, lp in enumerate(logp)]
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        beams = [(beams[bi][0] + [t], s) for s, bi, t in cands[:k]]
    return beams


@pytest.mark.parametrize("k,steps,bs", [(4, 9, 4), (3, 6, 16), (1, 5, 4)])
def test_shared_beams_equal_plain_beam_search(small_model, k, steps, bs):
    ours = beam_search(small_model, PROMPT, k, steps, block_size=bs)
    ref = plain_beam_search(small_model, PROMPT, k, steps)
    assert [b.tokens for b in ours.beams] == [t for t, _ in ref]
    assert [b.logprob for b in ours.beams] == pytest.approx([s for _, s in ref], abs=1e-4)
    assert all(ours.beams[i].logprob >= ours.beams[i + 1].logprob for i in range(k - 1))


def test_width_one_is_greedy(small_model):
    from paged_kv.decoding import generate
    ours = beam_search(small_model, PROMPT, 1, 7, block_size=4)
    assert ours.beams[0].tokens == generate(small_model, [PROMPT], 7).tokens[0]


def test_beams_share_blocks_and_the_pool_comes_back(small_model):
    res = beam_search(small_model, PROMPT, 4, 12, block_size=4, record=True)
    assert all(u <= w for u, w in zip(res.blocks_used, res.blocks_unshared))
    assert res.blocks_used[-1] < res.blocks_unshared[-1], "beams should share their prompt at least"
    kinds = [e.kind for e in res.history.events]
    assert "fork" in kinds and "free" in kinds
    assert any(e.copies for e in res.history.events), "a fork into a partial block must copy on write"
    last = res.history.snapshots[-1]
    assert last.used_blocks == 0 and not last.tables                  # everything freed at the end


def test_select_candidates_breaks_ties_by_beam_then_token():
    scores = torch.tensor([[0.0, -1.0, 0.0], [0.0, 0.0, -2.0]], dtype=torch.float64)
    assert select_candidates(scores, 3) == [(0, 0, 0.0), (0, 2, 0.0), (1, 0, 0.0)]
    assert math.isclose(select_candidates(scores, 5)[-1][2], -1.0)


def test_bad_arguments_raise(small_model):
    with pytest.raises(ConfigError, match="beam_width"):
        beam_search(small_model, PROMPT, 0, 3)
    with pytest.raises(ConfigError, match="more than the vocabulary"):
        beam_search(small_model, PROMPT, 300, 3)
    with pytest.raises(OutOfBlocksError):
        beam_search(small_model, PROMPT, 4, 8, block_size=4, num_blocks=4)


def test_the_simulators_beam_model_bounds_the_real_search(small_model):
    """paged_kv.sim.sharing models beams as sharing the full blocks of their common prefix; with
    the real search's own common prefix at each step, that count can only be at least the blocks
    really held (two beams may share more than all four do) and at most the unshared count."""
    from paged_kv.sim import Sharing, group_blocks
    res = beam_search(small_model, PROMPT, 4, 16, block_size=4)
    for step, (used, unshared, d) in enumerate(zip(res.blocks_used, res.blocks_unshared, res.divergence)):
        L = len(PROMPT) + step + 1
        model = int(group_blocks(len(PROMPT), L, Sharing("beam", 4, d), 4))
        assert used <= model <= unshared, step
