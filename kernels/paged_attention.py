"""Paged decode attention: one new query per sequence against K/V scattered over physical blocks.

What you will learn here:

* **PagedAttention** (Kwon et al., SOSP 2023, vLLM paper §4.1): token ``t`` of sequence ``b`` is
  at ``cache[block_tables[b, t // BS], t % BS]``, wherever the block sits in the pool.  The rest
  is the contiguous decode kernel of :mod:`kernels.decode_attention`: one program per (sequence,
  KV head) reads each K/V byte once for its ``GROUP`` query heads, flash-decoding splits over the
  sequence, and the same exact log-sum-exp combine (its kernel is imported, not copied);
* **tiles that span blocks**: an inner step covers ``BLOCK_N`` consecutive positions whatever the
  block size and gathers each one's physical block from the table (int32, cached on chip).  Not
  one block per step, because ``tl.dot`` needs at least 16 keys (blocks of 8 would not run) and
  blocks of 128 would force 128-key tiles; spanning tiles run every block size, even non-powers
  of two, with one tuned tile shape.  vLLM's Triton ``unified_attention`` kernel does the same;
* **garbage never leaks**: slots past a sequence's last token may hold anything, even NaN.  Every
  K and V load is masked to the valid positions with ``other=0`` and masked scores are ``-inf``
  before the softmax, so their weights are exactly 0 and multiply zeros, not NaN (``0 * NaN`` is
  NaN);
* **int64 offsets**: ``block_id * stride`` is computed in int64
  (:func:`kernels.cache_ops.cache_offset`), so caches past 2^31 elements work.

Layouts: ``q [B, H, D]``; one layer's ``k_cache, v_cache [NB, BS, Hkv, D]`` (vLLM's flash
backend, :class:`paged_kv.storage.PagedKVCache`); ``block_tables [B, max_blocks]`` int32
(entries past a sequence's blocks are padding, never read); ``seq_lens [B]`` int32, tokens of
each sequence including the new one.  Output ``[B, H, D]``.
Legend: B batch, H query heads, Hkv kv heads, D head_dim, NB blocks, BS block size.
"""

import torch

from paged_kv.errors import CacheError, TensorError

from .cache_ops import cache_offset
from .checks import check_qkv, check_tensor, check_tuning, softmax_scale
from .decode_attention import choose_num_splits, decode_attention, decode_attention_reference, decode_combine_kernel
from .runtime import head_tile, require_triton, tl, triton
from . import timing


