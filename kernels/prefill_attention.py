"""Prefill attention: causal self-attention over a batch of right-padded prompts, with GQA.

What you will learn here:

* the *online softmax* (FlashAttention, Dao et al. 2022, Alg. 1): keys are visited block by
  block while a running max ``m``, a running sum ``l`` and an unnormalised output are kept in
  fp32, so the T x T score matrix never exists in memory;
* how grouped-query attention maps query head ``h`` to KV head ``h // (H // Hkv)``;
* how padding is masked: a prompt shorter than the batch's longest only attends to its own
  ``seq_lens[b]`` keys.

Layouts (token-major, as in the rest of the package): ``q [B, T, H, D]``,
``k, v [B, T, Hkv, D]``, ``seq_lens [B]`` int32, output ``[B, T, H, D]``.  Rows at or past
``seq_lens[b]`` are padding; their output is zero (the wrapper starts from zeros and the kernel
never stores there).

Structure follows the Triton tutorial ``06-fused-attention.py`` (which credits FlashAttention);
this kernel is our own, simpler forward-only version with GQA and padding masks.
"""

import torch

from paged_kv.errors import TensorError

from .checks import check_qkv, check_seq_lens, check_tensor, check_tuning, softmax_scale
from .runtime import head_tile, require_triton, tl, triton
from . import timing


# ---------------------------------------------------------------------------------------------
# Plain PyTorch reference.
# Bytes: reads q, k, v once (B*T*(H + 2*Hkv)*D*itemsize) but materialises the B*H*T*T score
# matrix in fp32 -- exactly what the kernel avoids.
# ---------------------------------------------------------------------------------------------
def prefill_attention_reference(q, k, v, seq_lens=None, scale=None):
    """Causal GQA attention in plain PyTorch, computed in fp32 and cast back to ``q.dtype``.

    Args:
        q: ``[B, T, H, D]`` queries.
        k, v: ``[B, T, Hkv, D]`` keys and values of the same tokens; ``H % Hkv == 0``.
        seq_lens: ``[B]`` int32 valid tokens per row (default: all ``T``).
        scale: softmax scale, default ``1 / sqrt(D)``.

    Returns:
        ``[B, T, H, D]``; rows at or past ``seq_lens[b]`` are zero.

    Like the kernel, it never lets padding in: K/V rows at or past ``seq_lens[b]`` are replaced
    by 0 (``torch.where``, so NaN there stays out), and only the fully masked (padding) query
    rows are set to 0.  A NaN or inf in a *valid* q/k/v row propagates, as it does in the kernel.
    """
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    scale = softmax_scale(scale, D)
    group = H // Hkv
    pos = torch.arange(T, device=q.device)
    allowed = pos[None, :] <= pos[:, None]  # (T, T) causal
    if seq_lens is not None:
        valid = pos[None, :] < seq_lens.to(q.device).long()[:, None]  # (B, T)
        keep = valid[:, :, None, None]  # (B, T, 1, 1)
        k, v = torch.where(keep, k, 0), torch.where(keep, v, 0)  # padding never read
        allowed = allowed[None] & valid[:, None, :] & valid[:, :, None]  # (B, T, T)
        allowed = allowed[:, None]  # (B, 1, T, T)
    qf = q.float().transpose(1, 2)  # (B, H, T, D)
    kf = k.float().repeat_interleave(group, dim=2).transpose(1, 2)  # (B, H, T, D)
    vf = v.float().repeat_interleave(group, dim=2).transpose(1, 2)
    scores = (qf @ kf.transpose(-1, -2)) * scale  # (B, H, T, T)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # a fully masked (padding) row is all NaN here
    probs = torch.where(allowed.any(dim=-1, keepdim=True), probs, 0.0)  # ... and 0 after this
    out = probs @ vf  # (B, H, T, D)
    return out.transpose(1, 2).to(q.dtype)


# ---------------------------------------------------------------------------------------------
# The Triton kernel. One program computes BLOCK_M query rows of one (sequence, query head).
# ---------------------------------------------------------------------------------------------
@triton.jit
def _prefill_attention_kernel(
    Q, K, V, Out,             # pointers to q [B,T,H,D], k/v [B,T,Hkv,D], out [B,T,H,D]
    SeqLens,                  # pointer to int32 [B]: valid tokens per row
    stride_qb, stride_qt, stride_qh,   # strides of q (elements); the D stride is 1
    stride_kb, stride_kt, stride_kh,   # strides of k (and v: same layout)
    stride_ob, stride_ot, stride_oh,   # strides of out
    scale,                    # softmax scale (fp32)
    H: tl.constexpr,          # query heads
    GROUP: tl.constexpr,      # query heads per KV head (H // Hkv)
    D: tl.constexpr,          # head_dim
    BLOCK_M: tl.constexpr,    # query rows per program
    BLOCK_N: tl.constexpr,    # keys per inner-loop step
    BLOCK_D: tl.constexpr,    # head_tile(D): next power of two >= D, >= 16 (loads masked to D)
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)         # int64 so b * stride cannot overflow on big batches
    h = (pid_bh % H).to(tl.int64)
    kvh = h // GROUP                       # GQA: the KV head this query head reads
    seq_len = tl.load(SeqLens + b)

    start_m = pid_m * BLOCK_M
    if start_m >= seq_len:                 # whole tile is padding: nothing to compute
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None].to(tl.int64) * stride_qt + offs_d[None, :]
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < seq_len) & mask_d[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)   # running row max
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)                 # running softmax denominator
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)        # unnormalised output

    k_base = K + b * stride_kb + kvh * stride_kh
    v_base = V + b * stride_kb + kvh * stride_kh
    # Causal: keys past the last query row of this tile are never needed.
    end_n = tl.minimum(start_m + BLOCK_M, seq_len)
    for start_n in range(0, end_n, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = (cols[:, None] < seq_len) & mask_d[None, :]
        kv_off = cols[:, None].to(tl.int64) * stride_kt + offs_d[None, :]
        k = tl.load(k_base + kv_off, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale          # (BLOCK_M, BLOCK_N)
        allowed = (cols[None, :] <= offs_m[:, None]) & (cols[None, :] < seq_len)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)                                  # rescale old partial sums
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + kv_off, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new

    out = acc / l_i[:, None]
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None].to(tl.int64) * stride_ot + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(offs_m[:, None] < seq_len) & mask_d[None, :])


