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

from ..errors import ConfigError
from ..memory.spec import llama_num_parameters
from ..validate import count, is_bool, real


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
        rope_scaling: ``None`` (plain RoPE) or Llama 3.1's frequency rule as a tuple
            ``(factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)``
            (HF ``rope_type: "llama3"``; see :func:`paged_kv.model.llama.rope_inv_freq`).

    Validated on creation (:class:`~paged_kv.errors.ConfigError`); ``head_dim`` must be even, as
    rotary embeddings rotate pairs.
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
    rope_scaling: tuple[float, float, float, int] | None = None

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
        if not is_bool(self.tie_embeddings):        # a numpy bool too (from a loaded config)
            raise ConfigError(f"tie_embeddings must be True or False, got {self.tie_embeddings!r}")
        fix("tie_embeddings", bool(self.tie_embeddings))
        if self.rope_scaling is not None:
            try:
                factor, low, high, original = self.rope_scaling
            except (TypeError, ValueError):
                raise ConfigError("rope_scaling must be None or (factor, low_freq_factor, high_freq_factor, "
                                  f"original_max_position_embeddings), got {self.rope_scaling!r}") from None
            scaling = (real("rope_scaling factor", factor, 0.0, low_open=True),
                       real("rope_scaling low_freq_factor", low, 0.0, low_open=True),
                       real("rope_scaling high_freq_factor", high, 0.0, low_open=True),
                       count("rope_scaling original_max_position_embeddings", original, 1))
            if scaling[2] <= scaling[1]:
                raise ConfigError(f"rope_scaling high_freq_factor {high} must exceed low_freq_factor {low}")
            fix("rope_scaling", scaling)

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
        """Exact parameter count of :class:`paged_kv.model.TinyLlama` built from this config: the
        Llama family's count (:func:`paged_kv.memory.spec.llama_num_parameters`, no biases, two
        RMSNorms per layer), which the tests check against ``sum(p.numel())`` of the model."""
        return llama_num_parameters(vocab=self.vocab_size, hidden=self.hidden_size, layers=self.num_layers,
                                    heads=self.num_heads, kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                                    intermediate=self.intermediate_size, tied=self.tie_embeddings)

    # --- I/O -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown ModelConfig fields {unknown}; known: {sorted(known)}")
        d = dict(d)
        if isinstance(d.get("rope_scaling"), list):  # JSON has no tuples
            d["rope_scaling"] = tuple(d["rope_scaling"])
        return cls(**d)

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any] | Any) -> "ModelConfig":
        """Build from a Hugging Face Llama config (a ``LlamaConfig`` or its ``config.json`` dict).

        Every field that would change the math and that :class:`~paged_kv.model.TinyLlama` does
        not implement is refused rather than ignored (ignoring it would give other logits than
        transformers): RoPE scaling other than ``"default"`` and ``"llama3"`` (``linear``,
        ``dynamic``, ``yarn``, ``longrope``, ...), ``partial_rotary_factor`` below 1, attention or
        MLP biases, an activation other than SiLU, logit soft-capping, a query pre-attention
        scalar, and an active sliding window shorter than the context.

        Raises:
            ConfigError: naming the unsupported field and its value.
        """
        get = (lambda k, default=None: hf.get(k, default)) if isinstance(hf, Mapping) else (
            lambda k, default=None: getattr(hf, k, default))
        heads = get("num_attention_heads")
        params = dict(get("rope_parameters") or {})   # transformers >= 5: theta and scaling here
        scaling = get("rope_scaling") or params
        rope = get("rope_theta")
        if rope is None:
            rope = params.get("rope_theta", 10000.0)
        rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default")) or "default"
        rope_scaling = None
        if rope_type == "llama3":
            rope_scaling = (scaling.get("factor"), scaling.get("low_freq_factor"), scaling.get("high_freq_factor"),
                            scaling.get("original_max_position_embeddings"))
        elif rope_type != "default":
            raise ConfigError(f"rope_scaling rope_type {rope_type!r} is not implemented (only 'default' and "
                              "'llama3'): the logits would differ from transformers'")
        partial = params.get("partial_rotary_factor", get("partial_rotary_factor", 1.0))
        refused = {
            "partial_rotary_factor": partial not in (None, 1, 1.0),
            "attention_bias": bool(get("attention_bias", False)),
            "mlp_bias": bool(get("mlp_bias", False)),
            "hidden_act": get("hidden_act", "silu") not in ("silu", "swish", None),
            "attn_logit_softcapping": get("attn_logit_softcapping") is not None,
            "final_logit_softcapping": get("final_logit_softcapping") is not None,
            "query_pre_attn_scalar": get("query_pre_attn_scalar") is not None,
            "sliding_window": (get("sliding_window") is not None and get("use_sliding_window", True) is not False
                               and get("sliding_window") < (get("max_position_embeddings") or 0)),
        }
        for name, bad in refused.items():
            if bad:
                value = partial if name == "partial_rotary_factor" else get(name)
                raise ConfigError(f"{name}={value!r} is not implemented by TinyLlama: the logits would "
                                  "differ from transformers'")
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
            rope_scaling=rope_scaling,
        )

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))
