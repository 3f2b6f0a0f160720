"""The order of a forward pass's sums, made explicit: attention over key tiles, and batch-invariant matmuls.

Floating-point addition is not associative: ``(a + b) + c`` and ``a + (b + c)`` can differ in the
last bit, and in bf16 (8 significant bits) by much more.  A prefix-cache hit runs the same request
through a different pass: only the uncached suffix is prefilled, reading the cached context through
the block table.  The math is the same; the *order* of the sums need not be:

* **attention** reduces a query's keys tile by tile (online softmax, Milakov & Gimelshein 2018;
  FlashAttention, Dao et al. 2022).  A kernel that reads the cached context in one loop and the
  pass's own tokens in another (vLLM's ``vllm/attention/ops/prefix_prefill.py``: one loop over the
  context, one over the new tokens) restarts its tiles where the new tokens start, so a hit after
  ``c`` cached tokens groups the keys ``[0, 16), ..., [16k, c), [c, c + 16), ...`` where the
  cache-off pass grouped ``[0, 16), [16, 32), ...``.  Each tile's probabilities are taken against
  the running maximum of the tiles before it and, as in FlashAttention and our own
  ``kernels/paged_prefill.py``, cast to the values' dtype before they multiply the values: other
  tiles, other roundings;
* **matmuls** over a pass's rows: a BLAS picks its kernel by the matrix shape, and a pass of 3
  rows is not a pass of 60 (lmdeploy issue #1719: "different GEMM problem size").

:class:`ReductionOrder` names both choices.  ``batch_invariant=False`` is the natural order above;
``batch_invariant=True`` is the fix of Thinking Machines' "Defeating Nondeterminism in LLM
Inference" (He et al., 2025) and vLLM's ``VLLM_BATCH_INVARIANT=1``: tiles of a **fixed size** at
positions ``0, s, 2s, ...`` of the sequence (``s`` the split size), whatever the pass (a fixed split *size*, not a fixed
number of splits), and every row of a matmul computed alone, so a row's numbers never depend on
how many rows share its pass.  Both orders compute the same softmax(QK^T)V; they differ only in
rounding (the tests check both against a float64 brute force, and the fixed one for bit-equality
across passes).

This is the clear PyTorch path (a Python loop over the tiles, each sum over an axis of fixed length);
the speed tricks live in ``kernels/``.  Legend: B rows, T new tokens per row (right-padded), S keys,
H query heads, Hkv kv heads, D head_dim, C features in, N features out, s the split size.
"""

from __future__ import annotations

import math

import torch

from ..errors import ConfigError, TensorError
from .reduction_order import ReductionOrder, check_reduction, split_bounds

__all__ = ["ReductionOrder", "check_reduction", "linear", "split_attention", "split_bounds"]


