"""``ModelConfig``: the sizes of a Llama-style decoder, with units, validated on creation.

Follows the field names of Hugging Face's ``LlamaConfig`` where one exists, so a config can be
read from a public ``config.json`` (see :meth:`ModelConfig.from_hf`).  ``head_dim`` is stored
explicitly because it is not always ``hidden_size // num_heads`` (Qwen3-4B: 2560 / 32 = 80,
but its ``head_dim`` is 128).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import ConfigError
from ..validate import count, real


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder-only transformer (Llama family).

    Attributes:
        vocab_size: number of token ids (256 for the byte-level tokenizer).
        hidden_size: model width d_model, in elements.
        num_layers: number of decoder blocks; each owns one K and one V cache.
        num_heads: query heads H.
        num_kv_heads: key/value heads Hkv (``== num_heads``: MHA; ``1``: MQA; between: GQA).
        head_dim: elements per head D. ``None`` means ``hidden_size // num_heads``.
        intermediate_size: SwiGLU hidden width, in elements.
        max_seq_len: longest sequence (prompt + generated), in tokens, the model was built for.
        rope_theta: base of the rotary position embedding frequencies.
        rms_norm_eps: epsilon inside RMSNorm.
        tie_embeddings: whether the output projection reuses the token embedding matrix.

    Raises:
        ConfigError: on a non-positive size, ``num_heads % num_kv_heads != 0``, an odd
            ``head_dim`` (rotary embeddings rotate pairs), or a bad epsilon/theta.
    """

    vocab_size: int = 256
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int | None = None
    intermediate_size: int = 768
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        fix = lambda name, value: object.__setattr__(self, name, value)  # frozen dataclass
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "intermediate_size", "max_seq_len"):
            fix(name, count(name, getattr(self, name), 1))
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ConfigError(
                    f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; "
                    "give head_dim explicitly")
            fix("head_dim", self.hidden_size // self.num_heads)
        fix("head_dim", count("head_dim", self.head_dim, 2))
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be a positive even int (RoPE rotates pairs), got {self.head_dim!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}")
        fix("rms_norm_eps", real("rms_norm_eps", self.rms_norm_eps, 0.0, low_open=True))
        fix("rope_theta", real("rope_theta", self.rope_theta, 0.0, low_open=True))
        if not isinstance(self.tie_embeddings, (bool, np.bool_)):
            raise ConfigError(f"tie_embeddings must be True or False, got {self.tie_embeddings!r}")
        fix("tie_embeddings", bool(self.tie_embeddings))

    # --- derived sizes -------------------------------------------------------------------
    @property
    def group_size(self) -> int:
        """Query heads per KV head (1: MHA, ``num_heads``: MQA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def attention_kind(self) -> str:
        """``"MHA"``, ``"GQA"`` or ``"MQA"``."""
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    def num_parameters(self) -> int:
        """Exact parameter count of :class:`paged_kv.model.TinyLlama` built from this config."""
        d, hd = self.hidden_size, self.head_dim
        attn = d * self.num_heads * hd + 2 * d * self.num_kv_heads * hd + self.num_heads * hd * d
        mlp = 3 * d * self.intermediate_size
        per_layer = attn + mlp + 2 * d  # two RMSNorm weights
        emb = self.vocab_size * d
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return emb + self.num_layers * per_layer + d + head

    # --- I/O -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown ModelConfig fields {unknown}; known: {sorted(known)}")
        return cls(**d)

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any] | Any) -> "ModelConfig":
        """Build from a Hugging Face Llama config (a ``LlamaConfig`` or its ``config.json`` dict)."""
        get = (lambda k, default=None: hf.get(k, default)) if isinstance(hf, Mapping) else (
            lambda k, default=None: getattr(hf, k, default))
        heads = get("num_attention_heads")
        rope = get("rope_theta")
        if rope is None:  # transformers >= 5 keeps it in rope_parameters
            rope = (get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return cls(
            vocab_size=get("vocab_size"),
            hidden_size=get("hidden_size"),
            num_layers=get("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim"),
            intermediate_size=get("intermediate_size"),
            max_seq_len=get("max_position_embeddings"),
            rope_theta=float(rope),
            rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(get("tie_word_embeddings", False)),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))
