"""Golden equivalence for chapter 5: paged cache == contiguous cache == recompute, token for token.

Also the paged cache itself: sizing from a byte budget, the slot-mapping writes, copy-on-write
block copies, and all-or-nothing out-of-blocks errors of the decoder.
"""

import random

import pytest
import torch

from paged_kv.attention import AttentionMetadata
from paged_kv.blocks import BlockSpaceManager
from paged_kv.errors import CacheError, ConfigError, OutOfBlocksError, TensorError
from paged_kv.generate import ContiguousDecoder, generate
from paged_kv.paged_cache import PagedKVCache
from paged_kv.paged_decoding import PagedDecoder

# Lengths 7, 1, 17, 16: with 16-token blocks the batch starts inside, at and past a boundary.
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [40], list(range(100, 117)), list(range(60, 76))]


def _greedy(decoder, prompts, n):
    """generate()'s loop over a decoder we built ourselves; returns tokens and [n, B, V] logits."""
    logits = [decoder.prefill(prompts)]
    tokens = [logits[-1].argmax(-1).tolist()]
    for _ in range(n - 1):
        logits.append(decoder.decode(tokens[-1]))
        tokens.append(logits[-1].argmax(-1).tolist())
    return [list(t) for t in zip(*tokens)], torch.stack(logits)


