"""store_kv (kernels/cache_ops.py): only the mapped slots change, padding is skipped, offsets are int64.

Runs in the Triton interpreter on the CPU.  The caches start filled with NaN (a sentinel no
write produces), so "only the written slots changed" is checked over the whole pool.
"""

import paged_kv  # noqa: F401  (switches on the Triton interpreter before triton is imported)

import pytest
import torch

from kernels.runtime import tl, triton
from kernels.cache_ops import cache_offset, store_kv, store_kv_reference
from paged_kv.errors import CacheError, TensorError


def _case(T, Hkv, D, NB, BS, dtype, seed=0, pad_every=4):
    """New K/V, NaN-filled caches and a scattered slot mapping with some -1 (padding) entries."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, Hkv, D, generator=g).to(dtype)
    v = torch.randn(T, Hkv, D, generator=g).to(dtype)
    perm = torch.randperm(NB * BS, generator=g)
    perm = perm[(perm != 0) & (perm != NB * BS - 1)]
    # The last and the first slot of the pool, then distinct scattered ones.
    slots = torch.cat([torch.tensor([NB * BS - 1, 0]), perm])[:T]
    slots[2::pad_every] = -1                    # padding tokens
    k_cache = torch.full((NB, BS, Hkv, D), float("nan"), dtype=dtype)
    return k, v, k_cache, k_cache.clone(), slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("Hkv,D,BS", [(1, 64, 8), (2, 80, 16), (3, 96, 32), (8, 128, 16)])
def test_only_mapped_slots_change(dtype, Hkv, D, BS):
    T, NB = 11, 6
    k, v, k_cache, v_cache, slots = _case(T, Hkv, D, NB, BS, dtype)
    store_kv(k, v, k_cache, v_cache, slots)
    # Independent expectation: walk the tokens one by one with Python ints.
    written = torch.zeros(NB, BS, dtype=torch.bool)
    for t, s in enumerate(slots.tolist()):
        if s == -1:
            continue
        blk, off = divmod(s, BS)
        written[blk, off] = True
        assert torch.equal(k_cache[blk, off], k[t]), f"token {t} -> slot {s}: K differs"
        assert torch.equal(v_cache[blk, off], v[t]), f"token {t} -> slot {s}: V differs"
    assert int(written.sum()) == int((slots >= 0).sum())
    assert torch.isnan(k_cache[~written]).all(), "a slot outside the mapping was written (K)"
    assert torch.isnan(v_cache[~written]).all(), "a slot outside the mapping was written (V)"


def test_matches_reference_on_a_strided_cache():
    """A cache view whose strides are not the contiguous ones ([NB, Hkv, BS, D] transposed)."""
    T, Hkv, D, NB, BS = 9, 2, 64, 5, 8
    k, v, _, _, slots = _case(T, Hkv, D, NB, BS, torch.float32, seed=1, pad_every=3)
    ours = [torch.full((NB, Hkv, BS, D), float("nan")).transpose(1, 2) for _ in range(2)]
    ref = [torch.full((NB, BS, Hkv, D), float("nan")) for _ in range(2)]
    assert not ours[0].is_contiguous()
    store_kv(k, v, ours[0], ours[1], slots)
    store_kv_reference(k, v, ref[0], ref[1], slots)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


def test_all_padding_and_empty_are_no_ops():
    k, v, k_cache, v_cache, slots = _case(4, 2, 64, 3, 16, torch.float32)
    store_kv(k, v, k_cache, v_cache, torch.full_like(slots, -1))
    store_kv(k[:0], v[:0], k_cache, v_cache, slots[:0])
    assert torch.isnan(k_cache).all() and torch.isnan(v_cache).all()


# --- int64 offsets ----------------------------------------------------------------------------
@triton.jit
def _offset_probe(BlockIds, InBlock, Out, stride_block, stride_slot, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Out + i, cache_offset(tl.load(BlockIds + i), tl.load(InBlock + i), stride_block, stride_slot))


@triton.jit
def _slot_probe(Slots, Out, stride_block, stride_slot, BLOCK_SIZE: tl.constexpr, N: tl.constexpr):
    i = tl.arange(0, N)
    slot = tl.load(Slots + i)
    tl.store(Out + i, cache_offset(slot // BLOCK_SIZE, slot % BLOCK_SIZE, stride_block, stride_slot))


def test_cache_offset_is_int64_past_2_to_31():
    """The offset formula the kernels use, for blocks whose offset is past 2^31 elements.

    A Llama-3-8B layer with 16-token blocks, 8 KV heads of 128: 16,384 elements per block, so
    block 131,072 starts at element 2^31 exactly.  Block ids come in as int32 (a block table);
    the formula must widen them before multiplying.  (The full-size cache is exercised on a GPU
    by ``test_paged_attention.py::test_cache_larger_than_2_to_31_elements_on_gpu``.)
    """
    stride_block, stride_slot = 16 * 8 * 128, 8 * 128
    blocks = [0, 1, 131_071, 131_072, 131_073, 500_000, 2**31 - 1, 7]
    offs = [0, 15, 15, 0, 3, 9, 15, 1]
    out = torch.empty(len(blocks), dtype=torch.int64)
    _offset_probe[(1,)](torch.tensor(blocks, dtype=torch.int32), torch.tensor(offs, dtype=torch.int32),
                        out, stride_block, stride_slot, N=len(blocks))
    assert out.tolist() == [b * stride_block + o * stride_slot for b, o in zip(blocks, offs)]


def test_slot_offset_is_int64_past_2_to_31():
    """store_kv's path: an int64 slot -> (block, offset) -> element offset, slots up to 2^35."""
    BS, stride_block, stride_slot = 16, 16 * 8 * 128, 8 * 128
    slots = [0, 17, 131_072 * 16, 131_072 * 16 + 5, 2**31 + 3, 2**35 - 1, 2**32, 99]
    out = torch.empty(len(slots), dtype=torch.int64)
    _slot_probe[(1,)](torch.tensor(slots, dtype=torch.int64), out, stride_block, stride_slot,
                      BLOCK_SIZE=BS, N=len(slots))
    assert out.tolist() == [(s // BS) * stride_block + (s % BS) * stride_slot for s in slots]


# --- bad input ----------------------------------------------------------------------------------
def test_bad_slots_raise_cache_error():
    k, v, k_cache, v_cache, slots = _case(4, 2, 64, 3, 16, torch.float32)
    for bad in (3 * 16, -2):
        s = slots.clone()
        s[0] = bad
        with pytest.raises(CacheError, match=str(bad)):
            store_kv(k, v, k_cache, v_cache, s)
    assert torch.isnan(k_cache).all(), "a rejected call must not write anything"


def test_reference_validates_slots_like_the_kernel():
    """The PyTorch reference (the torch backend of PagedKVCache) must not wrap -5 around to slot
    NB*BS - 5, nor fail with a bare IndexError: the same CacheError as store_kv, nothing written."""
    k, v, k_cache, v_cache, slots = _case(4, 2, 64, 3, 16, torch.float32)
    for bad in (-5, -2, 3 * 16, 99):
        s = slots.clone()
        s[1] = bad
        for write in (store_kv, store_kv_reference):
            with pytest.raises(CacheError, match=f"slot {bad} is outside"):
                write(k, v, k_cache, v_cache, s)
    assert torch.isnan(k_cache).all() and torch.isnan(v_cache).all()
    with pytest.raises(TensorError, match="int64"):
        store_kv_reference(k, v, k_cache, v_cache, slots.to(torch.int32))
    s = torch.tensor([-1, 47, -1, 0])              # -1 skips: exactly the two real tokens land
    store_kv_reference(k, v, k_cache, v_cache, s)
    assert torch.equal(k_cache[2, 15], k[1]) and torch.equal(v_cache[0, 0], v[3])
    assert int((~torch.isnan(k_cache[..., 0, 0])).sum()) == 2


def test_zero_sized_heads_raise_tensor_error():
    z = torch.zeros(2, 2, 0)
    with pytest.raises(TensorError, match="head_dim D must be an int >= 1, got 0"):
        store_kv(z, z, torch.zeros(3, 4, 2, 0), torch.zeros(3, 4, 2, 0), torch.tensor([0, 1]))
    z = torch.zeros(2, 0, 4)
    with pytest.raises(TensorError, match="num_kv_heads Hkv must be an int >= 1, got 0"):
        store_kv(z, z, torch.zeros(3, 4, 0, 4), torch.zeros(3, 4, 0, 4), torch.tensor([0, 1]))


def test_bad_tensors_raise_tensor_error():
    k, v, k_cache, v_cache, slots = _case(4, 2, 64, 3, 16, torch.float32)
    with pytest.raises(TensorError, match="int64"):
        store_kv(k, v, k_cache, v_cache, slots.to(torch.int32))
    with pytest.raises(TensorError, match="entries"):
        store_kv(k, v, k_cache, v_cache, slots[:3])
    with pytest.raises(TensorError, match="float16"):
        store_kv(k, v, k_cache.half(), v_cache.half(), slots)
    with pytest.raises(TensorError, match="Hkv, D"):
        store_kv(k[:, :1], v[:, :1], k_cache, v_cache, slots)
    with pytest.raises(TensorError, match="same shape"):
        store_kv(k, v, k_cache, v_cache[:2], slots)
    with pytest.raises(TensorError, match="3 dims"):
        store_kv(k[0], v[0], k_cache, v_cache, slots)
