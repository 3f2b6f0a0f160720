"""paged_decode_attention (kernels/paged_attention.py) vs plain attention over the same tokens.

Runs in the Triton interpreter on the CPU.  Every case builds a NaN-filled pool, scatters the
sequences' blocks over it in shuffled order, writes the tokens with ``store_kv`` (the real
write path) and pads each block table with a NaN block: any read outside a sequence's tokens
turns the output into NaN.  The expected output is computed from the original contiguous K/V,
not from the cache.  Grid (issue 5): head_dim {64, 80, 96, 128} x block size {8, 16, 32} x
GQA ratio {1, 4, 8 (one KV head)} x {fp32, fp16}, each launch batching lengths 1, 15, 16, 17, 100.
"""

import paged_kv  # noqa: F401  (switches on the Triton interpreter before triton is imported)

import pytest
import torch

from kernels.cache_ops import store_kv
from kernels.decode_attention import decode_attention_reference
from kernels.paged_attention import (gather_kv, paged_copy, paged_decode_attention,
                                     paged_decode_attention_reference)
from paged_kv.errors import CacheError, ConfigError, DTypeNotSupportedError, TensorError

LENGTHS = [1, 15, 16, 17, 100]
HEAD_DIMS = [64, 80, 96, 128]
BLOCK_SIZES = [8, 16, 32]
HEADS = [(2, 2), (8, 2), (8, 1)]   # (H, Hkv): GQA ratios 1, 4 and 8 (MQA: one KV head)
TOL = {torch.float32: 2e-5, torch.float16: 2e-3}


