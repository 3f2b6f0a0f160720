"""``ContiguousKVCache``: per layer, one preallocated row of ``max_seq_len`` token slots per sequence.

What most engines did before PagedAttention: every sequence of the batch owns its row whether it
uses it or not (chapter 4 measures that waste).  Storage only: the caller (the generate loop)
decides which row and position each token goes to; the paged counterpart is
:mod:`paged_kv.storage.paged_cache`.

Legend: B batch, T tokens, Hkv kv heads, D head_dim, L layers.
"""

from __future__ import annotations

import torch

from ..errors import CacheError, TensorError
from ..model import attention
from ..model.attention import AttentionMetadata
from ..model.config import ModelConfig
from ..validate import count

__all__ = ["ContiguousKVCache"]


class ContiguousKVCache:
    """Per layer, ``k[layer]`` and ``v[layer]`` of shape ``[B, max_seq_len, Hkv, D]``.

    Sequence ``b`` keeps token ``t`` at row ``[b, t]``.  ``seq_lens[b]`` (int32, tokens) says how
    many rows of sequence ``b`` hold real tokens; the rest is reserved but unused.

    Args:
        cfg: the model's config (layers, kv heads, head_dim).
        batch_size: number of sequences B (rows).
        max_seq_len: token slots per row; default ``cfg.max_seq_len``.
        dtype, device: of the cache tensors (must match the model's activations).

    Memory: ``2 * L * B * max_seq_len * Hkv * D * dtype_bytes`` bytes, allocated up front;
    :attr:`nbytes` reports it from the real tensors.

    Raises:
        ConfigError: a bad batch size or length (the message names it).
        CacheError: writing past ``max_seq_len``, or a chunked prefill (whole prompts only).
        TensorError: K/V of the wrong dtype, device or shape.
    """

    def __init__(self, cfg: ModelConfig, batch_size: int, max_seq_len: int | None = None,
                 dtype: torch.dtype = torch.float32, device=None) -> None:
        batch_size = count("batch_size", batch_size, 1)
        max_seq_len = count("max_seq_len", cfg.max_seq_len if max_seq_len is None else max_seq_len, 1)
        self.cfg = cfg
        self.batch_size, self.max_seq_len = batch_size, max_seq_len
        self.dtype, self.device = dtype, torch.device(device or "cpu")
        shape = (batch_size, max_seq_len, cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(cfg.num_layers)]
        self.seq_lens = torch.zeros(batch_size, dtype=torch.int32, device=self.device)

    @property
    def nbytes(self) -> int:
        """Bytes held by all K and V tensors of all layers (what ``torch`` allocated)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
              backend: str = "torch") -> None:
        """Write this step's ``k, v [B, T, Hkv, D]`` at rows ``meta.positions`` (padding skipped).

        ``backend`` is accepted for symmetry with the paged cache and ignored (an index copy)."""
        cache_k = self.k[layer]
        if k.dtype != cache_k.dtype or k.device != cache_k.device:
            raise TensorError(f"K/V are {k.dtype} on {k.device}, the cache is {cache_k.dtype} on {cache_k.device}")
        if k.shape[0] != self.batch_size or k.shape[2:] != cache_k.shape[2:]:
            raise TensorError(f"K/V shape {tuple(k.shape)} does not fit cache {tuple(cache_k.shape)}")
        valid = meta.valid_mask  # (B, T)
        pos = meta.positions
        if valid.any() and int(pos[valid].max()) >= self.max_seq_len:
            raise CacheError(f"position {int(pos[valid].max())} is past the cache's max_seq_len {self.max_seq_len}")
        rows = torch.arange(self.batch_size, device=k.device)[:, None].expand_as(pos)
        cache_k[rows[valid], pos[valid]] = k[valid]
        self.v[layer][rows[valid], pos[valid]] = v[valid]
        if layer == self.cfg.num_layers - 1:  # the last layer closes the step
            new_len = torch.where(valid, pos + 1, 0).amax(dim=1).to(torch.int32)
            self.seq_lens = torch.maximum(self.seq_lens, new_len)

    def prefill_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          meta: AttentionMetadata, backend: str, reduction=None) -> torch.Tensor:
        """Causal attention of a prompt over its own ``k, v [B, T, Hkv, D]`` (just written here);
        ``reduction``: a :class:`~paged_kv.model.reduction.ReductionOrder` or ``None``.

        Raises:
            CacheError: a chunk that does not start at position 0 (chunked prefill needs the
                paged cache).
        """
        if bool((meta.context_lens != 0).any()):
            raise CacheError("the contiguous cache prefills whole prompts only; chunked prefill "
                             "(context_lens > 0) needs the paged cache")
        return attention.prefill_attention(q, k, v, meta.query_lens, backend, reduction)

    def decode_attention(self, layer: int, q: torch.Tensor, meta: AttentionMetadata, backend: str,
                         reduction=None) -> torch.Tensor:
        """Attention of ``q [B, H, D]`` over the first ``meta.seq_lens[b]`` cached tokens."""
        return attention.decode_attention(q, self.k[layer], self.v[layer], meta.seq_lens, backend, reduction)
