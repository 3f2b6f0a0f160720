"""Prefill and decode Triton kernels vs their PyTorch references, under the interpreter on CPU.

Awkward shapes from the issue: head_dim 64, 80, 96, 128; GQA ratios 1, 4, 8 (incl. one KV head);
lengths 1, 15, 16, 17, 100; fp32 and fp16. Each launch batches sequences of all those lengths.
"""

import pytest
import torch

from kernels.decode_attention import decode_attention, decode_attention_reference
from kernels.prefill_attention import prefill_attention, prefill_attention_reference
from paged_kv.errors import DTypeNotSupportedError, TensorError

LENGTHS = [1, 15, 16, 17, 100]
HEAD_DIMS = [64, 80, 96, 128]
# (num_heads, num_kv_heads): GQA ratios 1, 4, 8; the last has a single KV head (MQA).
HEADS = [(2, 2), (4, 1), (8, 1)]
TOL = {torch.float32: 2e-5, torch.float16: 2e-3}


def _valid(out, lens):
    T = out.shape[1]
    return out[torch.arange(T)[None, :] < lens[:, None]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("H,Hkv", HEADS)
def test_decode_matches_reference(D, H, Hkv, dtype):
    g = torch.Generator().manual_seed(D * 31 + H)
    B, T = len(LENGTHS), max(LENGTHS)
    q = torch.randn(B, H, D, generator=g).to(dtype)
    k = torch.randn(B, T, Hkv, D, generator=g).to(dtype)
    v = torch.randn(B, T, Hkv, D, generator=g).to(dtype)
    lens = torch.tensor(LENGTHS, dtype=torch.int32)
    # Garbage (NaN) past each sequence's length must not leak into the output.
    pad = torch.arange(T)[None, :] >= lens[:, None]
    k[pad] = float("nan")
    v[pad] = float("nan")
    ref = decode_attention_reference(q, k.nan_to_num(0.0), v.nan_to_num(0.0), lens)
    for splits in (1, 3):  # one chunk, and flash-decoding's split + combine
        out = decode_attention(q, k, v, lens, num_splits=splits)
        assert out.dtype == dtype and out.shape == (B, H, D)
        torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("H,Hkv", HEADS)
def test_prefill_matches_reference(D, H, Hkv, dtype):
    g = torch.Generator().manual_seed(D * 17 + H)
    B, T = len(LENGTHS), max(LENGTHS)
    q = torch.randn(B, T, H, D, generator=g).to(dtype)
    k = torch.randn(B, T, Hkv, D, generator=g).to(dtype)
    v = torch.randn(B, T, Hkv, D, generator=g).to(dtype)
    lens = torch.tensor(LENGTHS, dtype=torch.int32)
    out = prefill_attention(q, k, v, lens)
    ref = prefill_attention_reference(q, k, v, lens)
    torch.testing.assert_close(_valid(out, lens).float(), _valid(ref, lens).float(),
                               atol=TOL[dtype], rtol=TOL[dtype])


def test_prefill_reference_is_causal_attention():
    """The reference itself against an independent loop over query positions."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 5, 2, 8, generator=g) for _ in range(3))
    ref = prefill_attention_reference(q, k, v)
    for t in range(5):
        s = torch.einsum("hd,shd->hs", q[0, t], k[0, :t + 1]) / 8 ** 0.5
        expected = torch.einsum("hs,shd->hd", s.softmax(-1), v[0, :t + 1])
        torch.testing.assert_close(ref[0, t], expected)


def test_decode_reference_equals_last_prefill_row():
    """Decoding token t against a cache == row t of causal prefill over the same tokens."""
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 9, 4, 16, generator=g), torch.randn(1, 9, 2, 16, generator=g), torch.randn(1, 9, 2, 16, generator=g)
    full = prefill_attention_reference(q, k, v)
    step = decode_attention_reference(q[:, -1], k, v, torch.tensor([9], dtype=torch.int32))
    torch.testing.assert_close(step, full[:, -1])


def test_empty_batch():
    q = torch.zeros(0, 4, 64)
    k = torch.zeros(0, 8, 2, 64)
    assert decode_attention(q, k, k.clone(), torch.zeros(0, dtype=torch.int32)).shape == (0, 4, 64)


@pytest.mark.parametrize("bad,match", [
    (dict(seq_lens=torch.tensor([9], dtype=torch.int32)), "more than the 8"),
    (dict(seq_lens=torch.tensor([0], dtype=torch.int32)), ">= 1"),
    (dict(seq_lens=torch.tensor([3], dtype=torch.int64)), "int32"),
    (dict(q=torch.zeros(1, 3, 64)), "not a multiple"),
    (dict(k=torch.zeros(1, 8, 2, 64, dtype=torch.float16)), "float16"),
    (dict(q=torch.zeros(1, 4, 64, dtype=torch.bfloat16), k=torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16),
          v=torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)), "bfloat16"),
])
def test_decode_bad_inputs_raise(bad, match):
    args = dict(q=torch.zeros(1, 4, 64), k=torch.zeros(1, 8, 2, 64), v=torch.zeros(1, 8, 2, 64),
                seq_lens=torch.tensor([3], dtype=torch.int32))
    args.update(bad)
    with pytest.raises((TensorError, DTypeNotSupportedError), match=match):
        decode_attention(args["q"], args["k"], args["v"], args["seq_lens"])


def test_prefill_bad_shapes_raise():
    with pytest.raises(TensorError, match="3 dims|4 dims"):
        prefill_attention(torch.zeros(2, 4, 64), torch.zeros(2, 4, 2, 64), torch.zeros(2, 4, 2, 64))
    with pytest.raises(TensorError, match="expected"):
        prefill_attention(torch.zeros(2, 4, 4, 64), torch.zeros(2, 5, 2, 64), torch.zeros(2, 5, 2, 64))
