"""What the KV ledger knows about a model and a GPU: :class:`ModelSpec`, :class:`GPUSpec`, and the
parameter counts of the model families the presets use.

Parameter counts are *computed* from a model's shape (the same count as ``sum(p.numel())`` over
the transformers model, which ``tests/memory/test_presets.py`` checks on the ``meta`` device),
never typed in.  Pure Python.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import ConfigError
from ..validate import count

__all__ = ["GPUSpec", "ModelSpec", "WEIGHT_DTYPE_BITS", "deepseek_v3_num_parameters", "gpt_oss_num_parameters",
           "llama_num_parameters", "opt_num_parameters", "qwen3_moe_num_parameters", "weights_dtype_name"]

# Bits per weight of each dtype the weights may be served in (names are case-insensitive).
WEIGHT_DTYPE_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}


def weights_dtype_name(name) -> str:
    """The canonical (lower-case) name of a weights dtype: ``"BF16"`` gives ``"bf16"``.

    Raises:
        ConfigError: not one of :data:`WEIGHT_DTYPE_BITS`.
    """
    if isinstance(name, str) and name.strip().lower() in WEIGHT_DTYPE_BITS:
        return name.strip().lower()
    raise ConfigError(f"unknown weights dtype {name!r}; known: {', '.join(WEIGHT_DTYPE_BITS)} "
                      "(any case)")


@dataclass(frozen=True)
class ModelSpec:
    """What the KV ledger needs to know about a model (sizes in elements, counts in units).

    Attributes:
        name: display name, e.g. ``"Llama-3-8B"``.
        num_layers: decoder layers L; each holds its own K/V (or latent) cache.
        hidden_size: model width d_model.
        num_heads: query heads H.
        num_kv_heads: key/value heads Hkv (MHA: ``== H``; GQA: fewer; MQA: 1).  For MLA models
            this is the number of heads the latent is expanded to; the cache does not use it.
        head_dim: elements per head D, taken from the config (not always ``hidden_size / H``).
        num_params: parameters, for the weights' memory.
        kv_lora_rank: MLA only (DeepSeek-V2/V3): width of the compressed KV latent ``c_KV``
            cached per token per layer; 0 for ordinary attention.
        qk_rope_head_dim: MLA only: the decoupled RoPE key ``k_R`` cached beside the latent.
        sliding_window: tokens a sliding-window layer attends to (and must keep); ``None``: none.
        sliding_layers: how many of the layers use the sliding window (Mistral-7B-v0.1: all 32;
            Gemma-2: every other one).
        weights_dtype: the dtype the weights are usually served in ("fp16", "bf16", "fp8", ...;
            any case, stored in lower case).
        max_position: the longest context the config declares, in tokens (``None``: unknown).
            The ledger computes any length; figures mark lengths beyond it.
        source: where the numbers come from (Hub repository or paper).
        gathered_params: parameters a decode step *gathers* (B rows) rather than reads whole: an
            untied input embedding table (``vocab x hidden``) and learned position tables (OPT).
            A tied table counts 0 here: the LM head reads it whole every step.  Used by
            :mod:`~paged_kv.memory.decode_cost` for the bytes a decode step reads.

    Sizes may be Python ints or numpy integers (stored as ``int``); bools and floats are refused
    (:class:`~paged_kv.errors.ConfigError`, naming the model and the field).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_params: int
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    sliding_window: int | None = None
    sliding_layers: int = 0
    weights_dtype: str = "bf16"
    max_position: int | None = None
    source: str = ""
    gathered_params: int = 0

    def __post_init__(self) -> None:
        fix = lambda field, value: object.__setattr__(self, field, value)  # frozen dataclass
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "num_params"):
            try:
                fix(field, count(field, getattr(self, field), 1))
            except ConfigError as e:
                raise ConfigError(f"{self.name}: {e}") from None
        for field in ("kv_lora_rank", "qk_rope_head_dim", "sliding_layers", "gathered_params"):
            try:
                fix(field, count(field, getattr(self, field), 0))
            except ConfigError as e:
                raise ConfigError(f"{self.name}: {e}") from None
        for field in ("sliding_window", "max_position"):
            if getattr(self, field) is not None:
                try:
                    fix(field, count(field, getattr(self, field), 1))
                except ConfigError as e:
                    raise ConfigError(f"{self.name}: {e} (or None)") from None
        try:
            fix("weights_dtype", weights_dtype_name(self.weights_dtype))
        except ConfigError as e:
            raise ConfigError(f"{self.name}: {e}") from None
        if self.gathered_params >= self.num_params:
            raise ConfigError(f"{self.name}: gathered_params {self.gathered_params:,} must be below "
                              f"num_params {self.num_params:,}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{self.name}: num_heads {self.num_heads} is not divisible by "
                              f"num_kv_heads {self.num_kv_heads}")
        if self.qk_rope_head_dim and not self.kv_lora_rank:
            raise ConfigError(f"{self.name}: qk_rope_head_dim without kv_lora_rank is not MLA")
        if self.sliding_layers > self.num_layers:
            raise ConfigError(f"{self.name}: sliding_layers must be in [0, {self.num_layers}], "
                              f"got {self.sliding_layers}")
        if (self.sliding_window is None) != (self.sliding_layers == 0):
            raise ConfigError(f"{self.name}: give sliding_window and sliding_layers together "
                              f"(got {self.sliding_window}, {self.sliding_layers})")

    def within_max_context(self, seq_len: int) -> bool:
        """Whether ``seq_len`` tokens fit the context the config declares (True if unknown)."""
        return self.max_position is None or seq_len <= self.max_position

    @property
    def attention_kind(self) -> str:
        """``"MHA"``, ``"GQA"``, ``"MQA"`` or ``"MLA"``."""
        if self.kv_lora_rank:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    def replace(self, **changes) -> "ModelSpec":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_config(cls, cfg, name: str = "custom", weights_dtype: str = "fp16",
                    source: str = "paged_kv.model.ModelConfig") -> "ModelSpec":
        """The spec of a :class:`~paged_kv.model.ModelConfig` (the package's own models)."""
        return cls(name=name, num_layers=cfg.num_layers, hidden_size=cfg.hidden_size,
                   num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                   num_params=cfg.num_parameters(), weights_dtype=weights_dtype,
                   max_position=cfg.max_seq_len, source=source,
                   gathered_params=0 if cfg.tie_embeddings else cfg.vocab_size * cfg.hidden_size)