def _check_attention_args(q, k, v, context_lens, query_lens):
    """Ranks, dtypes, devices, head counts and lengths of :func:`split_attention`'s arguments."""
    for name, t, ndim in (("q", q, 4), ("k", k, 4), ("v", v, 4)):
        if not isinstance(t, torch.Tensor) or t.dim() != ndim or not t.is_floating_point():
            raise TensorError(f"{name} must be a floating-point tensor of {ndim} dims, got "
                              f"{getattr(t, 'shape', t)!r:.60}")
    if k.shape != v.shape or k.dtype != q.dtype or v.dtype != q.dtype or k.device != q.device or v.device != q.device:
        raise TensorError(f"k {tuple(k.shape)} {k.dtype} and v {tuple(v.shape)} {v.dtype} must match each other "
                          f"and q's dtype {q.dtype} and device {q.device}")
    B, T, H, D = q.shape
    if k.shape[0] != B or k.shape[3] != D or k.shape[2] == 0 or H % k.shape[2]:
        raise TensorError(f"q [B, T, H, D] = {list(q.shape)} and k [B, S, Hkv, D] = {list(k.shape)} do not fit "
                          f"(same B and D, H a multiple of Hkv)")
    for name, t in (("context_lens", context_lens), ("query_lens", query_lens)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or tuple(t.shape) != (B,):
            raise TensorError(f"{name} must be int32 [{B}], got {getattr(t, 'dtype', t)!r:.40} "
                              f"{list(getattr(t, 'shape', []))}")
    ctx, qlen = context_lens.tolist(), query_lens.tolist()
    if B and (min(ctx) < 0 or min(qlen) < 1 or max(qlen) > T
              or max(c + n for c, n in zip(ctx, qlen)) > k.shape[1]):
        raise TensorError(f"need context_lens >= 0, 1 <= query_lens <= T={T} and context + query <= "
                          f"S={k.shape[1]} keys, got {ctx} and {qlen}")
    return ctx, qlen


def split_attention(q, k, v, context_lens, query_lens, order: ReductionOrder, scale=None) -> torch.Tensor:
    """Causal attention of a pass's queries over their keys, reduced tile by tile in ``order``.

    Query ``t`` of row ``b`` sits at position ``p = context_lens[b] + t`` and reads keys
    ``0 .. p``.  The tiles of :func:`split_bounds` are visited in order, as an online softmax
    (FlashAttention's, and ``kernels/paged_prefill.py``'s): per tile, the running maximum ``m``
    is raised to the tile's, the probabilities ``p = exp(s - m)`` are cast to ``v``'s dtype (so
    bf16 rounds them, as the kernels do before their ``p @ v`` dot), and the running sums (fp32)
    are rescaled by ``exp(m_old - m)`` and added to.  A tile wholly past ``p`` changes nothing
    (its terms are exact zeros and its rescale exactly 1), so a query's result depends only on
    its own tiles up to ``p``.  Each sum runs over a fixed-length axis (``D``, or a tile's keys
    padded to ``split_size`` in the batch-invariant order), which PyTorch reduces the same way in
    every row and every pass (``tests/model/test_reduction.py`` checks the bits).

    Args:
        q: ``[B, T, H, D]`` the pass's queries, right-padded (row ``b``'s first ``query_lens[b]``).
        k, v: ``[B, S, Hkv, D]`` every key and value each row reads (context then the pass's own),
            same dtype as ``q``; positions past ``context + query`` are ignored.
        context_lens: ``[B]`` int32, keys cached before the pass (0 for a whole prompt;
            ``seq_len - 1`` for a decode step).
        query_lens: ``[B]`` int32, ``1 <= query_lens[b] <= T``.
        order: the :class:`ReductionOrder`.
        scale: softmax scale, default ``1 / sqrt(D)``.

    Returns:
        ``[B, T, H, D]`` in ``q.dtype`` (fp32 math, cast back); padding rows are zero.

    Raises:
        TensorError: shapes, dtypes, devices or lengths that do not fit.
        ConfigError: ``order`` is not a :class:`ReductionOrder`.
    """
    if not isinstance(order, ReductionOrder):
        raise ConfigError(f"order must be a ReductionOrder, got {order!r:.60}")
    ctx, qlen = _check_attention_args(q, k, v, context_lens, query_lens)
    B, T, H, D = q.shape
    S, group = k.shape[1], H // k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    dev = q.device
    size = order.split_size
    S_pad = -(-S // size) * size                 # whole tiles: every fixed tile's sums run over `size` keys
    keep = (torch.arange(S, device=dev)[None, :]
            < (context_lens + query_lens).long()[:, None])[:, :, None, None]  # (B, S, 1, 1) keys read
    k, v = torch.where(keep, k, 0), torch.where(keep, v, 0)                  # garbage (NaN) stays out
    pad = (0, 0, 0, 0, 0, S_pad - S)
    k, v = torch.nn.functional.pad(k, pad), torch.nn.functional.pad(v, pad)  # (B, S_pad, Hkv, D)
    qf = q.float().transpose(1, 2)                                           # (B, H, T, D)
    kf = k.float().repeat_interleave(group, dim=2).transpose(1, 2)           # (B, H, S_pad, D)
    vt = v.float().repeat_interleave(group, dim=2).permute(0, 2, 3, 1)       # (B, H, D, S_pad)
    # q . k: one sum over D per (query, key), the same D-element sum in every row and pass
    scores = (qf[:, :, :, None, :] * kf[:, :, None, :, :]).sum(-1) * scale   # (B, H, T, S_pad) fp32
    qpos = context_lens.long()[:, None] + torch.arange(T, device=dev)[None, :]           # (B, T)
    real = torch.arange(T, device=dev)[None, :] < query_lens.long()[:, None]             # (B, T)
    bounds = [split_bounds(c, c + n, order) for c, n in zip(ctx, qlen)]
    tile_of = torch.full((B, S_pad), -1, dtype=torch.long)                   # (B, S_pad) key -> its tile
    for b, tiles in enumerate(bounds):
        for i, (start, stop) in enumerate(tiles):
            tile_of[b, start:stop] = i
    tile_of = tile_of.to(dev)[:, None, :]                                    # (B, 1, S_pad)
    kpos = torch.arange(S_pad, device=dev)
    causal = ((kpos[None, None, :] <= qpos[:, :, None]) & real[:, :, None])  # (B, T, S_pad)
    m = torch.full((B, H, T), float("-inf"), device=dev)                    # running max
    l = torch.zeros(B, H, T, device=dev)                                     # running sum of p
    acc = torch.zeros(B, H, T, D, device=dev)                                # running sum of p v
    for i in range(max(map(len, bounds), default=0)):
        first = min(b[i][0] for b in bounds if i < len(b))                  # the window the rows' i-th
        last = first + size if order.batch_invariant else max(b[i][1] for b in bounds if i < len(b))  # tiles span
        allowed = (causal[..., first:last] & (tile_of[..., first:last] == i))[:, None]     # (B, 1, T, W)
        s = scores[..., first:last].masked_fill(~allowed, float("-inf"))                   # (B, H, T, W)
        m_new = torch.maximum(m, s.amax(dim=-1))
        m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)           # rows with nothing allowed yet
        alpha = torch.exp(m - m_safe)                                        # 0 at the first tile
        p = torch.exp(s - m_safe[..., None]).to(v.dtype).float()            # (B, H, T, W), rounded as v is
        # the tile's sums over its W keys (masked ones exact zeros): one W-element sum per output
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + (p[..., None, :] * vt[:, :, None, :, first:last]).sum(-1)   # (B, H, T, D)
        m = m_new
    out = torch.where((l > 0)[..., None], acc / torch.where(l > 0, l, 1.0)[..., None], 0.0)   # (B, H, T, D)
    return out.transpose(1, 2).to(q.dtype)                                   # (B, T, H, D)


def linear(x: torch.Tensor, weight: torch.Tensor, order: ReductionOrder | None = None) -> torch.Tensor:
    """``x @ weight.T`` for ``x [..., C]`` and ``weight [N, C]`` -> ``[..., N]`` (``nn.Linear``, no bias).

    With ``order=None`` or the natural order: one matmul over all ``M`` rows, as ``nn.Linear`` does
    (the BLAS picks its kernel by the shape, so a row's rounding may depend on ``M``).
    Batch-invariant: ``M`` separate ``[1, C] @ [C, N]`` products in one batched matmul, in fp32
    (a bf16 product is exact in fp32), rounded to ``x``'s dtype, so every row is computed by the same
    problem whatever ``M`` is.  Thinking Machines (2025) fix the GPU matmul's tiling instead
    (vLLM's ``VLLM_BATCH_INVARIANT`` swaps in such a matmul); this is the CPU's plain equivalent.
    """
    if order is None or not order.batch_invariant:
        return torch.nn.functional.linear(x, weight)
    N, C = weight.shape
    rows = x.reshape(-1, C).float()                                           # (M, C)
    w = weight.float().T.expand(rows.shape[0], C, N)                          # (M, C, N), one copy, stride 0
    out = torch.bmm(rows[:, None, :], w)[:, 0]                                # (M, N), row by row
    return out.to(x.dtype).reshape(*x.shape[:-1], N)
