"""kernels/copy_blocks.py against its PyTorch reference, on awkward shapes, in the interpreter."""

import pytest
import torch

from kernels.copy_blocks import block_start, copy_blocks, copy_blocks_reference
from kernels.runtime import tl, triton
from paged_kv.errors import CacheError, DTypeNotSupportedError, TensorError


def _caches(L, NB, BS, Hkv, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(L, NB, BS, Hkv, D, generator=g).to(dtype)
    return k, torch.randn(L, NB, BS, Hkv, D, generator=g).to(dtype)


@pytest.mark.parametrize("L,NB,BS,Hkv,D,pairs", [
    (2, 6, 1, 1, 16, [(0, 5)]),                   # block size 1, one KV head
    (3, 8, 16, 2, 80, [(1, 4), (2, 7)]),          # head_dim 80
    (1, 5, 128, 1, 8, [(4, 0)]),                  # block size 128: E = 1024 elements exactly
    (2, 9, 7, 3, 24, [(3, 1), (3, 2), (8, 0)]),   # a source repeated, odd sizes everywhere
    (2, 4, 4, 2, 16, []),                         # N = 0: nothing happens
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_copy_blocks_matches_reference_and_touches_nothing_else(L, NB, BS, Hkv, D, pairs, dtype):
    k, v = _caches(L, NB, BS, Hkv, D, dtype)
    k0, v0 = k.clone(), v.clone()
    kr, vr = k.clone(), v.clone()
    mapping = torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2)
    copy_blocks(k, v, mapping, block_e=64)         # several iterations per block where E > 64
    copy_blocks_reference(kr, vr, mapping)
    assert torch.equal(k, kr) and torch.equal(v, vr)                  # byte-identical
    for b in range(NB):
        src = next((s for s, d in pairs if d == b), b)
        assert torch.equal(k[:, b], k0[:, src]) and torch.equal(v[:, b], v0[:, src]), b


def test_ids_outside_the_pool_and_ambiguous_mappings_raise():
    k, v = _caches(1, 4, 2, 1, 8)
    for bad, match in [([(0, 4)], "0..3"), ([(-1, 2)], "0..3"), ([(0, 2), (1, 2)], "destination twice"),
                       ([(0, 1), (1, 2)], "also a source")]:
        for fn in (copy_blocks, copy_blocks_reference):
            with pytest.raises(CacheError, match=match):
                fn(k, v, torch.tensor(bad, dtype=torch.int64))
    with pytest.raises(TensorError, match="int64"):
        copy_blocks(k, v, torch.tensor([[0, 1]], dtype=torch.int32))
    with pytest.raises(TensorError, match=r"\[N, 2\]"):
        copy_blocks(k, v, torch.tensor([[0, 1, 2]]))
    with pytest.raises(TensorError, match="5 dims"):
        copy_blocks(k[0], v[0], torch.tensor([[0, 1]]))
    with pytest.raises(TensorError, match="contiguous"):
        copy_blocks(k.transpose(1, 2), v.transpose(1, 2), torch.tensor([[0, 1]]))
    with pytest.raises(DTypeNotSupportedError):
        copy_blocks(k.bfloat16(), v.bfloat16(), torch.tensor([[0, 1]]))


@triton.jit
def _start_probe(Layers, Blocks, Out, num_blocks, elements, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Out + i, block_start(tl.load(Layers + i), num_blocks, tl.load(Blocks + i), elements))


def test_block_start_is_int64_past_2_to_31():
    """The kernel's offset for a real pool: 32 layers of 8,192 blocks of 16 x 8 x 128 elements
    reach (31 * 8192 + 8191) * 16,384, past 2^37; layer and block ids come in as int32."""
    NB, E = 8192, 16 * 8 * 128
    layers = [0, 0, 1, 15, 16, 16, 31, 31]
    blocks = [0, 8191, 0, 8191, 0, 3, 1, 8191]
    out = torch.empty(len(layers), dtype=torch.int64)
    _start_probe[(1,)](torch.tensor(layers, dtype=torch.int32), torch.tensor(blocks, dtype=torch.int32),
                       out, NB, E, N=8)
    assert out.tolist() == [(l * NB + b) * E for l, b in zip(layers, blocks)]
    assert max(out.tolist()) > 2**31
