"""Prefill and decode Triton kernels vs their PyTorch references, under the interpreter on CPU.

Awkward shapes from the issue: head_dim 64, 80, 96, 128; GQA ratios 1, 4, 8 (incl. one KV head);
lengths 1, 15, 16, 17, 100; fp32 and fp16. Each launch batches sequences of all those lengths.
"""

import pytest
import torch

from kernels.decode_attention import decode_attention, decode_attention_reference
from kernels.prefill_attention import prefill_attention, prefill_attention_reference
from paged_kv.errors import ConfigError, DTypeNotSupportedError, TensorError

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


# --- tuning arguments ---------------------------------------------------------------------------
BAD_TUNING = [(-1, "num_splits", ">= 1, got -1"), (0, "num_splits", ">= 1, got 0"),
              (2.5, "num_splits", "must be an int >= \\d+, got 2.5"), (True, "num_splits", "must be an int"),
              (0, "block_n", ">= 16, got 0"), (24, "block_n", "power of two.*got 24"),
              (8, "block_n", ">= 16, got 8"), ("32", "block_n", "must be an int")]


@pytest.mark.parametrize("value,name,match", BAD_TUNING)
def test_decode_bad_tuning_raises_config_error(value, name, match):
    q, k = torch.zeros(1, 4, 64), torch.zeros(1, 8, 2, 64)
    with pytest.raises(ConfigError, match=f"{name}.*{match}|{match}"):
        decode_attention(q, k, k.clone(), torch.tensor([3], dtype=torch.int32), **{name: value})


@pytest.mark.parametrize("name,value,match", [("block_m", 0, ">= 16, got 0"), ("block_m", 7, "got 7"),
                                              ("block_m", 48, "power of two.*48"),
                                              ("block_n", 0, ">= 16, got 0"), ("block_n", 24, "power of two.*24"),
                                              ("block_n", 16.0, "must be an int")])
def test_prefill_bad_tuning_raises_config_error(name, value, match):
    q, k = torch.zeros(1, 8, 4, 64), torch.zeros(1, 8, 2, 64)
    with pytest.raises(ConfigError, match=match):
        prefill_attention(q, k, k.clone(), **{name: value})


def test_tuning_accepts_numpy_ints_and_none_means_default():
    np = pytest.importorskip("numpy")
    g = torch.Generator().manual_seed(6)
    q, k, v = torch.randn(1, 4, 16, generator=g), torch.randn(1, 20, 2, 16, generator=g), torch.randn(1, 20, 2, 16, generator=g)
    lens = torch.tensor([20], dtype=torch.int32)
    ref = decode_attention_reference(q, k, v, lens)
    for splits, block_n in ((None, 32), (np.int64(2), np.int32(16))):
        out = decode_attention(q, k, v, lens, num_splits=splits, block_n=block_n)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_zero_head_dim_raises_tensor_error():
    with pytest.raises(TensorError, match="head_dim D must be an int >= 1, got 0"):
        decode_attention(torch.zeros(1, 4, 0), torch.zeros(1, 8, 2, 0), torch.zeros(1, 8, 2, 0),
                         torch.tensor([3], dtype=torch.int32))
    with pytest.raises(TensorError, match="head_dim D must be an int >= 1, got 0"):
        prefill_attention(torch.zeros(1, 8, 4, 0), torch.zeros(1, 8, 2, 0), torch.zeros(1, 8, 2, 0))


# --- non-finite values: the references propagate them like the kernels -------------------------
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")   # numpy, inside the interpreter
def test_prefill_reference_propagates_nan_and_inf_like_the_kernel():
    """A NaN in q, or an inf in k, at a valid position gives NaN rows in the kernel; the reference
    must give NaN in exactly the same rows (not zeros), keep padding rows at 0, and ignore NaN in
    padding K/V (the kernel never reads it)."""
    g = torch.Generator().manual_seed(7)
    B, T, H, Hkv, D = 2, 6, 4, 2, 16
    q, k, v = (torch.randn(B, T, n, D, generator=g) for n in (H, Hkv, Hkv))
    lens = torch.tensor([6, 4], dtype=torch.int32)
    q[0, 2, 1, 5] = float("nan")                  # one query row of head 1
    k[1, 1, 0] = float("inf")                     # key 1 of KV head 0: query rows >= 1, heads 0-1
    k[1, 4:], v[1, 4:] = float("nan"), float("nan")   # padding of sequence 1
    out = prefill_attention(q, k, v, lens)
    ref = prefill_attention_reference(q, k, v, lens)
    nan_kernel = torch.isnan(out).any(-1)         # (B, T, H)
    expected = torch.zeros(B, T, H, dtype=torch.bool)
    expected[0, 2, 1] = True
    expected[1, 1:4, 0:2] = True
    assert torch.equal(nan_kernel, expected)      # the kernel's behaviour, derived by hand
    assert torch.equal(torch.isnan(ref).any(-1), expected)
    assert torch.equal(ref[1, 4:], torch.zeros_like(ref[1, 4:]))   # padding rows: exactly 0
    fine = ~expected[..., None].expand_as(ref)
    fine &= (torch.arange(T)[None, :, None, None] < lens[:, None, None, None])
    torch.testing.assert_close(out[fine], ref[fine], atol=2e-5, rtol=2e-5)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_decode_reference_ignores_padding_but_not_valid_nan():
    g = torch.Generator().manual_seed(8)
    q, k, v = torch.randn(2, 4, 16, generator=g), torch.randn(2, 10, 2, 16, generator=g), torch.randn(2, 10, 2, 16, generator=g)
    lens = torch.tensor([10, 3], dtype=torch.int32)
    clean = decode_attention_reference(q, k, v, lens)
    k[1, 3:], v[1, 3:] = float("nan"), float("nan")      # padding of sequence 1
    torch.testing.assert_close(decode_attention_reference(q, k, v, lens), clean)
    v[0, 4, 1, 0] = float("nan")                          # a real value: heads 2-3 of sequence 0
    ref = decode_attention_reference(q, k, v, lens)
    out = decode_attention(q, k, v, lens)
    want = torch.tensor([[False, False, True, True], [False, False, False, False]])
    assert torch.equal(torch.isnan(ref).any(-1), want) and torch.equal(torch.isnan(out).any(-1), want)