def test_paged_equals_contiguous_equals_recompute(small_model):
    runs = {c: generate(small_model, PROMPTS, 24, cache=c, keep_logits=True)
            for c in ("recompute", "contiguous", "paged")}
    assert runs["paged"].tokens == runs["contiguous"].tokens == runs["recompute"].tokens
    torch.testing.assert_close(runs["paged"].logits, runs["contiguous"].logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(runs["paged"].logits, runs["recompute"].logits, atol=1e-4, rtol=1e-4)


def test_triton_backend_paged_equals_torch(small_model):
    torch_run = generate(small_model, PROMPTS, 8, cache="paged", keep_logits=True)
    triton_run = generate(small_model, PROMPTS, 8, cache="paged", backend="triton", keep_logits=True)
    contiguous = generate(small_model, PROMPTS, 8, cache="contiguous", backend="triton")
    assert triton_run.tokens == torch_run.tokens == contiguous.tokens
    torch.testing.assert_close(triton_run.logits, torch_run.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_scattered_small_blocks_give_the_same_tokens(small_model, backend):
    """Block size 4 and a shuffled free list: every sequence's blocks land far apart."""
    n = 6 if backend == "triton" else 20
    expected = generate(small_model, PROMPTS, n, cache="contiguous").tokens
    decoder = PagedDecoder(small_model, backend, PROMPTS, n, block_size=4, num_blocks=40)
    order = list(range(40))
    random.Random(0).shuffle(order)
    decoder.manager = BlockSpaceManager(40, 4, free_order=order)
    tokens, _ = _greedy(decoder, PROMPTS, n)
    assert tokens == expected
    tables = decoder.block_tables()
    assert tables[2, :5].tolist() == list(decoder.manager.block_table(2))[:5]
    assert tables[2, :5].tolist() != sorted(tables[2, :5].tolist())   # not in physical order


def test_blocks_grow_on_demand(small_model):
    cfg, n, BS = small_model.cfg, 10, 16
    seen = []
    res = generate(small_model, PROMPTS, n, cache="paged",
                   on_step=lambda step, d: seen.append([len(d.manager.block_table(i)) for i in range(4)]))
    # After the prefill and each decode step, sequence b holds ceil(tokens / BS) blocks.
    for step, blocks in enumerate(seen):
        tokens = [len(p) + step for p in PROMPTS]
        assert blocks == [-(-t // BS) for t in tokens], f"step {step}"
    per_block = 2 * cfg.num_layers * BS * cfg.num_kv_heads * cfg.head_dim * 4    # fp32 bytes
    pool_blocks = sum(-(-(len(p) + n) // BS) for p in PROMPTS)                   # 1+1+2+2
    assert res.cache_bytes == pool_blocks * per_block


def test_pool_against_contiguous_reservation(small_model):
    """A ragged batch: contiguous reserves 4 x 70 slots, the pool 5 + 1 + 1 + 2 blocks of 16.

    (On a batch of near-equal lengths, like PROMPTS, rounding up to blocks can cost more than
    the contiguous padding: 7 x 16 = 112 slots against 4 x 27 = 108.)
    """
    cfg, n = small_model.cfg, 10
    prompts = [[1] * 60, [2], [3] * 5, [4] * 20]
    per_slot = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
    paged = generate(small_model, prompts, n, cache="paged")
    contiguous = generate(small_model, prompts, n, cache="contiguous")
    assert paged.tokens == contiguous.tokens
    assert contiguous.cache_bytes == 4 * 70 * per_slot
    assert paged.cache_bytes == (5 + 1 + 1 + 2) * 16 * per_slot


def test_paged_cache_holds_the_contiguous_cache_rows(small_model):
    """After prefill + 5 steps, gathering each sequence's slots gives the contiguous rows."""
    n = 6
    paged = PagedDecoder(small_model, "torch", PROMPTS, n, block_size=8)
    contig = ContiguousDecoder(small_model, "torch", len(PROMPTS), max(map(len, PROMPTS)) + n)
    assert _greedy(paged, PROMPTS, n)[0] == _greedy(contig, PROMPTS, n)[0]
    for layer in range(small_model.cfg.num_layers):
        for b, p in enumerate(PROMPTS):
            t = len(p) + n - 1                                 # the last token is never fed back
            slots = torch.tensor(paged.manager.slot_mapping(b, 0, t))
            k = paged.cache.k_cache[layer].flatten(0, 1)[slots]
            v = paged.cache.v_cache[layer].flatten(0, 1)[slots]
            torch.testing.assert_close(k, contig.cache.k[layer][b, :t], atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(v, contig.cache.v[layer][b, :t], atol=1e-6, rtol=1e-6)


def test_out_of_blocks_is_all_or_nothing(small_model):
    # Prompts need 1 + 1 + 2 + 1 = 5 blocks; a pool of 4 refuses the whole batch.
    small = PagedDecoder(small_model, "torch", PROMPTS, 4, num_blocks=4)
    with pytest.raises(OutOfBlocksError) as err:
        small.prefill(PROMPTS)
    assert (err.value.needed, err.value.free) == (5, 4)
    assert small.manager.num_free_blocks == 4 and small.manager.seq_ids == []
    # Exactly the prompts' blocks: the first decode step needs a block for the 16-token prompt.
    tight = PagedDecoder(small_model, "torch", PROMPTS, 4, num_blocks=5)
    logits = tight.prefill(PROMPTS)
    with pytest.raises(OutOfBlocksError) as err:
        tight.decode(logits.argmax(-1).tolist())
    assert (err.value.needed, err.value.free) == (1, 0)
    assert [tight.manager.num_tokens(i) for i in range(4)] == [len(p) for p in PROMPTS]
    tight.free()
    assert tight.manager.num_free_blocks == 5


# --- PagedKVCache ----------------------------------------------------------------------------
def test_budget_sizing(small_cfg):
    per_block = 2 * small_cfg.num_layers * 16 * small_cfg.num_kv_heads * small_cfg.head_dim * 2   # fp16
    cache = PagedKVCache.from_memory_budget(small_cfg, 10 * per_block + per_block - 1, 16, torch.float16)
    assert cache.num_blocks == 10 and cache.bytes_per_block == per_block
    assert cache.nbytes == 10 * per_block
    assert cache.k_cache[0].shape == (10, 16, small_cfg.num_kv_heads, small_cfg.head_dim)
    with pytest.raises(ConfigError, match="holds no block"):
        PagedKVCache.from_memory_budget(small_cfg, per_block - 1, 16, torch.float16)
    # A float budget is refused for being a float, not reported as "too small" (1e6 holds blocks).
    assert 10**6 >= per_block
    for bad in (1e6, float(per_block), "1000000", True):
        with pytest.raises(ConfigError, match="must be an int number of bytes") as e:
            PagedKVCache.from_memory_budget(small_cfg, bad, 16, torch.float16)
        assert "holds no block" not in str(e.value)
    np = pytest.importorskip("numpy")
    assert PagedKVCache.from_memory_budget(small_cfg, np.int64(3 * per_block), 16, torch.float16).num_blocks == 3
    with pytest.raises(ConfigError, match="num_blocks"):
        PagedKVCache(small_cfg, 0, 16)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_store_follows_the_slot_mapping(small_cfg, backend):
    cache = PagedKVCache(small_cfg, 4, 8)
    for t in cache.k_cache + cache.v_cache:
        t.fill_(float("nan"))
    Hkv, D = small_cfg.num_kv_heads, small_cfg.head_dim
    k, v = torch.randn(2, 3, Hkv, D), torch.randn(2, 3, Hkv, D)
    slots = torch.tensor([[31, 0, 9], [17, -1, -1]])          # second row: one token + padding
    meta = AttentionMetadata.for_prefill(torch.tensor([3, 1]), 3, slot_mapping=slots)
    cache.store(1, k, v, meta, backend)
    for (b, t), s in {(0, 0): 31, (0, 1): 0, (0, 2): 9, (1, 0): 17}.items():
        assert torch.equal(cache.k_cache[1][s // 8, s % 8], k[b, t])
        assert torch.equal(cache.v_cache[1][s // 8, s % 8], v[b, t])
    assert int((~torch.isnan(cache.k_cache[1][..., 0, 0])).sum()) == 4
    assert torch.isnan(cache.k_cache[0]).all()                # other layers untouched
    with pytest.raises(CacheError, match="32"):
        cache.store(0, k, v, AttentionMetadata.for_prefill(torch.tensor([3, 1]), 3,
                                                           slot_mapping=slots.clamp(max=0) + 32), backend)


def test_store_and_read_need_paged_metadata(small_cfg):
    cache = PagedKVCache(small_cfg, 2, 8)
    k = torch.zeros(1, 1, small_cfg.num_kv_heads, small_cfg.head_dim)
    meta = AttentionMetadata.for_decode(torch.tensor([1]))
    with pytest.raises(TensorError, match="slot_mapping"):
        cache.store(0, k, k, meta)
    with pytest.raises(TensorError, match="int64"):
        cache.store(0, k, k, AttentionMetadata.for_decode(torch.tensor([1]), slot_mapping=torch.zeros(1, 1, dtype=torch.int32)))
    with pytest.raises(TensorError, match="block_tables"):
        cache.decode_attention(0, torch.zeros(1, small_cfg.num_heads, small_cfg.head_dim), meta, "torch")


def test_copy_blocks_copies_every_layer(small_cfg):
    cache = PagedKVCache(small_cfg, 3, 4)
    for t in cache.k_cache + cache.v_cache:
        t.normal_()
    before = [t[0].clone() for t in cache.k_cache + cache.v_cache]
    cache.copy_blocks([(0, 2)])
    for t, b in zip(cache.k_cache + cache.v_cache, before):
        assert torch.equal(t[2], b) and torch.equal(t[0], b)
    with pytest.raises(CacheError):
        cache.copy_blocks([(0, 3)])