@dataclass(frozen=True)
class GPUSpec:
    """One GPU: ``memory_bytes`` is the total ``nvidia-smi`` reports (MiB x 2^20), per GPU.

    ``bandwidth`` (bytes/s of HBM/GDDR, decimal, as vendors quote it) and ``peak_flops``
    (dense fp16/bf16 tensor-core FLOP/s, no sparsity) come from the vendor's datasheet
    (``perf_source``); their ratio is the ridge point of the roofline (:func:`~paged_kv.memory.
    decode_cost.ridge_point`).  0 means unknown.
    """

    name: str
    marketed: str
    memory_bytes: int
    source: str = ""
    bandwidth: float = 0.0
    peak_flops: float = 0.0
    perf_source: str = ""


# --- parameter counts (what transformers' model classes hold) -------------------------------
def llama_num_parameters(*, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int,
                         head_dim: int, intermediate: int, tied: bool, qkv_bias: bool = False,
                         qk_norm: bool = False, norms_per_layer: int = 2) -> int:
    """Parameters of a Llama-family decoder (Llama, Mistral, Qwen2/3, Gemma-2): attention
    projections (+ Qwen2's q/k/v biases, + Qwen3's per-head q/k RMSNorms), a SwiGLU MLP, RMSNorm
    weights (Gemma-2 has 4 per layer), the embedding and, unless tied, the output head.

    The one Llama count: the presets' and :meth:`paged_kv.model.ModelConfig.num_parameters`
    (checked against transformers' models on the meta device and against the bundled TinyLlama)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    attn = hidden * q + 2 * hidden * kv + q * hidden
    attn += (q + 2 * kv) if qkv_bias else 0
    attn += 2 * head_dim if qk_norm else 0
    per_layer = attn + 3 * hidden * intermediate + norms_per_layer * hidden
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden


def opt_num_parameters(*, vocab: int, hidden: int, layers: int, ffn: int, max_position: int) -> int:
    """Parameters of an OPT decoder (biases everywhere, LayerNorms with bias, learned positions
    with OPT's offset of 2, output head tied to the embedding)."""
    per_layer = 4 * (hidden * hidden + hidden) + 2 * hidden * ffn + ffn + hidden + 4 * hidden
    return vocab * hidden + (max_position + 2) * hidden + layers * per_layer + 2 * hidden


def deepseek_v3_num_parameters(*, vocab: int, hidden: int, layers: int, heads: int, q_lora_rank: int,
                               kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                               v_head_dim: int, intermediate: int, moe_intermediate: int,
                               n_routed_experts: int, n_shared_experts: int, first_k_dense: int) -> int:
    """Parameters of DeepSeek-V3's main model (MLA attention, ``first_k_dense`` dense MLP layers,
    then MoE layers with a router and its score-correction bias; the multi-token-prediction module
    that the Hub checkpoint adds is not counted, as in the paper's "671B")."""
    qk_head = qk_nope_head_dim + qk_rope_head_dim
    attn = (hidden * q_lora_rank + q_lora_rank + q_lora_rank * heads * qk_head
            + hidden * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank
            + kv_lora_rank * heads * (qk_nope_head_dim + v_head_dim) + heads * v_head_dim * hidden)
    dense = 3 * hidden * intermediate
    moe = ((n_routed_experts + n_shared_experts) * 3 * hidden * moe_intermediate
           + n_routed_experts * hidden + n_routed_experts)
    per_layer_norms = 2 * hidden
    return (2 * vocab * hidden + hidden + layers * (attn + per_layer_norms)
            + first_k_dense * dense + (layers - first_k_dense) * moe)


def qwen3_moe_num_parameters(*, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int,
                             head_dim: int, moe_intermediate: int, n_experts: int) -> int:
    """Parameters of a Qwen3-MoE decoder (Qwen3-30B-A3B and its Coder version): Qwen3's attention
    (no biases, per-head q/k RMSNorms), in every layer a router (``hidden x n_experts``, no bias)
    and ``n_experts`` SwiGLU experts of width ``moe_intermediate``, two RMSNorms a layer, an
    untied embedding and head."""
    q, kv = heads * head_dim, kv_heads * head_dim
    attn = 2 * hidden * q + 2 * hidden * kv + 2 * head_dim
    moe = hidden * n_experts + n_experts * 3 * hidden * moe_intermediate
    return 2 * vocab * hidden + hidden + layers * (attn + moe + 2 * hidden)


def gpt_oss_num_parameters(*, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int,
                           head_dim: int, intermediate: int, n_experts: int) -> int:
    """Parameters of a gpt-oss decoder (OpenAI's gpt-oss-20b/120b): attention projections with
    biases and one learned sink logit per query head, a router with a bias, ``n_experts`` experts
    whose fused gate/up projection (``hidden x 2 intermediate``) and down projection carry biases,
    two RMSNorms a layer, an untied embedding and head."""
    q, kv = heads * head_dim, kv_heads * head_dim
    attn = (hidden * q + q) + 2 * (hidden * kv + kv) + (q * hidden + hidden) + heads
    experts = n_experts * (hidden * 2 * intermediate + 2 * intermediate + intermediate * hidden + hidden)
    router = hidden * n_experts + n_experts
    return 2 * vocab * hidden + hidden + layers * (attn + experts + router + 2 * hidden)
