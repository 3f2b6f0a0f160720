"""Golden equivalence: recompute == contiguous cache, token for token, for ragged batches."""

import pytest
import torch

from paged_kv.storage import ContiguousKVCache
from paged_kv.errors import ConfigError, PromptError
from paged_kv.decoding import generate
from paged_kv.model import SamplingParams
from paged_kv.model import load_tiny_model

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [40], [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116]]


def test_recompute_equals_contiguous(small_model):
    a = generate(small_model, PROMPTS, 24, cache="recompute", keep_logits=True)
    b = generate(small_model, PROMPTS, 24, cache="contiguous", keep_logits=True)
    assert a.tokens == b.tokens
    torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)
    assert all(len(t) == 24 for t in a.tokens)


def test_batched_equals_one_at_a_time(small_model):
    """Right padding must not change any sequence: batch of 3 == three batches of 1."""
    batched = generate(small_model, PROMPTS, 12, cache="contiguous").tokens
    alone = [generate(small_model, [p], 12, cache="contiguous").tokens[0] for p in PROMPTS]
    assert batched == alone


def test_triton_backend_gives_same_tokens(small_model):
    torch_run = generate(small_model, PROMPTS, 10, cache="contiguous", keep_logits=True)
    triton_run = generate(small_model, PROMPTS, 10, cache="contiguous", backend="triton", keep_logits=True)
    assert torch_run.tokens == triton_run.tokens
    torch.testing.assert_close(torch_run.logits, triton_run.logits, atol=1e-4, rtol=1e-4)
    recompute_triton = generate(small_model, PROMPTS, 10, cache="recompute", backend="triton")
    assert recompute_triton.tokens == torch_run.tokens


def test_seeded_sampling_is_reproducible_and_mode_independent(small_model):
    params = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=7)
    runs = [generate(small_model, PROMPTS, 16, cache=c, sampling=params).tokens
            for c in ("recompute", "contiguous", "contiguous", "paged")]
    assert runs[0] == runs[1] == runs[2] == runs[3]
    other = generate(small_model, PROMPTS, 16, sampling=SamplingParams(0.9, 40, 0.9, seed=8)).tokens
    assert other != runs[0]


def test_cache_holds_what_recompute_computes(small_model):
    """After prefill the cache rows equal the K/V a fresh forward produces; padding rows stay 0."""
    res = generate(small_model, PROMPTS, 1, cache="contiguous")
    cfg = small_model.cfg
    cache = ContiguousKVCache(cfg, 3, 32)
    from paged_kv.model import AttentionMetadata
    from paged_kv.storage import right_pad
    ids, lens = right_pad(PROMPTS, "cpu")
    small_model(ids, AttentionMetadata.for_prefill(lens, ids.shape[1]), cache)
    assert cache.seq_lens.tolist() == [len(p) for p in PROMPTS]
    assert cache.k[0][1, 1:].abs().sum() == 0  # prompt 1 has one token: rows 1.. untouched
    # one new token: the prefill writes the prompts (longest 17) and nothing more is ever written
    assert res.cache_bytes == 2 * cfg.num_layers * 3 * 17 * cfg.num_kv_heads * cfg.head_dim * 4


