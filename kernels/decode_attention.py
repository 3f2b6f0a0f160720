"""Decode attention: one new query per sequence against a contiguous KV cache (flash-decoding).

What you will learn here:

* why a decode step is **memory-bound**: each sequence has a single query row, so every cached
  K/V byte is read for ~2 FLOPs per element -- the step's cost grows with the t cached tokens;
* **GQA grouping**: the ``GROUP = H // Hkv`` query heads that share a KV head are handled by one
  program, so each K/V byte is loaded from memory once per group rather than once per head;
* **flash-decoding** (Dao et al., "Flash-Decoding for long-context inference", 2023): with a
  small batch, one program per (sequence, KV head) would leave most of a GPU idle, so the
  sequence is split into ``num_splits`` chunks processed in parallel; each writes a partial
  output and its log-sum-exp, and a second small kernel combines them exactly.

Layouts: ``q [B, H, D]``; ``k_cache, v_cache [B, T_max, Hkv, D]`` (one layer, token-major, the
layout of :class:`paged_kv.storage.ContiguousKVCache`); ``seq_lens [B]`` int32, the number of
valid cached tokens of each sequence (the new token included).  Output ``[B, H, D]``.
"""

import torch

from paged_kv.errors import TensorError

from .checks import check_qkv, check_seq_lens, check_tensor, check_tuning, softmax_scale
from .runtime import head_tile, require_triton, tl, triton
from . import timing


# ---------------------------------------------------------------------------------------------
# Plain PyTorch reference.
# Bytes: reads B*max(seq_lens)*Hkv*D K and V elements (shorter sequences' padding too) and q
# once; writes the output once. The kernel reads only the seq_lens[b] valid rows of each.
# ---------------------------------------------------------------------------------------------
def decode_attention_reference(q, k_cache, v_cache, seq_lens, scale=None):
    """One decode step of GQA attention in plain PyTorch (fp32 math, cast back to ``q.dtype``).

    Args:
        q: ``[B, H, D]`` the new token's queries.
        k_cache, v_cache: ``[B, T_max, Hkv, D]``; rows ``>= seq_lens[b]`` are ignored.
        seq_lens: ``[B]`` int32, ``1 <= seq_lens[b] <= T_max``.
        scale: default ``1 / sqrt(D)``; else a finite number > 0 (``ConfigError`` otherwise).

    Returns:
        ``[B, H, D]``.  Like the kernel, rows past ``seq_lens[b]`` are never read (replaced by 0
        with ``torch.where``, so NaN there stays out); NaN or inf in valid rows propagates.
    """
    B, H, D = q.shape
    Hkv = k_cache.shape[2]
    T_max = int(seq_lens.max()) if B else 0  # rows past the longest sequence are never read
    scale = softmax_scale(scale, D)
    group = H // Hkv
    valid = torch.arange(T_max, device=q.device)[None, :] < seq_lens.to(q.device).long()[:, None]
    keep = valid[:, :, None, None]  # (B, T_max, 1, 1)
    qf = q.float().view(B, Hkv, group, D)
    kf = torch.where(keep, k_cache[:, :T_max].float(), 0)
    vf = torch.where(keep, v_cache[:, :T_max].float(), 0)
    scores = torch.einsum("bkgd,btkd->bkgt", qf, kf) * scale  # (B, Hkv, G, T_max)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bkgt,btkd->bkgd", probs, vf)  # (B, Hkv, G, D)
    return out.reshape(B, H, D).to(q.dtype)


