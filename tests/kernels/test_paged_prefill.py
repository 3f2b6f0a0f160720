"""kernels/paged_prefill.py against its reference and against contiguous causal attention."""

import pytest
import torch

from kernels.paged_attention import paged_copy
from kernels.paged_prefill import paged_prefill_attention, paged_prefill_attention_reference
from kernels.prefill_attention import prefill_attention_reference
from paged_kv.errors import CacheError, TensorError


def _case(lens_ctx, lens_q, H, Hkv, D, BS, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    B, T = len(lens_q), max(lens_q)
    S = max(c + q for c, q in zip(lens_ctx, lens_q))
    k = torch.randn(B, S, Hkv, D, generator=g).to(dtype)
    v = torch.randn(B, S, Hkv, D, generator=g).to(dtype)
    q = torch.randn(B, T, H, D, generator=g).to(dtype)
    k_cache, v_cache, tables = paged_copy(k, v, BS, generator=g)
    # unused slots hold NaN: nothing may read them
    seq = torch.tensor([c + x for c, x in zip(lens_ctx, lens_q)])
    used = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for b in range(B):
        for t in range(int(seq[b])):
            used[tables[b, t // BS], t % BS] = True
    k_cache[~used], v_cache[~used] = float("nan"), float("nan")
    return q, k, v, k_cache, v_cache, tables, torch.tensor(lens_ctx, dtype=torch.int32), torch.tensor(lens_q, dtype=torch.int32)


@pytest.mark.parametrize("ctx,qlen,H,Hkv,D,BS", [
    ([0, 0], [13, 5], 4, 2, 16, 4),              # whole prompts: context 0
    ([9, 20, 0], [4, 1, 7], 4, 1, 32, 4),        # a decode row (one query) beside chunks; MQA
    ([17, 3], [16, 31], 8, 8, 80, 16),           # head_dim 80, MHA, chunks longer than a tile
    ([31], [2], 2, 2, 64, 8),                    # context not a multiple of the block size
    ([5, 40], [3, 9], 6, 2, 24, 5),              # block size 5 (not a power of two)
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_matches_reference_and_ignores_unused_slots(ctx, qlen, H, Hkv, D, BS, dtype):
    q, k, v, kc, vc, tables, c, ql = _case(ctx, qlen, H, Hkv, D, BS, dtype)
    ref = paged_prefill_attention_reference(q, kc, vc, tables, c, ql)
    out = paged_prefill_attention(q, kc, vc, tables, c, ql)
    assert not torch.isnan(out).any() and not torch.isnan(ref).any()
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    for b in range(len(qlen)):                       # padding rows are zero
        assert (out[b, qlen[b]:] == 0).all()


def test_a_chunk_sees_what_a_whole_prompt_would():
    # The reference for a chunk at context c equals rows c.. of plain causal attention over the
    # whole sequence: chunking changes nothing.
    q, k, v, kc, vc, tables, c, ql = _case([0], [21], 4, 2, 32, 4, seed=3)
    full = prefill_attention_reference(q, k[:, :21], v[:, :21])
    for start, n in [(0, 5), (5, 3), (8, 13)]:
        qc = q[:, start:start + n]
        out = paged_prefill_attention(qc, kc, vc, tables, torch.tensor([start], dtype=torch.int32),
                                      torch.tensor([n], dtype=torch.int32))
        torch.testing.assert_close(out, full[:, start:start + n], atol=1e-5, rtol=1e-5)


def test_bad_arguments_raise():
    q, k, v, kc, vc, tables, c, ql = _case([2], [3], 2, 1, 16, 4)
    with pytest.raises(TensorError, match="query_lens"):
        paged_prefill_attention(q, kc, vc, tables, c, torch.tensor([0], dtype=torch.int32))
    with pytest.raises(TensorError, match="int32"):
        paged_prefill_attention(q, kc, vc, tables, c.long(), ql)
    with pytest.raises(CacheError):
        paged_prefill_attention(q, kc, vc, tables + 100, c, ql)
    with pytest.raises(TensorError, match="block table covers"):
        paged_prefill_attention(q, kc, vc, tables, c + 100, ql)