def make_case(lengths, H, Hkv, D, BS, dtype, seed=0, spare=3):
    """Random q/K/V, a NaN pool holding the tokens in shuffled blocks, and the expected output.

    Returns ``(q, k_cache, v_cache, tables, lens, expected)``; ``expected`` is plain attention
    over the contiguous K/V (padding zeroed), independent of the cache and its tables.
    """
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    q = torch.randn(B, H, D, generator=g).to(dtype)
    k = torch.randn(B, T, Hkv, D, generator=g).to(dtype)
    v = torch.randn(B, T, Hkv, D, generator=g).to(dtype)
    lens = torch.tensor(lengths, dtype=torch.int32)
    pad = torch.arange(T)[None, :] >= lens[:, None]
    k[pad], v[pad] = 0, 0
    expected = decode_attention_reference(q, k, v, lens)

    per_seq = [-(-n // BS) for n in lengths]
    NB = sum(per_seq) + spare
    physical = torch.randperm(NB, generator=g).tolist()        # shuffled ids; the last stay free
    nan_block = physical[-1]
    max_blocks = max(per_seq) + 1                                # at least one padding entry each
    tables = torch.full((B, max_blocks), nan_block, dtype=torch.int32)
    slots, at = [], 0
    for b, n in enumerate(lengths):
        ids = physical[at:at + per_seq[b]]
        at += per_seq[b]
        tables[b, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
        slots += [ids[t // BS] * BS + t % BS for t in range(n)]
    k_cache = torch.full((NB, BS, Hkv, D), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    valid = ~pad
    store_kv(k[valid], v[valid], k_cache, v_cache, torch.tensor(slots, dtype=torch.int64))
    # Only the written slots changed: the rest of every last block and the spare blocks are NaN.
    assert int((~torch.isnan(k_cache[..., 0, 0])).sum()) == sum(lengths)
    return q, k_cache, v_cache, tables, lens, expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("H,Hkv", HEADS)
@pytest.mark.parametrize("BS", BLOCK_SIZES)
@pytest.mark.parametrize("D", HEAD_DIMS)
def test_paged_matches_contiguous_attention(D, BS, H, Hkv, dtype):
    q, k_cache, v_cache, tables, lens, expected = make_case(LENGTHS, H, Hkv, D, BS, dtype, seed=D + BS + H)
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens)
    assert out.dtype == dtype and out.shape == q.shape
    assert torch.isfinite(out).all(), "NaN from an unused slot leaked into the output"
    torch.testing.assert_close(out.float(), expected.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reference_gathers_the_same_tokens(dtype):
    q, k_cache, v_cache, tables, lens, expected = make_case(LENGTHS, 8, 2, 80, 16, dtype, seed=5)
    ref = paged_decode_attention_reference(q, k_cache, v_cache, tables, lens)
    torch.testing.assert_close(ref.float(), expected.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("splits,block_n", [(2, 16), (3, 32), (8, 16), (2, 64)])
def test_flash_decoding_splits(splits, block_n):
    """Split + combine (the GPU default) on the CPU; short sequences leave splits empty."""
    q, k_cache, v_cache, tables, lens, expected = make_case(LENGTHS, 8, 2, 96, 8, torch.float32, seed=splits)
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens, num_splits=splits, block_n=block_n)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_repeated_block_ids():
    """Two sequences share their blocks (a shared prefix), and one table repeats an id."""
    H, Hkv, D, BS = 4, 2, 64, 8
    g = torch.Generator().manual_seed(3)
    k_cache = torch.randn(4, BS, Hkv, D, generator=g)
    v_cache = torch.randn(4, BS, Hkv, D, generator=g)
    tables = torch.tensor([[2, 0, 3], [2, 0, 1], [1, 1, 1]], dtype=torch.int32)
    lens = torch.tensor([20, 13, 24], dtype=torch.int32)
    q = torch.randn(3, H, D, generator=g)
    # Expected from Python indexing, block by block.
    ks, vs = [], []
    for b in range(3):
        pos = range(int(lens[b]))
        ks.append(torch.stack([k_cache[int(tables[b, t // BS]), t % BS] for t in pos]))
        vs.append(torch.stack([v_cache[int(tables[b, t // BS]), t % BS] for t in pos]))
    kc = torch.zeros(3, 24, Hkv, D)
    vc = torch.zeros(3, 24, Hkv, D)
    for b in range(3):
        kc[b, :len(ks[b])], vc[b, :len(vs[b])] = ks[b], vs[b]
    expected = decode_attention_reference(q, kc, vc, lens)
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
    ref = paged_decode_attention_reference(q, k_cache, v_cache, tables, lens)
    torch.testing.assert_close(ref, expected, atol=2e-5, rtol=2e-5)


def test_strided_cache_view():
    """A pool stored head-major ([NB, Hkv, BS, D], transposed to [NB, BS, Hkv, D]); and a v pool
    in another layout than k's (each is read with its own strides; tests/kernels/test_strides.py
    has every layout)."""
    q, k_cache, v_cache, tables, lens, expected = make_case([5, 33], 4, 2, 64, 16, torch.float32, seed=9)
    k_t = k_cache.transpose(1, 2).contiguous().transpose(1, 2)
    v_t = v_cache.transpose(1, 2).contiguous().transpose(1, 2)
    assert not k_t.is_contiguous()
    out = paged_decode_attention(q, k_t, v_t, tables, lens)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
    assert k_t.stride() != v_cache.stride()
    out = paged_decode_attention(q, k_t, v_cache, tables, lens)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_paged_copy_holds_the_contiguous_tokens():
    g = torch.Generator().manual_seed(4)
    k, v = torch.randn(3, 21, 2, 8, generator=g), torch.randn(3, 21, 2, 8, generator=g)
    k_cache, v_cache, tables = paged_copy(k, v, 8, generator=g)
    assert k_cache.shape == (9, 8, 2, 8) and sorted(tables.flatten().tolist()) == list(range(9))
    lens = torch.full((3,), 21, dtype=torch.int32)
    kg, vg = gather_kv(k_cache, v_cache, tables, lens)
    assert torch.equal(kg, k) and torch.equal(vg, v)


def test_empty_batch():
    q = torch.zeros(0, 4, 64)
    cache = torch.zeros(3, 16, 2, 64)
    out = paged_decode_attention(q, cache, cache.clone(), torch.zeros(0, 2, dtype=torch.int32),
                                 torch.zeros(0, dtype=torch.int32))
    assert out.shape == (0, 4, 64)


def _args(**bad):
    args = dict(q=torch.zeros(2, 4, 64), k=torch.zeros(3, 16, 2, 64), v=torch.zeros(3, 16, 2, 64),
                tables=torch.tensor([[0, 1], [2, 0]], dtype=torch.int32),
                lens=torch.tensor([17, 3], dtype=torch.int32))
    args.update(bad)
    return args["q"], args["k"], args["v"], args["tables"], args["lens"]


@pytest.mark.parametrize("bad,err,match", [
    (dict(lens=torch.tensor([33, 3], dtype=torch.int32)), TensorError, "more than the block table covers"),
    (dict(lens=torch.tensor([0, 3], dtype=torch.int32)), TensorError, ">= 1"),
    (dict(lens=torch.tensor([3, 3])), TensorError, "int32"),
    (dict(tables=torch.tensor([[0, 1], [2, 0]])), TensorError, "int32"),
    (dict(tables=torch.tensor([[0, 1]], dtype=torch.int32)), TensorError, "block_tables 1 rows for a batch of 2"),
    (dict(tables=torch.tensor([[0, 3], [2, 0]], dtype=torch.int32)), CacheError, "block id 3"),
    (dict(tables=torch.tensor([[0, 1], [-1, 0]], dtype=torch.int32)), CacheError, "block id -1"),
    (dict(q=torch.zeros(2, 3, 64)), TensorError, "not a multiple"),
    (dict(k=torch.zeros(3, 16, 2, 64, dtype=torch.float16)), TensorError, "float16"),
    (dict(q=torch.zeros(2, 4, 64, dtype=torch.bfloat16), k=torch.zeros(3, 16, 2, 64, dtype=torch.bfloat16),
          v=torch.zeros(3, 16, 2, 64, dtype=torch.bfloat16)), DTypeNotSupportedError, "bfloat16"),
])
def test_bad_inputs_raise(bad, err, match):
    with pytest.raises(err, match=match):
        paged_decode_attention(*_args(**bad))


def test_padding_entries_are_not_checked_or_read():
    """Table entries past a sequence's blocks may hold anything, even out-of-range ids."""
    q, k, v, _, lens = _args()
    tables = torch.tensor([[0, 1], [2, 99]], dtype=torch.int32)     # seq 1 uses 1 block only
    out = paged_decode_attention(q, k, v, tables, lens)
    assert torch.isfinite(out).all()


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU with ~10 GB free: allocates a real cache of more than "
                           "2^31 elements (the offset formula itself is tested on CPU in test_cache_ops.py)")
def test_cache_larger_than_2_to_31_elements_on_gpu():
    """store_kv writes, and paged_decode_attention reads, blocks that start past element 2^31."""
    BS, Hkv, D, H = 16, 8, 128, 32
    per_block = BS * Hkv * D                                    # 16,384 elements
    NB = 2**31 // per_block + 64                                # 2^31 + 2^20 elements per cache
    free, _ = torch.cuda.mem_get_info()
    if free < 2 * NB * per_block * 2 + 2**30:
        pytest.skip(f"needs {2 * NB * per_block * 2 / 2**30:.1f} GiB free on the GPU, has {free / 2**30:.1f}")
    dev, dtype = torch.device("cuda"), torch.float16
    k_cache = torch.full((NB, BS, Hkv, D), float("nan"), dtype=dtype, device=dev)
    v_cache = torch.full_like(k_cache, float("nan"))
    assert k_cache.numel() > 2**31
    g = torch.Generator(device=dev).manual_seed(0)
    lens = [40, 17]
    blocks = [[NB - 1, 5, NB - 3], [2**31 // per_block, NB - 2]]   # high blocks, all past 2^31
    k = torch.randn(2, 48, Hkv, D, device=dev, dtype=dtype, generator=g)
    v = torch.randn(2, 48, Hkv, D, device=dev, dtype=dtype, generator=g)
    q = torch.randn(2, H, D, device=dev, dtype=dtype, generator=g)
    slots = torch.tensor([blocks[b][t // BS] * BS + t % BS for b in range(2) for t in range(lens[b])],
                         dtype=torch.int64, device=dev)
    store_kv(torch.cat([k[0, :40], k[1, :17]]), torch.cat([v[0, :40], v[1, :17]]), k_cache, v_cache, slots)
    assert torch.equal(k_cache[NB - 3, 7], k[0, 39]) and torch.equal(v_cache[NB - 2, 0], v[1, 16])
    tables = torch.tensor([blocks[0], blocks[1] + [0]], dtype=torch.int32, device=dev)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    out = paged_decode_attention(q, k_cache, v_cache, tables, seq_lens)
    kc, vc = k.clone(), v.clone()
    kc[1, 17:], vc[1, 17:] = 0, 0
    kc[0, 40:], vc[0, 40:] = 0, 0
    expected = decode_attention_reference(q, kc, vc, seq_lens)
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("name,value,match", [
    ("num_splits", -2, "num_splits must be an int >= 1, got -2"), ("num_splits", 0, "num_splits must be an int >= 1, got 0"),
    ("num_splits", 2.5, "num_splits must be an int >= \\d+, got 2.5"), ("block_n", 0, "block_n must be an int >= 16, got 0"),
    ("block_n", 24, "block_n must be a power of two.*got 24"), ("block_n", None, "block_n must be an int"),
])
def test_bad_tuning_raises_config_error(name, value, match):
    with pytest.raises(ConfigError, match=match):
        paged_decode_attention(*_args(), **{name: value})


def test_table_without_columns_raises_tensor_error():
    q, k, v, _, lens = _args()
    with pytest.raises(TensorError, match="0 columns"):
        paged_decode_attention(q, k, v, torch.zeros(2, 0, dtype=torch.int32), lens)


@pytest.mark.parametrize("bad_id", [-1, 3])
def test_reference_checks_block_ids_like_the_kernel(bad_id):
    """The torch backend reads through the reference: a negative id must not wrap to the last block."""
    q, k, v, _, lens = _args()
    tables = torch.tensor([[0, bad_id], [2, 0]], dtype=torch.int32)
    for attend in (paged_decode_attention, paged_decode_attention_reference):
        with pytest.raises(CacheError, match=f"block id {bad_id}"):
            attend(q, k, v, tables, lens)
