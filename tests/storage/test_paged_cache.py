"""PagedKVCache: sizing from a byte budget, writes through the slot mapping, block copies, metadata checks."""

import pytest
import torch
from paged_kv.model import AttentionMetadata
from paged_kv.errors import CacheError, ConfigError, TensorError
from paged_kv.storage import PagedKVCache


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
    for t in [*cache.k_cache, *cache.v_cache]:
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


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_copy_blocks_copies_every_layer(small_cfg, backend):
    cache = PagedKVCache(small_cfg, 3, 4)
    for t in [*cache.k_cache, *cache.v_cache]:
        t.normal_()
    before = [t[0].clone() for t in [*cache.k_cache, *cache.v_cache]]
    middle = [t[1].clone() for t in [*cache.k_cache, *cache.v_cache]]
    cache.copy_blocks([(0, 2)], backend)
    for t, b, m in zip([*cache.k_cache, *cache.v_cache], before, middle):
        assert torch.equal(t[2], b) and torch.equal(t[0], b) and torch.equal(t[1], m)
    with pytest.raises(CacheError):
        cache.copy_blocks([(0, 3)], backend)