def prefill_attention(q, k, v, seq_lens=None, scale=None, block_m: int = 16, block_n: int = 32):
    """Causal GQA attention with the Triton kernel (compiled on CUDA, interpreted on CPU).

    Args:
        q: ``[B, T, H, D]`` fp32/fp16 (bf16 on sm_80+); any ``D`` (padded to a power of two >= 16, see ``runtime.head_tile``).
        k, v: ``[B, T, Hkv, D]`` same dtype and device; ``H % Hkv == 0``.
        seq_lens: ``[B]`` int32 with ``1 <= seq_lens[b] <= T`` (default: all ``T``).
        scale: softmax scale, default ``1 / sqrt(D)``.
        block_m, block_n: query rows per program and keys per inner step, powers of two
            >= 16 (``tl.dot`` needs 16).

    Strides: every argument is only read, so any layout works (transposed, sliced, narrowed,
    expanded); what is not contiguous is copied contiguous first (see ``kernels/checks.py``).

    Returns:
        A new contiguous ``[B, T, H, D]`` in ``q.dtype``; rows at or past ``seq_lens[b]`` are
        left as zeros.

    Raises:
        ConfigError: ``block_m``/``block_n`` not a power-of-two int >= 16.
        TensorError: a bad rank, dtype, device, head count or length (``D == 0`` too).
        DTypeNotSupportedError: bf16 under the interpreter or on a GPU below sm_80.
        KernelUnavailableError: Triton cannot run here (no Triton, or no GPU and no interpreter).
    """
    block_m = check_tuning("block_m", block_m, minimum=16, power_of_two=True)
    block_n = check_tuning("block_n", block_n, minimum=16, power_of_two=True)
    check_tensor("q", q, 4)
    check_tensor("k", k, 4)
    check_tensor("v", v, 4)
    check_qkv(q, k, v)
    B, T, H, D = q.shape
    if k.shape[0] != B or k.shape[1] != T:
        raise TensorError(f"k has shape {tuple(k.shape)}, expected [B={B}, T={T}, Hkv, D={D}]")
    if seq_lens is None:
        seq_lens = torch.full((B,), T, dtype=torch.int32, device=q.device)
    check_seq_lens(seq_lens, B, T, q.device)
    # Read-only inputs, any strides: the kernel takes q's and k's strides but assumes a unit D
    # stride, v laid out like k and seq_lens dense, so copy whatever is not contiguous (no copy
    # when it is).  Then out is allocated from the contiguous q: zeros_like of the caller's view
    # would copy its strides, D stride included, and the kernel would write the wrong places.
    q, k, v, seq_lens = q.contiguous(), k.contiguous(), v.contiguous(), seq_lens.contiguous()
    out = torch.zeros_like(q)
    if B == 0 or T == 0:
        return out
    require_triton()
    scale = softmax_scale(scale, D)
    grid = (triton.cdiv(T, block_m), B * H)
    _prefill_attention_kernel[grid](
        q, k, v, out, seq_lens,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        scale,
        H=H, GROUP=H // k.shape[2], D=D,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=head_tile(D),
    )
    return out


def benchmark(device, dtype, timer):
    """Rows for ``python -m kernels.bench``: TFLOP/s of causal prefill, ours vs SDPA."""

    if device.type == "cuda":
        shapes = [(4, 1024, 32, 8, 128), (1, 4096, 32, 8, 128), (8, 512, 32, 32, 64)]
    else:
        shapes = [(1, 33, 4, 2, 64)]  # a sanity shape: the interpreter is slow
    rows = []
    for B, T, H, Hkv, D in shapes:
        g = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(B, T, H, D, device=device, dtype=dtype, generator=g)
        k = torch.randn(B, T, Hkv, D, device=device, dtype=dtype, generator=g)
        v = torch.randn(B, T, Hkv, D, device=device, dtype=dtype, generator=g)
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        ours = timer(lambda: prefill_attention(q, k, v))
        sdpa = timer(lambda: torch.nn.functional.scaled_dot_product_attention(
            qt, kt, vt, is_causal=True, enable_gqa=H != Hkv))
        flops = 4 * B * H * D * (T * (T + 1) // 2)  # QK^T and PV over the causal pairs
        rows.append(timing.row("prefill_attention", f"B={B} T={T} H={H} Hkv={Hkv} D={D}", dtype,
                        ours, "TFLOP/s", flops, sdpa))
    return rows