@pytest.mark.parametrize("cache", ["recompute", "contiguous", "paged"])
@pytest.mark.parametrize("new", [1, 2, 9])
def test_cache_holds_prompt_plus_new_minus_one(small_model, cache, new):
    """The last sampled token is returned, never fed back: every mode ends holding prompt + new - 1
    tokens per sequence (recompute: the sequence its last forward ran over)."""
    seen = {}
    generate(small_model, PROMPTS, new, cache=cache, on_step=lambda step, dec: seen.update(dec=dec))
    dec = seen["dec"]
    want = [len(p) + new - 1 for p in PROMPTS]
    if cache == "recompute":
        assert [len(s) for s in dec.seqs] == want
    else:
        assert dec.seq_lens.tolist() == want
    if cache == "paged":   # the default pool is exactly what those tokens occupy: no block unused
        used = sum(-(-w // 16) for w in want)
        assert dec.manager.num_blocks == used and dec.manager.num_free_blocks == 0


def test_paged_pool_for_a_full_block_prompt_and_one_token(small_model):
    """16 prompt tokens + 1 new token: the new token is never written, so 1 block, not 2."""
    seen = {}
    generate(small_model, [list(range(16))], 1, cache="paged", on_step=lambda s, d: seen.update(dec=d))
    assert seen["dec"].manager.num_blocks == 1


@pytest.mark.parametrize("prompts,n,err,match", [
    ([], 5, PromptError, "non-empty"),
    ([[1, 2], []], 5, PromptError, "prompt 1 is empty"),
    ([[1, 300]], 5, PromptError, "300"),
    (["hello"], 5, PromptError, "encode"),
    ([[1] * 120], 9, PromptError, "max_seq_len=128"),
    ([[1]], 0, ConfigError, "max_new_tokens"),
])
def test_bad_prompts_raise(small_model, prompts, n, err, match):
    with pytest.raises(err, match=match):
        generate(small_model, prompts, n)


def test_unknown_mode_and_backend_raise(small_model):
    with pytest.raises(ConfigError, match="cache must be one of"):
        generate(small_model, [[1]], 2, cache="magic")
    with pytest.raises(ConfigError, match="backend"):
        generate(small_model, [[1]], 2, backend="cuda")
    with pytest.raises(ConfigError, match="needs a seed"):
        generate(small_model, [[1]], 2, sampling=SamplingParams(temperature=1.0))




@pytest.mark.parametrize("prompts,n,err,match", [
    ([[1, 3.7]], 5, PromptError, "integer token ids"),
    ([[1, None]], 5, PromptError, "integer token ids"),
    ([[1, float("nan")]], 5, PromptError, "integer token ids"),
    ([[1, True]], 5, PromptError, "integer token ids"),
    ([[1]], True, ConfigError, "max_new_tokens"),
    ([5, 7, 9], 3, PromptError, r"prompt 0 .* got 5 \(one prompt\? wrap it in a list"),  # a flat list of ids
    ([None], 3, PromptError, "prompt 0 must be a list of integer token ids, got None"),
])
def test_non_integer_input_raises(small_model, prompts, n, err, match):
    with pytest.raises(err, match=match):
        generate(small_model, prompts, n)


def test_numpy_and_tensor_token_ids_are_accepted(small_model):
    import numpy as np
    expected = generate(small_model, [[5, 6, 7]], 4).tokens
    assert generate(small_model, [np.array([5, 6, 7])], 4).tokens == expected
    assert generate(small_model, [torch.tensor([5, 6, 7])], 4).tokens == expected




def test_sampling_must_be_sampling_params(small_model):
    with pytest.raises(ConfigError, match="SamplingParams"):
        generate(small_model, [[1]], 2, sampling={"temperature": 0.5})


@pytest.mark.parametrize("block_size", [1, 4, 32])
def test_paged_block_size_is_passed_through(small_model, block_size):
    seen = []
    res = generate(small_model, PROMPTS, 6, cache="paged", block_size=block_size,
                   on_step=lambda step, dec: seen.append(dec.block_size))
    assert set(seen) == {block_size}
    assert res.tokens == generate(small_model, PROMPTS, 6, cache="contiguous").tokens


def test_paged_block_size_is_validated(small_model):
    with pytest.raises(ConfigError, match="block_size"):
        generate(small_model, PROMPTS, 3, cache="paged", block_size=0)


def test_chapter_two_batch_caches_233_tokens():
    """Chapter 2's batch: prompts of 37, 4 and 15 bytes, 60 new tokens each.  The cache holds
    (37 + 4 + 15) + 3 x (60 - 1) = 233 tokens, not 236: no step writes the last token's K/V."""
    model, tok = load_tiny_model()
    prompts = [tok.encode(p) for p in ["KING HENRY:\nOnce more unto the breach", "Nay,", "First Citizen:\n"]]
    assert [len(p) for p in prompts] == [37, 4, 15]
    seen = {}
    generate(model, prompts, 60, cache="contiguous", on_step=lambda s, d: seen.update(dec=d))
    assert int(seen["dec"].seq_lens.sum()) == 233