# ---------------------------------------------------------------------------------------------
# Kernel 1: one program per (sequence, KV head, split) computes a partial softmax-weighted sum.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _decode_split_kernel(
    Q, K, V,                  # q [B,H,D]; k/v cache [B,T_max,Hkv,D]
    SeqLens,                  # int32 [B]
    PartOut, PartLse,         # fp32 [B,H,S,BLOCK_D] partial outputs; fp32 [B,H,S] log-sum-exp
    stride_qb, stride_qh,     # q strides (elements)
    stride_kb, stride_kt, stride_kh,   # cache strides (k and v share them)
    tokens_per_split,         # tokens each split covers (a multiple of BLOCK_N)
    scale,                    # softmax scale
    H: tl.constexpr,          # query heads
    S: tl.constexpr,          # number of splits
    GROUP: tl.constexpr,      # query heads per KV head
    BLOCK_G: tl.constexpr,    # GROUP padded to >= 16 (tl.dot needs 16 rows); rows masked
    D: tl.constexpr,          # head_dim
    BLOCK_D: tl.constexpr,    # head_tile(D): next power of two >= D, >= 16 (columns masked)
    BLOCK_N: tl.constexpr,    # cached tokens per inner step
):
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    seq_len = tl.load(SeqLens + b)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_g = offs_g < GROUP
    mask_d = offs_d < D
    heads = kvh * GROUP + offs_g                              # the query heads of this group

    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_g[:, None] & mask_d[None, :], other=0.0)   # (BLOCK_G, BLOCK_D)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)

    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)
    base = b * stride_kb + kvh * stride_kh
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = (cols[:, None] < end) & mask_d[None, :]
        kv_off = base + cols[:, None].to(tl.int64) * stride_kt + offs_d[None, :]
        k = tl.load(K + kv_off, mask=kv_mask, other=0.0)               # (BLOCK_N, BLOCK_D)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale              # (BLOCK_G, BLOCK_N)
        s = tl.where(cols[None, :] < end, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new

    # An empty split (start >= seq_len) keeps l_i = 0 and writes lse = -inf: it gets weight 0.
    has = l_i > 0
    out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    row = (b * H + heads) * S + split                                  # index into [B,H,S]
    tl.store(PartOut + row[:, None] * BLOCK_D + offs_d[None, :], out, mask=mask_g[:, None])
    tl.store(PartLse + row, lse, mask=mask_g)


# ---------------------------------------------------------------------------------------------
# Kernel 2: combine the S partial results of one (sequence, query head) exactly:
#   out = sum_s exp(lse_s - lse) * out_s,  lse = log sum_s exp(lse_s)
# ---------------------------------------------------------------------------------------------
@triton.jit
def decode_combine_kernel(
    PartOut, PartLse,         # fp32 [B,H,S,BLOCK_D], fp32 [B,H,S]
    Out,                      # [B,H,D] in the output dtype
    stride_ob, stride_oh,     # out strides
    H: tl.constexpr, S: tl.constexpr, BLOCK_S: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    row = (b * H + h) * S
    lse = tl.load(PartLse + row + offs_s, mask=offs_s < S, other=float("-inf"))
    m = tl.max(lse, axis=0)                    # finite: split 0 always holds >= 1 token
    w = tl.exp(lse - m)
    w = w / tl.sum(w, axis=0)
    parts = tl.load(PartOut + (row + offs_s)[:, None] * BLOCK_D + offs_d[None, :],
                    mask=(offs_s < S)[:, None], other=0.0)
    out = tl.sum(parts * w[:, None], axis=0)
    tl.store(Out + b * stride_ob + h * stride_oh + offs_d, out.to(Out.dtype.element_ty),
             mask=offs_d < D)


def choose_num_splits(batch_kv_programs: int, max_len: int, block_n: int, device) -> int:
    """How many chunks to split each sequence into (flash-decoding's one tuning knob).

    Aim for about two waves of programs on the GPU's SMs, but give every split at least
    ``4 * block_n`` tokens so the combine step stays cheap. On the CPU interpreter, 1.
    """
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = max(1, (2 * sms) // max(1, batch_kv_programs))
    most = max(1, triton.cdiv(max_len, 4 * block_n))
    return int(min(want, most, 64))


def decode_attention(q, k_cache, v_cache, seq_lens, scale=None, num_splits=None, block_n=32):
    """One decode step with the flash-decoding Triton kernels.

    Args:
        q: ``[B, H, D]``.
        k_cache, v_cache: ``[B, T_max, Hkv, D]``, same dtype/device as ``q``.
        seq_lens: ``[B]`` int32 with ``1 <= seq_lens[b] <= T_max``.
        scale: default ``1 / sqrt(D)``; else a finite number > 0 (``ConfigError`` otherwise).
        num_splits: chunks per sequence, an int >= 1 (more than the tokens fill are dropped);
            ``None``: the default from :func:`choose_num_splits`.
        block_n: cached tokens per inner step, a power of two >= 16 (``tl.dot`` needs 16).

    Strides: every argument is only read, so any layout works.  The caches are passed with their
    own strides when their D stride is 1 and ``v_cache`` has ``k_cache``'s strides (a sliced or
    expanded cache costs no copy); otherwise both are copied contiguous first, as are a
    non-contiguous ``q`` and ``seq_lens`` (see ``kernels/checks.py``).

    Returns:
        A new contiguous ``[B, H, D]`` in ``q.dtype``.

    Raises:
        ConfigError: a ``num_splits`` or ``block_n`` out of range.
        TensorError, DTypeNotSupportedError, KernelUnavailableError (see ``prefill_attention``).
    """
    if num_splits is not None:
        num_splits = check_tuning("num_splits", num_splits, minimum=1)
    block_n = check_tuning("block_n", block_n, minimum=16, power_of_two=True)
    check_tensor("q", q, 3)
    check_tensor("k_cache", k_cache, 4)
    check_tensor("v_cache", v_cache, 4)
    check_qkv(q, k_cache, v_cache)
    B, H, D = q.shape
    if k_cache.shape[0] != B:
        raise TensorError(f"k_cache has batch {k_cache.shape[0]}, q has {B}")
    T_max, Hkv = k_cache.shape[1], k_cache.shape[2]
    check_seq_lens(seq_lens, B, T_max, q.device)
    # Read-only inputs, any strides.  The split kernel takes q's and the cache's strides but
    # assumes a unit D stride, v laid out like k and seq_lens dense: copy only what breaks that.
    # The output is allocated below from the contiguous q, never like the caller's view.
    q, seq_lens = q.contiguous(), seq_lens.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride() != k_cache.stride():
        k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    if B == 0:
        return torch.empty_like(q)
    require_triton()
    scale = softmax_scale(scale, D)
    group = H // Hkv
    max_len = int(seq_lens.max())
    S = num_splits if num_splits is not None else choose_num_splits(B * Hkv, max_len, block_n, q.device)
    tokens_per_split = triton.cdiv(triton.cdiv(max_len, S), block_n) * block_n
    S = triton.cdiv(max_len, tokens_per_split)
    BLOCK_D = head_tile(D)           # >= 16: tl.dot needs 16 columns on the GPU
    part_out = torch.empty(B, H, S, BLOCK_D, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(B, H, S, dtype=torch.float32, device=q.device)
    _decode_split_kernel[(B, Hkv, S)](
        q, k_cache, v_cache, seq_lens, part_out, part_lse,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        tokens_per_split, scale,
        H=H, S=S, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        D=D, BLOCK_D=BLOCK_D, BLOCK_N=block_n,
    )
    out = torch.empty_like(q)
    decode_combine_kernel[(B, H)](
        part_out, part_lse, out, out.stride(0), out.stride(1),
        H=H, S=S, BLOCK_S=triton.next_power_of_2(S), D=D, BLOCK_D=BLOCK_D,
    )
    return out


def benchmark(device, dtype, timer):
    """Rows for ``python -m kernels.bench``: GB/s of one decode step, ours vs SDPA."""

    if device.type == "cuda":
        shapes = [(1, 32768, 32, 8, 128), (16, 4096, 32, 8, 128), (64, 1024, 32, 8, 128),
                  (32, 2048, 32, 32, 64)]
    else:
        shapes = [(2, 100, 4, 2, 64)]
    rows = []
    for B, T, H, Hkv, D in shapes:
        g = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(B, H, D, device=device, dtype=dtype, generator=g)
        k = torch.randn(B, T, Hkv, D, device=device, dtype=dtype, generator=g)
        v = torch.randn(B, T, Hkv, D, device=device, dtype=dtype, generator=g)
        seq_lens = torch.full((B,), T, dtype=torch.int32, device=device)
        q4, kt, vt = q[:, :, None], k.transpose(1, 2), v.transpose(1, 2)
        ours = timer(lambda: decode_attention(q, k, v, seq_lens))
        sdpa = timer(lambda: torch.nn.functional.scaled_dot_product_attention(
            q4, kt, vt, enable_gqa=H != Hkv))
        moved = (2 * B * T * Hkv * D + 2 * B * H * D) * q.element_size()  # K, V read; q read, out written
        rows.append(timing.row("decode_attention", f"B={B} T={T} H={H} Hkv={Hkv} D={D}", dtype,
                        ours, "GB/s", moved, sdpa))
    return rows
