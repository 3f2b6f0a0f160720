"""Parallel sampling on shared blocks (vLLM paper §4.4): the golden tests.

* each sample of a prompt equals a run of that sample alone, without sharing, with the same seed;
* a request's text depends only on its own seed and sample index, never on its batch mates;
* the block-level facts the chapter states (copies, ref counts, a pool that comes back whole).
"""

import pytest
import torch

from paged_kv.blocks import BlockHistory, BlockSpaceManager
from paged_kv.blocks import group_blocks_needed
from paged_kv.decoding import PagedDecoder, generate, stored_tokens
from paged_kv.errors import ConfigError
from paged_kv.model import SamplingParams, sample, sample_generator

PROMPT = [7, 3, 19, 4, 1, 8, 2, 9, 6, 11]          # 10 tokens: blocks of 4, 4 and 2 at block size 4
HOT = SamplingParams(temperature=1.2, seed=5, n=3)


def test_each_shared_sample_equals_its_solo_run(small_model):
    shared = generate(small_model, [PROMPT], 12, cache="paged", sampling=HOT, block_size=4, keep_logits=True)
    assert shared.request_index == [0, 0, 0] and shared.sample_index == [0, 1, 2]
    for j in range(3):
        # the same sample alone, no sharing at all: one sequence seeded 5 + j, a contiguous cache
        solo = generate(small_model, [PROMPT], 12, cache="contiguous", keep_logits=True,
                        sampling=SamplingParams(temperature=1.2, seed=5 + j))
        assert shared.tokens[j] == solo.tokens[0]
        torch.testing.assert_close(shared.logits[:, j], solo.logits[:, 0], atol=1e-4, rtol=1e-4)
    assert len({tuple(t) for t in shared.tokens}) == 3, "the samples should differ from each other"


def test_a_request_is_the_same_alone_and_in_any_batch(small_model):
    a = SamplingParams(temperature=1.0, top_k=50, seed=11, n=2)
    alone = generate(small_model, [PROMPT], 8, cache="paged", sampling=a).tokens
    mate = [40, 41, 42]
    for batch, at in (([PROMPT, mate], 0), ([mate, PROMPT], 1), ([mate, mate, PROMPT], 2)):
        other = SamplingParams(temperature=1.0, top_k=50, seed=99, n=2)
        params = [a if i == at else other for i in range(len(batch))]
        for cache in ("paged", "contiguous", "recompute"):
            res = generate(small_model, batch, 8, cache=cache, sampling=params)
            assert res.tokens[2 * at: 2 * at + 2] == alone, (cache, at)
    again = generate(small_model, [PROMPT], 8, cache="paged", sampling=a).tokens
    assert again == alone and alone[0] != alone[1]


def test_sample_draws_each_row_from_its_own_generator():
    logits = torch.zeros(3, 50)
    params = SamplingParams(temperature=1.0, seed=0)
    picks = sample(logits, params, [sample_generator(0, j) for j in range(3)]).tolist()
    alone = [sample(logits[:1], params, [sample_generator(0, j)]).item() for j in range(3)]
    assert picks == alone
    with pytest.raises(ConfigError, match="one torch.Generator per row: 3 rows, 2 given"):
        sample(logits, params, [sample_generator(0, 0)] * 2)


def test_sampling_params_seed_and_n_are_checked():
    with pytest.raises(ConfigError, match="needs a seed"):
        SamplingParams(temperature=0.5)
    with pytest.raises(ConfigError, match="identical"):
        SamplingParams(n=2)
    with pytest.raises(ConfigError, match="seed"):
        SamplingParams(temperature=0.5, seed=-1)
    assert sample_generator(3, 2).initial_seed() == 5          # vLLM v1: child i of seed s uses s + i


def test_requests_of_one_batch_must_agree_on_n(small_model):
    with pytest.raises(ConfigError, match="same n"):
        generate(small_model, [[1], [2]], 2, sampling=[SamplingParams(1.0, seed=0, n=2), SamplingParams(1.0, seed=0)])


# --- blocks: the chapter's boundary cases, on the real decoder -----------------------------------
def test_pool_is_sized_for_sharing_and_comes_back_whole(small_model):
    # 10-token prompt, block size 4, 3 samples, 6 new tokens: 15 tokens stored per sample.
    # Shared: the two full prompt blocks; each sample: its own copy of block 2 (tokens 8-11) and
    # one more block (12-14): 2 + 3 * 2 = 8 blocks, against 3 * 4 = 12 without sharing.
    assert stored_tokens(10, 6) == 15
    assert group_blocks_needed(10, 15, 3, 4) == 2 + 3 * 2
    dec = PagedDecoder(small_model, "torch", [PROMPT], 6, block_size=4, n=3)
    assert dec.manager.num_blocks == 8
    res = generate(small_model, [PROMPT], 6, cache="paged", sampling=HOT, block_size=4)
    assert res.cache_bytes == dec.cache_bytes


def test_only_the_partial_block_is_copied_and_positions_hold_the_right_kv(small_model):
    # A 20-token prompt, block size 16, 3 samples appending different tokens: the full block stays
    # shared, the partial one (tokens 16-19) is copied for two samples and kept by the third.
    prompt = list(range(30, 50))
    history = BlockHistory(BlockSpaceManager(5, 16))
    dec = PagedDecoder(small_model, "torch", [prompt], 2, block_size=16, n=3, history=history)
    dec.prefill([prompt])
    m = dec.manager
    assert [m.block_table(s).block_ids for s in (0, 1, 2)] == [[0, 1]] * 3
    assert m.allocator.ref_count(0) == m.allocator.ref_count(1) == 3
    dec.decode([60, 61, 62])
    assert [len(e.copies) for e in history.events if e.kind == "append"] == [1, 1, 0]   # the last holder writes in place
    tables = [m.block_table(s).block_ids for s in (0, 1, 2)]
    assert [t[0] for t in tables] == [0, 0, 0] and m.allocator.ref_count(0) == 3
    lasts = [t[1] for t in tables]
    assert len(set(lasts)) == 3 and 1 in lasts and all(m.allocator.ref_count(b) == 1 for b in lasts)
    k = dec.cache.k_cache[0]                                   # (NB, BS, Hkv, D), layer 0
    for b in lasts:                                            # positions 16-19: identical in all three
        torch.testing.assert_close(k[b, :4], k[1, :4], atol=0, rtol=0)
    own = [k[b, 4] for b in lasts]                             # position 20: each sample's own token
    assert not torch.equal(own[0], own[1]) and not torch.equal(own[1], own[2])
    m.check()


def test_a_full_prompt_needs_no_copies(small_model):
    # 32 tokens, block size 16, 3 samples: two full shared blocks; token 33 of each sample goes to
    # a fresh block, so nothing is ever copied.
    prompt = list(range(60, 92))
    assert group_blocks_needed(32, 34, 3, 16) == 2 + 3
    history = BlockHistory(BlockSpaceManager(5, 16))
    dec = PagedDecoder(small_model, "torch", [prompt], 3, block_size=16, n=3, history=history)
    dec.prefill([prompt])
    dec.decode([1, 2, 3])
    dec.decode([4, 5, 6])
    assert [e.kind for e in history.events].count("fork") == 2
    assert all(not e.copies for e in history.events)
    tables = [dec.manager.block_table(s).block_ids for s in range(3)]
    assert all(t[:2] == [0, 1] for t in tables) and len({t[2] for t in tables}) == 3
    dec.free()
    assert dec.manager.num_free_blocks == 5
    dec.manager.check()
