"""Paged prefill attention: a chunk of new queries attends to the sequence's cached tokens
through its block table, and causally within itself.

What you will learn here:

* **chunked prefill** (vLLM, Sarathi-Serve: Agrawal et al., OSDI 2024): the chunk's K/V are
  written to their slots first (:func:`kernels.cache_ops.store_kv`), then query ``i`` of row
  ``b``, at position ``p = context_lens[b] + i``, sees keys ``0 .. p``: the earlier chunks through
  the block table, the chunk itself causally.  A decode step is a chunk of one token, so one kernel
  can serve a batch that mixes prefill chunks and decode steps (vLLM v1's unified attention does);
* **tiles that span blocks**, int32 table gathers and int64 offsets, as in
  :mod:`kernels.paged_attention`;
* **causality in absolute positions**: the mask is ``key <= context + i``, not ``key <= i``, and
  keys past the tile's last query are never loaded, so a chunk of 5 queries after 1,000 cached
  tokens loads 1,005 keys, not 1,000 x 5;
* **garbage never leaks**: slots past a sequence's last token may hold anything (a sentinel, NaN);
  loads are masked with ``other=0`` and masked scores are ``-inf`` before the softmax.

Layouts: ``q [B, T, H, D]`` right-padded (row ``b``'s first ``query_lens[b]`` rows are real);
one layer's ``k_cache, v_cache [NB, BS, Hkv, D]``; ``block_tables [B, max_blocks]`` int32;
``context_lens [B]`` int32 (tokens cached before this chunk); ``query_lens [B]`` int32.
Output ``[B, T, H, D]``, padding rows zero.
Legend: B batch, T chunk tokens (padded), H query heads, Hkv kv heads, D head_dim, NB blocks,
BS block size.
"""

import torch

from paged_kv.errors import TensorError

from . import timing
from .cache_ops import cache_offset
from .checks import check_qkv, check_tensor, check_tuning, softmax_scale
from .paged_attention import check_block_tables, gather_kv, paged_copy
from .runtime import head_tile, require_triton, tl, triton


# ---------------------------------------------------------------------------------------------
# Plain PyTorch reference: gather every sequence's tokens out of the blocks, then masked attention.
# Bytes: reads B*S*Hkv*D K and V elements to gather them (S = the longest context + chunk),
# writes the copy and reads it again, and materialises a B*H*T*S score matrix in fp32.
# ---------------------------------------------------------------------------------------------
def paged_prefill_attention_reference(q, k_cache, v_cache, block_tables, context_lens, query_lens, scale=None):
    """Chunked prefill over a paged cache in plain PyTorch (fp32 math, cast back to ``q.dtype``).

    Args and checks as :func:`paged_prefill_attention` (any dtype).  Rows at or past
    ``query_lens[b]`` are zero.
    """
    B, T, H, D = q.shape
    seq_lens = _check_prefill_args(q, k_cache, v_cache, block_tables, context_lens, query_lens)
    scale = softmax_scale(scale, D)
    k, v = gather_kv(k_cache, v_cache, block_tables, seq_lens)           # (B, S, Hkv, D)
    S, group = k.shape[1], H // k.shape[2]
    qpos = context_lens.long()[:, None] + torch.arange(T, device=q.device)[None, :]   # (B, T) absolute
    real = torch.arange(T, device=q.device)[None, :] < query_lens.long()[:, None]       # (B, T)
    kpos = torch.arange(S, device=q.device)
    allowed = (kpos[None, None, :] <= qpos[:, :, None]) & real[:, :, None]               # (B, T, S)
    allowed &= kpos[None, None, :] < seq_lens.long()[:, None, None]
    qf = q.float().transpose(1, 2)                                          # (B, H, T, D)
    kf = k.float().repeat_interleave(group, dim=2).transpose(1, 2)          # (B, H, S, D)
    vf = v.float().repeat_interleave(group, dim=2).transpose(1, 2)
    scores = (qf @ kf.transpose(-1, -2)) * scale                            # (B, H, T, S)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.where(allowed[:, None].any(dim=-1, keepdim=True), probs, 0.0)   # padding rows -> 0
    return (probs @ vf).transpose(1, 2).to(q.dtype)                         # (B, T, H, D)


def _check_prefill_args(q, k_cache, v_cache, block_tables, context_lens, query_lens):
    """The checks the kernel and the reference share; returns ``seq_lens = context + query``."""
    check_tensor("q", q, 4)
    check_tensor("k_cache", k_cache, 4)
    check_tensor("v_cache", v_cache, 4)
    check_qkv(q, k_cache, v_cache)
    B, T = q.shape[:2]
    check_tensor("context_lens", context_lens, 1, dtype=torch.int32, device=q.device)
    check_tensor("query_lens", query_lens, 1, dtype=torch.int32, device=q.device)
    if context_lens.shape[0] != B or query_lens.shape[0] != B:
        raise TensorError(f"context_lens and query_lens need {B} entries, got {context_lens.shape[0]} "
                          f"and {query_lens.shape[0]}")
    if B and (int(context_lens.min()) < 0 or int(query_lens.min()) < 1 or int(query_lens.max()) > T):
        raise TensorError(f"need context_lens >= 0 and 1 <= query_lens <= T={T}, got "
                          f"{context_lens.tolist()} and {query_lens.tolist()}")
    seq_lens = (context_lens + query_lens).to(torch.int32)
    check_block_tables(block_tables, seq_lens, k_cache.shape[0], k_cache.shape[1], B, q.device)
    return seq_lens


