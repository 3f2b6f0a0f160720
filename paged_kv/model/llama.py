"""``TinyLlama``: a small Llama-style decoder (RMSNorm, RoPE, GQA, SwiGLU) that the book decodes.

Follows the Llama architecture (Touvron et al. 2023) as implemented by Hugging Face's
``LlamaForCausalLM``, whose parameter names we reuse (minus the ``model.`` prefix) so that
:func:`load_hf_state_dict` is a rename, and whose RoPE convention ("rotate half") we match so a
transformers model with the same weights gives the same logits (``tests/model/test_llama.py``).

Legend: B batch, T tokens, H query heads, Hkv kv heads, D head_dim, C hidden size, V vocab.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import attention
from .attention import AttentionMetadata
from .config import ModelConfig
from .reduction import check_reduction, linear
from ..errors import ConfigError, PromptError, TensorError


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), computed in fp32 as Llama does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling=None, device=None) -> torch.Tensor:
    """``[D/2]`` fp32 rotation frequencies ``theta^(-2i/D)``, optionally rescaled by Llama 3.1's rule.

    ``scaling = (factor, low_freq_factor, high_freq_factor, original_context)`` (HF ``rope_type:
    "llama3"``, Llama 3 paper §3 / Meta's reference code): a frequency whose wavelength
    ``2 pi / f`` is longer than ``original_context / low_freq_factor`` is divided by ``factor``;
    one shorter than ``original_context / high_freq_factor`` is kept; in between the two are
    blended linearly in ``original_context / wavelength``.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    if scaling is None:
        return inv_freq
    factor, low, high, original = scaling
    wavelen = 2 * math.pi / inv_freq
    smooth = ((original / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(wavelen > original / low, inv_freq / factor,
                       torch.where(wavelen < original / high, inv_freq, blended))


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype, scaling=None):
    """Rotary embedding tables for ``positions [B, T]`` -> ``cos, sin [B, T, 1, D]``.

    RoFormer (Su et al. 2021) in the "rotate half" layout of HF Llama: dimension ``i`` pairs with
    ``i + D/2`` and rotates by ``position * inv_freq[i]`` (:func:`rope_inv_freq`, with the
    config's ``rope_scaling``).
    """
    inv_freq = rope_inv_freq(head_dim, theta, scaling, positions.device)
    angles = positions.float()[..., None] * inv_freq  # (B, T, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (B, T, D)
    return angles.cos()[:, :, None, :].to(dtype), angles.sin()[:, :, None, :].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, T, heads, D]`` by the angles in ``cos, sin [B, T, 1, D]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class CausalSelfAttention(nn.Module):
    """Grouped-query self-attention that reads and writes a KV cache through explicit metadata."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        C, H, Hkv, D = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(C, H * D, bias=False)
        self.k_proj = nn.Linear(C, Hkv * D, bias=False)
        self.v_proj = nn.Linear(C, Hkv * D, bias=False)
        self.o_proj = nn.Linear(H * D, C, bias=False)

    def forward(self, x, cos, sin, meta: AttentionMetadata, cache, backend: str, reduction=None):
        B, T, _ = x.shape
        cfg = self.cfg
        q = linear(x, self.q_proj.weight, reduction).view(B, T, cfg.num_heads, cfg.head_dim)  # (B, T, H, D)
        k = linear(x, self.k_proj.weight, reduction).view(B, T, cfg.num_kv_heads, cfg.head_dim)  # (B, T, Hkv, D)
        v = linear(x, self.v_proj.weight, reduction).view(B, T, cfg.num_kv_heads, cfg.head_dim)  # (B, T, Hkv, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            cache.store(self.layer_idx, k, v, meta, backend)  # this step's K/V join the cache
        # A reduction order goes to the cache only when there is one: a cache written against
        # the plain interface (layer, q, k, v, meta, backend) keeps working (assignment 1's does).
        order = {} if reduction is None else {"reduction": reduction}
        if meta.phase == "prefill" and cache is not None:
            # The cache decides: a contiguous one attends over this pass's own K/V; a paged one
            # reads through the block tables, which also serves a later chunk of a prompt.
            out = cache.prefill_attention(self.layer_idx, q, k, v, meta, backend, **order)  # (B, T, H, D)
        elif meta.phase == "prefill":
            # No cache (recompute): the prompt attends to itself, its K/V right here.
            out = attention.prefill_attention(q, k, v, meta.query_lens, backend, reduction)  # (B, T, H, D)
        else:
            if cache is None:
                raise ConfigError("a decode step needs a KV cache; use phase 'prefill' to recompute")
            out = cache.decode_attention(self.layer_idx, q[:, 0], meta, backend, **order)[:, None]  # (B, 1, H, D)
        return linear(out.reshape(B, T, cfg.num_heads * cfg.head_dim), self.o_proj.weight, reduction)


class MLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x, reduction=None):
        gate, up = linear(x, self.gate_proj.weight, reduction), linear(x, self.up_proj.weight, reduction)
        return linear(F.silu(gate) * up, self.down_proj.weight, reduction)


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = CausalSelfAttention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, meta, cache, backend, reduction=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, cache, backend, reduction)
        return x + self.mlp(self.post_attention_layernorm(x), reduction)


class TinyLlama(nn.Module):
    """A Llama-style decoder-only language model.

    ``forward(input_ids [B, T], meta, cache=None, backend="torch") -> logits [B, T, V]`` (fp32).

    * ``cache=None`` with a prefill ``meta`` is plain full-sequence attention: the recompute
      decoding of chapter 1 calls this on the whole prefix every step.
    * with a cache (:class:`~paged_kv.storage.ContiguousKVCache` or the paged one) the prefill
      writes the prompt's K/V, and each decode step writes one token and reads all cached ones.
    * ``reduction`` (a :class:`~paged_kv.model.reduction.ReductionOrder`, torch backend): the
      order of the pass's sums, explicit (attention tile by tile; each row's matmuls alone when
      batch-invariant); ``None``, the default, is PyTorch's own order.

    Raises:
        PromptError: token ids outside ``0..vocab_size-1``, or positions past ``max_seq_len``.
        TensorError: ``input_ids`` not a 2-D integer tensor on the model's device.
        ConfigError: an unknown backend, or a ``reduction`` that is not a ``ReductionOrder`` or
            is asked of the triton backend.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata | None = None,
                cache=None, backend: str = "torch", reduction=None) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
            raise TensorError(f"input_ids must be an integer tensor [B, T], got {getattr(input_ids, 'shape', input_ids)!r}")
        if input_ids.device != self.device:
            raise TensorError(f"input_ids are on {input_ids.device}, the model is on {self.device}")
        B, T = input_ids.shape
        attention.check_reduction_backend(check_reduction(reduction), backend)
        if meta is None:
            meta = AttentionMetadata.for_prefill(
                torch.full((B,), T, dtype=torch.int32, device=input_ids.device), T)
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self.cfg.vocab_size):
            raise PromptError(f"token ids must be in 0..{self.cfg.vocab_size - 1}, got "
                              f"min {int(input_ids.min())}, max {int(input_ids.max())}")
        if meta.positions.numel() and int(meta.positions.max()) >= self.cfg.max_seq_len:
            raise PromptError(f"position {int(meta.positions.max())} is past the model's "
                              f"max_seq_len {self.cfg.max_seq_len}")
        x = self.embed_tokens(input_ids)  # (B, T, C)
        cos, sin = rope_cos_sin(meta.positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype,
                                self.cfg.rope_scaling)
        for layer in self.layers:
            x = layer(x, cos, sin, meta, cache, backend, reduction)
        return linear(self.norm(x), self.lm_head.weight, reduction).float()  # (B, T, V)


# ---------------------------------------------------------------------------------------------
# Weights: Hugging Face import and the bundled checkpoint.
# ---------------------------------------------------------------------------------------------
def load_hf_state_dict(model: TinyLlama, hf_state: Mapping[str, torch.Tensor]) -> TinyLlama:
    """Copy a Hugging Face ``LlamaForCausalLM`` state dict into ``model`` (in place).

    HF names are ours with a ``model.`` prefix (``lm_head.weight`` has none).  Rotary
    ``inv_freq`` buffers are skipped.  Raises ``ConfigError`` listing missing/unexpected keys
    or mismatched shapes.
    """
    ours = {}
    for name, t in hf_state.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        ours[name[len("model."):] if name.startswith("model.") else name] = t
    if model.cfg.tie_embeddings:
        ours.setdefault("lm_head.weight", ours.get("embed_tokens.weight"))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(ours))
    unexpected = sorted(set(ours) - set(expected))
    if missing or unexpected:
        raise ConfigError(f"state dict does not match the config: missing {missing[:6]}, "
                          f"unexpected {unexpected[:6]}")
    for name, t in ours.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise ConfigError(f"{name}: shape {tuple(t.shape)}, expected {tuple(expected[name].shape)}")
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in ours.items()})
    return model