# ---------------------------------------------------------------------------------------------
# Plain PyTorch reference: gather the blocks into a contiguous cache, then plain attention.
# Bytes: reads B*T*Hkv*D K and V elements (T = the longest sequence) to gather them, writes
# that copy, and reads it again for the attention: three times what the kernel moves.
# ---------------------------------------------------------------------------------------------
def gather_kv(k_cache, v_cache, block_tables, seq_lens):
    """Copy each sequence's tokens out of the blocks: ``k, v [B, T, Hkv, D]``, T = max(seq_lens).

    Positions at or past ``seq_lens[b]`` are set to 0 with ``torch.where`` (not multiplied by a
    mask), so NaN in unused slots does not propagate; block table padding is never followed.
    """
    B, BS = block_tables.shape[0], k_cache.shape[1]
    T = int(seq_lens.max()) if B else 0
    pos = torch.arange(T, device=k_cache.device)                         # (T,)
    valid = pos[None, :] < seq_lens.to(k_cache.device).long()[:, None]   # (B, T)
    blocks = block_tables.to(k_cache.device).long()[:, pos // BS]        # (B, T) physical ids
    blocks = torch.where(valid, blocks, 0)                                # padding -> block 0
    keep = valid[:, :, None, None]
    k = torch.where(keep, k_cache[blocks, pos % BS], 0)                  # (B, T, Hkv, D)
    v = torch.where(keep, v_cache[blocks, pos % BS], 0)
    return k, v


def paged_decode_attention_reference(q, k_cache, v_cache, block_tables, seq_lens, scale=None):
    """One decode step over a paged cache in plain PyTorch (fp32 math, cast back to ``q.dtype``).

    Args, returns and the block-table checks as :func:`paged_decode_attention` (no splits, any
    dtype): a used block id outside the pool raises ``CacheError`` rather than reading (or,
    for a negative id, wrapping around to) another block.  The torch backend of
    :class:`paged_kv.storage.PagedKVCache` reads through this.
    """
    check_block_tables(block_tables, seq_lens, k_cache.shape[0], k_cache.shape[1], q.shape[0], q.device)
    k, v = gather_kv(k_cache, v_cache, block_tables, seq_lens)
    return decode_attention_reference(q, k, v, seq_lens, scale)


# ---------------------------------------------------------------------------------------------
# Kernel 1: one program per (sequence, KV head, split) computes a partial softmax-weighted sum
# over the split's token positions, following the block table.  Kernel 2 (the combine) is
# decode_attention's decode_combine_kernel, unchanged.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _paged_decode_split_kernel(
    Q,                        # q [B, H, D]
    KCache, VCache,           # one layer's caches [NB, BS, Hkv, D], each with its own strides
    BlockTables,              # int32 [B, max_blocks]: physical block of each logical block
    SeqLens,                  # int32 [B]: tokens of each sequence (the new one included)
    PartOut, PartLse,         # fp32 [B,H,S,BLOCK_D] partial outputs; fp32 [B,H,S] log-sum-exp
    stride_qb, stride_qh,     # q strides (elements); its D stride is 1
    stride_bt,                # block table row stride (its column stride is 1)
    stride_kb, stride_ks,     # k cache strides of a block and of a slot within the block
    stride_kh, stride_kd,     # k cache strides of a KV head and of one head_dim element
    stride_vb, stride_vs,     # the same four for the v cache
    stride_vh, stride_vd,
    tokens_per_split,         # token positions each split covers (a multiple of BLOCK_N)
    scale,                    # softmax scale
    H: tl.constexpr,          # query heads
    S: tl.constexpr,          # number of splits
    GROUP: tl.constexpr,      # query heads per KV head
    BLOCK_G: tl.constexpr,    # GROUP padded to >= 16 (tl.dot needs 16 rows); rows masked
    D: tl.constexpr,          # head_dim
    BLOCK_D: tl.constexpr,    # head_tile(D): next power of two >= D, >= 16 (columns masked)
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block (BS)
    BLOCK_N: tl.constexpr,    # token positions per inner step (may span several blocks)
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

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)   # a true -inf start
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)

    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)
    table = BlockTables + b * stride_bt
    k_head = kvh * stride_kh + offs_d[None, :].to(tl.int64) * stride_kd   # (1, BLOCK_D) in a slot
    v_head = kvh * stride_vh + offs_d[None, :].to(tl.int64) * stride_vd   # int64: D-major views
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n                               # token positions (BLOCK_N,)
        valid = cols < end                                    # past the sequence: never read
        block_ids = tl.load(table + cols // BLOCK_SIZE, mask=valid, other=0)        # int32
        in_block = cols % BLOCK_SIZE
        k_off = cache_offset(block_ids, in_block, stride_kb, stride_ks)[:, None] + k_head   # int64
        v_off = cache_offset(block_ids, in_block, stride_vb, stride_vs)[:, None] + v_head
        kv_mask = valid[:, None] & mask_d[None, :]
        k = tl.load(KCache + k_off, mask=kv_mask, other=0.0)                # (BLOCK_N, BLOCK_D)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale                 # (BLOCK_G, BLOCK_N)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))            # finite: each step has a valid col
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])                        # exactly 0 where masked
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(VCache + v_off, mask=kv_mask, other=0.0)                # masked rows: 0
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new

    # An empty split (start >= seq_len) keeps l_i = 0 and writes lse = -inf: it gets weight 0.
    has = l_i > 0
    out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(has, m_i + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    row = (b * H + heads) * S + split                                  # index into [B,H,S]
    tl.store(PartOut + row[:, None] * BLOCK_D + offs_d[None, :], out, mask=mask_g[:, None])
    tl.store(PartLse + row, lse, mask=mask_g)


def check_block_tables(block_tables, seq_lens, num_blocks: int, block_size: int, B: int, device) -> int:
    """The table is int32 ``[B, max_blocks]``, covers every sequence, and points into the pool.

    One host-device sync for all the value checks (each ``.item()`` stalls a GPU's queue).
    Returns the longest sequence (tokens), 0 for an empty batch.

    Raises:
        TensorError: wrong dtype/shape/device, ``seq_lens[b] < 1``, or more than the table covers.
        CacheError: a block id the sequences use (padding excluded) outside ``0 .. NB - 1``.
    """
    check_tensor("seq_lens", seq_lens, 1, dtype=torch.int32, device=device)
    check_tensor("block_tables", block_tables, 2, dtype=torch.int32, device=device)
    if seq_lens.shape[0] != B or block_tables.shape[0] != B:
        raise TensorError(f"seq_lens has {seq_lens.shape[0]} entries and block_tables "
                          f"{block_tables.shape[0]} rows for a batch of {B}")
    if B == 0:
        return 0
    if block_tables.shape[1] == 0:
        raise TensorError(f"block_tables has 0 columns (shape {tuple(block_tables.shape)}): "
                          f"every sequence needs at least one block")
    lens = seq_lens.long()
    used = (torch.arange(block_tables.shape[1], device=device)[None, :]
            < (lens[:, None] + block_size - 1) // block_size)                # (B, max_blocks)
    ids = torch.where(used, block_tables, 0)                                  # padding -> 0
    shortest, longest, lo, hi = torch.stack([lens.min(), lens.max(), ids.min().long(),
                                             ids.max().long()]).tolist()
    covered = block_tables.shape[1] * block_size
    if shortest < 1:
        raise TensorError(f"seq_lens must be >= 1, got {shortest}")
    if longest > covered:
        raise TensorError(f"seq_lens has {longest} tokens, more than the block table covers "
                          f"({block_tables.shape[1]} blocks x {block_size} slots = {covered})")
    if lo < 0 or hi >= num_blocks:
        raise CacheError(f"block table holds block id {lo if lo < 0 else hi}, outside the "
                         f"cache's blocks 0..{num_blocks - 1}")
    return longest


def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=None,
                           num_splits=None, block_n=32):
    """One decode step over a paged KV cache with the flash-decoding Triton kernels.

    Args:
        q: ``[B, H, D]`` the new token's queries.
        k_cache, v_cache: ``[NB, BS, Hkv, D]`` one layer's caches, same dtype/device as ``q``.
            Slots outside the sequences may hold anything (even NaN).
        block_tables: ``[B, max_blocks]`` int32; ids may be in any order and may repeat
            (shared blocks); entries past ``ceil(seq_lens[b] / BS)`` are never read.
        seq_lens: ``[B]`` int32, ``1 <= seq_lens[b] <= max_blocks * BS``.
        scale: default ``1 / sqrt(D)``; else a finite number > 0 (``ConfigError`` otherwise).
        num_splits: chunks per sequence, an int >= 1; ``None``: the default from
            :func:`kernels.decode_attention.choose_num_splits` (1 under the interpreter).
        block_n: token positions per inner step (>= 16, a power of two).

    Strides: every argument is only read, so any layout works.  The caches are passed with
    their own strides, k's and v's apart (a pool is never copied: a transposed, sliced or
    expanded one costs nothing); ``q``, ``block_tables`` and ``seq_lens`` are copied contiguous
    first when they are not (see ``kernels/checks.py``).

    Returns:
        A new contiguous ``[B, H, D]`` in ``q.dtype`` (empty when ``B == 0``).

    Raises:
        ConfigError: a ``num_splits`` or ``block_n`` out of range.
        TensorError: a bad rank, shape, dtype or device, or a table that does not cover ``seq_lens``.
        CacheError: a used block id outside the pool.
        DTypeNotSupportedError, KernelUnavailableError: see :mod:`kernels.runtime`.
    """
    if num_splits is not None:
        num_splits = check_tuning("num_splits", num_splits, minimum=1)
    block_n = check_tuning("block_n", block_n, minimum=16, power_of_two=True)
    check_tensor("q", q, 3)
    check_tensor("k_cache", k_cache, 4)
    check_tensor("v_cache", v_cache, 4)
    check_qkv(q, k_cache, v_cache)
    B, H, D = q.shape
    NB, BS, Hkv = k_cache.shape[:3]
    max_len = check_block_tables(block_tables, seq_lens, NB, BS, B, q.device)
    # Read-only, any strides: the caches go in with their own strides; the kernel assumes q's D
    # stride, the table's column stride and seq_lens' stride are 1, so those are made contiguous
    # (no copy when they are), and the output is allocated from the contiguous q.
    q, block_tables, seq_lens = q.contiguous(), block_tables.contiguous(), seq_lens.contiguous()
    if B == 0:
        return torch.empty_like(q)
    require_triton()
    scale = softmax_scale(scale, D)
    group = H // Hkv
    S = num_splits if num_splits is not None else choose_num_splits(B * Hkv, max_len, block_n, q.device)
    tokens_per_split = triton.cdiv(triton.cdiv(max_len, S), block_n) * block_n
    S = triton.cdiv(max_len, tokens_per_split)
    BLOCK_D = head_tile(D)           # >= 16: tl.dot needs 16 columns on the GPU
    part_out = torch.empty(B, H, S, BLOCK_D, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(B, H, S, dtype=torch.float32, device=q.device)
    _paged_decode_split_kernel[(B, Hkv, S)](
        q, k_cache, v_cache, block_tables, seq_lens, part_out, part_lse,
        q.stride(0), q.stride(1),
        block_tables.stride(0),
        *k_cache.stride(), *v_cache.stride(),
        tokens_per_split, scale,
        H=H, S=S, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        D=D, BLOCK_D=BLOCK_D, BLOCK_SIZE=BS, BLOCK_N=block_n,
    )
    out = torch.empty_like(q)
    decode_combine_kernel[(B, H)](
        part_out, part_lse, out, out.stride(0), out.stride(1),
        H=H, S=S, BLOCK_S=triton.next_power_of_2(S), D=D, BLOCK_D=BLOCK_D,
    )
    return out


def paged_copy(k, v, block_size: int, generator=None):
    """Scatter contiguous ``k, v [B, T, Hkv, D]`` into shuffled physical blocks of a new pool.

    Returns ``(k_cache, v_cache, block_tables)`` with ``k_cache [B * ceil(T/BS), BS, Hkv, D]``
    holding the same tokens (unused slots of each last block are zero) and the int32 table
    that finds them.  Used by the benchmark and the book to compare paged with contiguous.
    """
    B, T, Hkv, D = k.shape
    n = -(-T // block_size)                                   # blocks per sequence
    pad = n * block_size - T
    perm = torch.randperm(B * n, device=k.device, generator=generator)    # logical -> physical
    caches = []
    for x in (k, v):
        blocks = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)).reshape(B * n, block_size, Hkv, D)
        cache = torch.empty_like(blocks)
        cache[perm] = blocks
        caches.append(cache)
    return caches[0], caches[1], perm.view(B, n).to(torch.int32)


def benchmark(device, dtype, timer):
    """Rows for ``python -m kernels.bench``: GB/s of one paged decode step, and ratios.

    Bytes moved: ``2*B*T*Hkv*D`` K/V elements read, q read and out written (the formula of
    :func:`kernels.decode_attention.benchmark`, so the GB/s compare).  Ratios (> 1: paged is
    faster): ``vs SDPA`` = time of gathering the blocks into a contiguous cache and running
    SDPA (what an engine without a paged kernel does each step) over ours; ``contig`` = our
    contiguous kernel's time on the same tokens over ours.  Then a block-size sweep.
    """

    if device.type == "cuda":
        shapes = [(1, 32768, 32, 8, 128), (16, 4096, 32, 8, 128), (64, 1024, 32, 8, 128),
                  (32, 2048, 32, 32, 64)]
        main_bs, sweep_shape, sweep = 16, (16, 4096, 32, 8, 128), (8, 16, 32, 64, 128)
    else:
        shapes = [(2, 100, 4, 2, 64)]  # a sanity shape: the interpreter is slow
        main_bs, sweep_shape, sweep = 16, (2, 100, 4, 2, 64), (8, 32)
    runs = [(shape, main_bs) for shape in shapes] + [(sweep_shape, bs) for bs in sweep if bs != main_bs]
    rows = []
    for (B, T, H, Hkv, D), BS in runs:
        g = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(B, H, D, device=device, dtype=dtype, generator=g)
        k = torch.randn(B, T, Hkv, D, device=device, dtype=dtype, generator=g)
        v = torch.randn(B, T, Hkv, D, device=device, dtype=dtype, generator=g)
        seq_lens = torch.full((B,), T, dtype=torch.int32, device=device)
        k_cache, v_cache, tables = paged_copy(k, v, BS, generator=g)

        def sdpa_gathered():
            kg, vg = gather_kv(k_cache, v_cache, tables, seq_lens)
            return torch.nn.functional.scaled_dot_product_attention(
                q[:, :, None], kg.transpose(1, 2), vg.transpose(1, 2), enable_gqa=H != Hkv)

        paged = timer(lambda: paged_decode_attention(q, k_cache, v_cache, tables, seq_lens))
        contig = timer(lambda: decode_attention(q, k, v, seq_lens))
        sdpa = timer(sdpa_gathered)
        moved = (2 * B * T * Hkv * D + 2 * B * H * D) * q.element_size()
        rows.append(timing.row("paged_decode_attention", f"B={B} T={T} H={H} Hkv={Hkv} D={D} BS={BS}",
                        dtype, paged, "GB/s", moved, sdpa, vs_contig=contig / paged))
    return rows