# ---------------------------------------------------------------------------------------------
# The Triton kernel. One program: BLOCK_M query rows of one (sequence, query head).
# ---------------------------------------------------------------------------------------------
@triton.jit
def paged_prefill_kernel(
    Q, Out,                   # q and out [B, T, H, D] (same strides: out is allocated like q)
    KCache, VCache,           # one layer's caches [NB, BS, Hkv, D], each with its own strides
    BlockTables,              # int32 [B, max_blocks]
    ContextLens, QueryLens,   # int32 [B]: tokens cached before the chunk; tokens in the chunk
    stride_qb, stride_qt, stride_qh,   # q/out strides (elements); the D stride is 1
    stride_bt,                # block table row stride (its column stride is 1)
    stride_kb, stride_ks,     # k cache strides of a block and of a slot within the block
    stride_kh, stride_kd,     # k cache strides of a KV head and of one head_dim element
    stride_vb, stride_vs,     # the same four for the v cache
    stride_vh, stride_vd,
    scale,                    # softmax scale
    H: tl.constexpr,          # query heads
    GROUP: tl.constexpr,      # query heads per KV head
    D: tl.constexpr,          # head_dim
    BLOCK_D: tl.constexpr,    # head_dim padded to a power of two >= 16 (columns masked)
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block (BS)
    BLOCK_M: tl.constexpr,    # query rows per program
    BLOCK_N: tl.constexpr,    # key positions per inner step (may span several blocks)
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    kvh = h // GROUP                                          # GQA: this head's KV head
    context = tl.load(ContextLens + b)
    qlen = tl.load(QueryLens + b)
    start_m = pid_m * BLOCK_M
    if start_m >= qlen:                                       # a tile of padding rows
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)                  # rows of the chunk
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    mask_m = offs_m < qlen
    qpos = context + offs_m                                   # absolute positions of the queries

    q_off = b * stride_qb + h * stride_qh + offs_m[:, None].to(tl.int64) * stride_qt + offs_d[None, :]
    q = tl.load(Q + q_off, mask=mask_m[:, None] & mask_d[None, :], other=0.0)   # (BLOCK_M, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    table = BlockTables + b * stride_bt
    k_head = kvh * stride_kh + offs_d[None, :].to(tl.int64) * stride_kd   # (1, BLOCK_D) in a slot
    v_head = kvh * stride_vh + offs_d[None, :].to(tl.int64) * stride_vd   # int64: D-major views
    end_n = context + tl.minimum(start_m + BLOCK_M, qlen)     # keys past the tile's last query: never
    for start_n in range(0, end_n, BLOCK_N):
        cols = start_n + offs_n                               # key positions (BLOCK_N,)
        valid = cols < end_n
        block_ids = tl.load(table + cols // BLOCK_SIZE, mask=valid, other=0)          # int32
        in_block = cols % BLOCK_SIZE
        k_off = cache_offset(block_ids, in_block, stride_kb, stride_ks)[:, None] + k_head   # int64
        v_off = cache_offset(block_ids, in_block, stride_vb, stride_vs)[:, None] + v_head
        kv_mask = valid[:, None] & mask_d[None, :]
        k = tl.load(KCache + k_off, mask=kv_mask, other=0.0)                      # (BLOCK_N, BLOCK_D)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale                       # (BLOCK_M, BLOCK_N)
        allowed = (cols[None, :] <= qpos[:, None]) & valid[None, :] & mask_m[:, None]
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing allowed yet
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(VCache + v_off, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + q_off, out.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def paged_prefill_attention(q, k_cache, v_cache, block_tables, context_lens, query_lens, scale=None,
                            block_m: int = 16, block_n: int = 32):
    """Attention of a chunk of new queries over a paged cache that already holds their K/V.

    Args:
        q: ``[B, T, H, D]`` the chunk's queries, right-padded; fp32/fp16 (bf16 on sm_80+).
        k_cache, v_cache: ``[NB, BS, Hkv, D]`` one layer's caches, holding every token up to
            ``context_lens[b] + query_lens[b]`` of each sequence (the chunk's K/V written first).
        block_tables: ``[B, max_blocks]`` int32, each sequence's physical blocks in logical order.
        context_lens: ``[B]`` int32, tokens before the chunk (0 for a whole prompt).
        query_lens: ``[B]`` int32, ``1 <= query_lens[b] <= T`` real rows of each chunk.
        scale: softmax scale, default ``1 / sqrt(D)``.
        block_m, block_n: query rows per program and key positions per inner step (powers of two
            >= 16: ``tl.dot`` needs 16).

    Strides: every argument is only read, so any layout works.  The caches are passed with their
    own strides, k's and v's apart (a pool is never copied); ``q``, ``block_tables``,
    ``context_lens`` and ``query_lens`` are copied contiguous first when they are not, and the
    output is allocated from the contiguous ``q`` (the kernel writes it with q's strides; see
    ``kernels/checks.py``).

    Returns:
        A new contiguous ``[B, T, H, D]`` in ``q.dtype``; rows at or past ``query_lens[b]`` are zero.

    Raises:
        ConfigError: ``block_m``/``block_n`` not a power-of-two int >= 16.
        TensorError: ranks, dtypes, devices, head counts or lengths that do not fit.
        CacheError: a block id the sequences use outside the pool.
        DTypeNotSupportedError, KernelUnavailableError: see :mod:`kernels.runtime`.
    """
    block_m = check_tuning("block_m", block_m, minimum=16, power_of_two=True)
    block_n = check_tuning("block_n", block_n, minimum=16, power_of_two=True)
    _check_prefill_args(q, k_cache, v_cache, block_tables, context_lens, query_lens)
    B, T, H, D = q.shape
    # Read-only, any strides: the caches go in with their own strides; the kernel assumes a unit
    # D stride for q, unit column/element strides for the table and the lengths, and writes out
    # with q's strides.  So make those contiguous first (no copy when they are) and allocate out
    # from the contiguous q: zeros_like of a transposed q kept its strides while the kernel wrote
    # it with the copy's, and every row landed in the wrong place.
    q, block_tables = q.contiguous(), block_tables.contiguous()
    context_lens, query_lens = context_lens.contiguous(), query_lens.contiguous()
    out = torch.zeros_like(q)                  # contiguous, so exactly q's strides
    if B == 0:
        return out
    require_triton()
    scale = softmax_scale(scale, D)
    grid = (triton.cdiv(T, block_m), B * H)
    paged_prefill_kernel[grid](
        q, out, k_cache, v_cache, block_tables, context_lens, query_lens,
        q.stride(0), q.stride(1), q.stride(2),
        block_tables.stride(0),
        *k_cache.stride(), *v_cache.stride(),
        scale,
        H=H, GROUP=H // k_cache.shape[2], D=D, BLOCK_D=head_tile(D),
        BLOCK_SIZE=k_cache.shape[1], BLOCK_M=block_m, BLOCK_N=block_n,
    )
    return out


def benchmark(device, dtype, timer):
    """Rows for ``python -m kernels.bench``: TFLOP/s of one prefill chunk after a cached context,
    ours vs gathering the blocks into a contiguous tensor and running SDPA.

    FLOPs: ``4 * B * H * D`` per (query, key) pair the chunk attends to,
    ``chunk * context + chunk * (chunk + 1) / 2`` pairs per sequence.
    """
    if device.type == "cuda":
        shapes = [(4, 3584, 512, 32, 8, 128, 16), (1, 0, 4096, 32, 8, 128, 16), (16, 1024, 256, 32, 8, 128, 16)]
    else:
        shapes = [(1, 20, 13, 4, 2, 64, 16)]  # a sanity shape: the interpreter is slow
    rows = []
    for B, ctx, T, H, Hkv, D, BS in shapes:
        g = torch.Generator(device=device).manual_seed(0)
        S = ctx + T
        k = torch.randn(B, S, Hkv, D, device=device, dtype=dtype, generator=g)
        v = torch.randn(B, S, Hkv, D, device=device, dtype=dtype, generator=g)
        q = torch.randn(B, T, H, D, device=device, dtype=dtype, generator=g)
        k_cache, v_cache, tables = paged_copy(k, v, BS, generator=g)
        context = torch.full((B,), ctx, dtype=torch.int32, device=device)
        qlens = torch.full((B,), T, dtype=torch.int32, device=device)
        mask = torch.ones(T, S, dtype=torch.bool, device=device).tril(ctx)   # key j <= ctx + i

        def sdpa_gathered():
            kg, vg = gather_kv(k_cache, v_cache, tables, context + qlens)
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2), attn_mask=mask, enable_gqa=H != Hkv)

        ours = timer(lambda: paged_prefill_attention(q, k_cache, v_cache, tables, context, qlens))
        sdpa = timer(sdpa_gathered)
        flops = 4 * B * H * D * (T * ctx + T * (T + 1) // 2)
        rows.append(timing.row("paged_prefill_attention", f"B={B} ctx={ctx} T={T} H={H} Hkv={Hkv} D={D} BS={BS}",
                               dtype, ours, "TFLOP/s", flops, sdpa))
    return rows
