"""How one forward pass attends: the per-batch metadata, and the choice of attention backend.

A forward pass is either a **prefill** (the prompt's tokens, all at once, causal attention
among themselves) or a **decode** step (one new token per sequence, attending to everything
cached so far).  :class:`AttentionMetadata` says which, and carries what the caches and kernels
need: positions (for RoPE and the contiguous cache's rows), sequence lengths, and for the paged
cache the slot mapping and block tables (vLLM's names for the same data, vLLM paper §4.3).

Backends: ``"torch"`` runs PyTorch's own attention (``scaled_dot_product_attention`` for a
prefill, the plain reference in ``kernels`` for a decode step); ``"triton"`` runs our Triton
kernels (compiled on CUDA, interpreted on CPU).  Both must give the same tokens.  A
``reduction`` (:class:`~paged_kv.model.reduction.ReductionOrder`, torch backend only) replaces
either by :func:`~paged_kv.model.reduction.split_attention`, whose order of sums is stated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import decode_attention as decode_kernel
from kernels import prefill_attention as prefill_kernel

from ..errors import ConfigError, TensorError
from .reduction import check_reduction, split_attention

BACKENDS = ("torch", "triton")


def check_backend(backend: str) -> str:
    """Return ``backend`` if it is ``"torch"`` or ``"triton"``, else raise ``ConfigError``."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


@dataclass
class AttentionMetadata:
    """What the attention layers need to know about one forward pass of ``[B, T]`` tokens.

    Attributes:
        phase: ``"prefill"`` (T >= 1 new tokens per row, attending causally to each other and to
            the row's cached context: none for a whole prompt, more for a later chunk of it) or
            ``"decode"`` (T == 1, one new token per sequence).
        positions: ``[B, T]`` int64, absolute position of each token (RoPE angle; the
            contiguous cache's row).
        seq_lens: ``[B]`` int32, context + new tokens of each row: how many tokens attention reads
            (vLLM's ``seq_lens``, the same meaning in both phases).
        query_lens: ``[B]`` int32, the new tokens of each row (vLLM's ``query_lens``; the rest of a
            right-padded row is padding).  Default: ``seq_lens`` in a prefill (no context), 1 in
            a decode step.
        slot_mapping: ``[B, T]`` int64 or ``None``; paged cache only: the physical slot
            (``block_id * block_size + offset``) each new token is written to, ``-1`` = padding.
        block_tables: ``[B, max_blocks]`` int32 or ``None``; paged cache only.
    """

    phase: str
    positions: torch.Tensor
    seq_lens: torch.Tensor
    query_lens: torch.Tensor | None = None
    slot_mapping: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.phase not in ("prefill", "decode"):
            raise ConfigError(f"phase must be 'prefill' or 'decode', got {self.phase!r}")
        if self.positions.dim() != 2:
            raise TensorError(f"positions must be [B, T], got shape {tuple(self.positions.shape)}")
        if self.phase == "decode" and self.positions.shape[1] != 1:
            raise TensorError(f"decode takes one token per sequence, got T={self.positions.shape[1]}")
        if self.query_lens is None:
            self.query_lens = self.seq_lens if self.phase == "prefill" else torch.ones_like(self.seq_lens)

    @property
    def context_lens(self) -> torch.Tensor:
        """``[B]`` int32, tokens each row had cached before this pass: ``seq_lens - query_lens``."""
        return self.seq_lens - self.query_lens

    @property
    def valid_mask(self) -> torch.Tensor:
        """``[B, T]`` bool: which of the batch's tokens are real (not right padding)."""
        T = self.positions.shape[1]
        return torch.arange(T, device=self.positions.device)[None, :] < self.query_lens.long()[:, None]

    @classmethod
    def for_prefill(cls, prompt_lens: torch.Tensor, T: int, **paged) -> "AttentionMetadata":
        """Metadata for right-padded prompts of lengths ``prompt_lens [B]`` in a ``[B, T]`` batch."""
        B = prompt_lens.shape[0]
        device = prompt_lens.device
        positions = torch.arange(T, device=device).expand(B, T)
        return cls("prefill", positions, prompt_lens.to(torch.int32), **paged)

    @classmethod
    def for_decode(cls, seq_lens: torch.Tensor, **paged) -> "AttentionMetadata":
        """Metadata for one new token per sequence; ``seq_lens`` counts the new token too."""
        positions = (seq_lens.long() - 1)[:, None]
        return cls("decode", positions, seq_lens.to(torch.int32), **paged)


def check_reduction_backend(reduction, backend: str):
    """``reduction`` (``None`` or a ``ReductionOrder``) if ``backend`` can run it, else ``ConfigError``:
    a reduction order is the torch backend's (the Triton kernels fix their own tiles)."""
    if check_reduction(reduction) is not None and check_backend(backend) != "torch":
        raise ConfigError(f"a reduction order ({reduction}) runs on the torch backend, got backend {backend!r}")
    return reduction


def prefill_attention(q, k, v, seq_lens, backend: str, reduction=None):
    """Causal attention over fresh prompt tokens: ``q [B,T,H,D]``, ``k, v [B,T,Hkv,D]``, each row's
    first ``seq_lens[b]`` real.  ``reduction``: see :func:`~paged_kv.model.reduction.split_attention`."""
    if check_reduction_backend(reduction, backend) is not None:
        return split_attention(q, k, v, torch.zeros_like(seq_lens, dtype=torch.int32),
                               seq_lens.to(torch.int32), reduction)
    if check_backend(backend) == "triton":
        return prefill_kernel.prefill_attention(q, k, v, seq_lens)
    # PyTorch's fused attention. Padding keys are masked; padded query rows still see key 0,
    # so no row is fully masked (which would give NaN). Their output is ignored anyway.
    B, T = q.shape[:2]
    pos = torch.arange(T, device=q.device)
    mask = (pos[None, :] <= pos[:, None])[None] & (pos[None, None, :] < seq_lens.long()[:, None, None])
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None],
        enable_gqa=q.shape[2] != k.shape[2])  # (B, H, T, D)
    return out.transpose(1, 2)


def decode_attention(q, k_cache, v_cache, seq_lens, backend: str, reduction=None):
    """One decode step against a contiguous cache layer: ``q [B,H,D]``, caches ``[B,T_max,Hkv,D]``.
    ``reduction``: the new token is a pass of one query after ``seq_lens - 1`` cached keys."""
    if check_reduction_backend(reduction, backend) is not None:
        seq_lens = seq_lens.to(torch.int32)
        return split_attention(q[:, None], k_cache, v_cache, seq_lens - 1, torch.ones_like(seq_lens),
                               reduction)[:, 0]
    if check_backend(backend) == "triton":
        return decode_kernel.decode_attention(q, k_cache, v_cache, seq_lens)
    return decode_kernel.decode_attention_reference(q, k_cache, v_cache, seq_lens)
