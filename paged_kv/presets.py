"""Model and GPU presets for the KV-cache ledger (:mod:`paged_kv.memory`), each with its source.

Model shapes are copied from each model's public ``config.json`` on the Hugging Face Hub (the
repository is named in :attr:`ModelSpec.source`), except OPT-175B, whose weights were never put
on the Hub: its shape is Table 1 of the OPT paper (Zhang et al. 2022).  Parameter counts are
*computed* from the shape (the same count as ``sum(p.numel())`` over the transformers model, which
``tests/test_memory_presets.py`` checks on the ``meta`` device), never typed in.  The book's own
model (``"tiny"``) is read from ``paged_kv/weights/config.json``.

GPU memory follows what ``nvidia-smi`` reports as "total" for each card (with ECC on, the
data-centre default), in MiB; the marketing name ("16 GB", "141 GB") is kept beside it.  Vendor
"GB" here is neither 10^9 nor exact: an "80 GB" A100 shows 81,920 MiB = exactly 80 GiB, an
"80 GB" H100 shows 81,559 MiB (79.6 GiB), a "16 GB" T4 shows 15,360 MiB (15.0 GiB: ECC takes
1/16 of its 16 GiB of GDDR6) and a "141 GB" H200 shows 143,771 MiB (140.4 GiB).  PyTorch's
``torch.cuda.get_device_properties(0).total_memory`` is a little lower still (e.g. ~14.7 GiB on
Colab's T4), because the driver keeps some for itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ._validate import count
from .errors import ConfigError, UnknownPresetError

MiB = 2**20

# Bits per weight of each dtype the weights may be served in (names are case-insensitive).
WEIGHT_DTYPE_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}


def as_count(name: str, value, minimum: int = 0) -> int:
    """``value`` as a Python ``int`` >= ``minimum`` (see :func:`paged_kv._validate.count`)."""
    return count(name, value, minimum)


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

    Sizes may be Python ints or numpy integers (stored as ``int``); bools and floats are refused.

    Raises:
        ConfigError: a non-positive or non-integer size, ``num_heads % num_kv_heads != 0``, an
            unknown weights dtype, or an inconsistent MLA / sliding-window setting.
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

    def __post_init__(self) -> None:
        fix = lambda field, value: object.__setattr__(self, field, value)  # frozen dataclass
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "num_params"):
            try:
                fix(field, as_count(field, getattr(self, field), 1))
            except ConfigError as e:
                raise ConfigError(f"{self.name}: {e}") from None
        for field in ("kv_lora_rank", "qk_rope_head_dim", "sliding_layers"):
            try:
                fix(field, as_count(field, getattr(self, field), 0))
            except ConfigError as e:
                raise ConfigError(f"{self.name}: {e}") from None
        for field in ("sliding_window", "max_position"):
            if getattr(self, field) is not None:
                try:
                    fix(field, as_count(field, getattr(self, field), 1))
                except ConfigError as e:
                    raise ConfigError(f"{self.name}: {e} (or None)") from None
        try:
            fix("weights_dtype", weights_dtype_name(self.weights_dtype))
        except ConfigError as e:
            raise ConfigError(f"{self.name}: {e}") from None
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
                    source: str = "paged_kv.config.ModelConfig") -> "ModelSpec":
        """The spec of a :class:`~paged_kv.config.ModelConfig` (the package's own models)."""
        return cls(name=name, num_layers=cfg.num_layers, hidden_size=cfg.hidden_size,
                   num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                   num_params=cfg.num_parameters(), weights_dtype=weights_dtype,
                   max_position=cfg.max_seq_len, source=source)


@dataclass(frozen=True)
class GPUSpec:
    """One GPU: ``memory_bytes`` is the total ``nvidia-smi`` reports (MiB x 2^20), per GPU."""

    name: str
    marketed: str
    memory_bytes: int
    source: str = ""


# --- parameter counts (what transformers' model classes hold) -------------------------------
def llama_num_parameters(*, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int,
                         head_dim: int, intermediate: int, tied: bool, qkv_bias: bool = False,
                         qk_norm: bool = False, norms_per_layer: int = 2) -> int:
    """Parameters of a Llama-family decoder (Llama, Mistral, Qwen2/3, Gemma-2): attention
    projections (+ Qwen2's q/k/v biases, + Qwen3's per-head q/k RMSNorms), a SwiGLU MLP, RMSNorm
    weights (Gemma-2 has 4 per layer), the embedding and, unless tied, the output head."""
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


# --- the presets --------------------------------------------------------------------------
def _llama(name, source, *, layers, hidden, heads, kv_heads, intermediate, vocab, max_position,
           head_dim=None, tied=False, weights_dtype="bf16", qkv_bias=False, qk_norm=False,
           norms_per_layer=2, sliding_window=None, sliding_layers=0) -> ModelSpec:
    head_dim = head_dim or hidden // heads
    params = llama_num_parameters(vocab=vocab, hidden=hidden, layers=layers, heads=heads,
                                  kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate,
                                  tied=tied, qkv_bias=qkv_bias, qk_norm=qk_norm,
                                  norms_per_layer=norms_per_layer)
    return ModelSpec(name, layers, hidden, heads, kv_heads, head_dim, params,
                     sliding_window=sliding_window, sliding_layers=sliding_layers,
                     weights_dtype=weights_dtype, max_position=max_position, source=source)


def _opt(name, source, *, layers, hidden, heads, ffn) -> ModelSpec:
    params = opt_num_parameters(vocab=50272, hidden=hidden, layers=layers, ffn=ffn, max_position=2048)
    return ModelSpec(name, layers, hidden, heads, heads, hidden // heads, params,
                     weights_dtype="fp16", max_position=2048, source=source)


_DEEPSEEK_V3 = dict(vocab=129280, hidden=7168, layers=61, heads=128, q_lora_rank=1536, kv_lora_rank=512,
                    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, intermediate=18432,
                    moe_intermediate=2048, n_routed_experts=256, n_shared_experts=1, first_k_dense=3)

_PUBLIC_MODELS = [
    _opt("OPT-13B", "facebook/opt-13b", layers=40, hidden=5120, heads=40, ffn=20480),
    _opt("OPT-66B", "facebook/opt-66b", layers=64, hidden=9216, heads=72, ffn=36864),
    _opt("OPT-175B", "OPT paper (Zhang et al. 2022), Table 1; not on the Hub",
         layers=96, hidden=12288, heads=96, ffn=49152),
    _llama("Llama-2-7B", "meta-llama/Llama-2-7b-hf", layers=32, hidden=4096, heads=32, kv_heads=32,
           intermediate=11008, vocab=32000, max_position=4096, weights_dtype="fp16"),
    _llama("Llama-2-13B", "meta-llama/Llama-2-13b-hf", layers=40, hidden=5120, heads=40, kv_heads=40,
           intermediate=13824, vocab=32000, max_position=4096, weights_dtype="fp16"),
    _llama("Llama-2-70B", "meta-llama/Llama-2-70b-hf", layers=80, hidden=8192, heads=64, kv_heads=8,
           intermediate=28672, vocab=32000, max_position=4096, weights_dtype="fp16"),
    _llama("Llama-3-8B", "meta-llama/Meta-Llama-3-8B", layers=32, hidden=4096, heads=32, kv_heads=8,
           intermediate=14336, vocab=128256, max_position=8192),
    _llama("Llama-3-70B", "meta-llama/Meta-Llama-3-70B", layers=80, hidden=8192, heads=64, kv_heads=8,
           intermediate=28672, vocab=128256, max_position=8192),
    _llama("Llama-3.1-405B", "meta-llama/Llama-3.1-405B", layers=126, hidden=16384, heads=128,
           kv_heads=8, intermediate=53248, vocab=128256, max_position=131072),
    _llama("Mistral-7B", "mistralai/Mistral-7B-v0.1", layers=32, hidden=4096, heads=32, kv_heads=8,
           intermediate=14336, vocab=32000, max_position=32768, sliding_window=4096, sliding_layers=32),
    _llama("Gemma-2-9B", "google/gemma-2-9b", layers=42, hidden=3584, heads=16, kv_heads=8, head_dim=256,
           intermediate=14336, vocab=256000, max_position=8192, tied=True, norms_per_layer=4,
           sliding_window=4096, sliding_layers=21),
    _llama("Qwen2.5-72B", "Qwen/Qwen2.5-72B", layers=80, hidden=8192, heads=64, kv_heads=8,
           intermediate=29568, vocab=152064, max_position=131072, qkv_bias=True),
    _llama("Qwen3-4B", "Qwen/Qwen3-4B", layers=36, hidden=2560, heads=32, kv_heads=8, head_dim=128,
           intermediate=9728, vocab=151936, max_position=40960, tied=True, qk_norm=True),
    ModelSpec("DeepSeek-V3", num_layers=61, hidden_size=7168, num_heads=128, num_kv_heads=128,
              head_dim=128, num_params=deepseek_v3_num_parameters(**_DEEPSEEK_V3),
              kv_lora_rank=512, qk_rope_head_dim=64, weights_dtype="fp8", max_position=163840,
              source="deepseek-ai/DeepSeek-V3"),
]

GPU_PRESETS: dict[str, GPUSpec] = {g.name: g for g in [
    GPUSpec("T4", "16 GB", 15360 * MiB, "nvidia-smi on a Tesla T4 (ECC on), e.g. Colab"),
    GPUSpec("A100-40GB", "40 GB", 40960 * MiB, "nvidia-smi on an A100-SXM4-40GB"),
    GPUSpec("A100-80GB", "80 GB", 81920 * MiB, "nvidia-smi on an A100-SXM4-80GB"),
    GPUSpec("H100-80GB", "80 GB", 81559 * MiB, "nvidia-smi on an H100 80GB HBM3 (SXM)"),
    GPUSpec("H200", "141 GB", 143771 * MiB, "nvidia-smi on an H200 (SXM)"),
]}


def tiny_spec() -> ModelSpec:
    """The book's own model, read from the bundled ``paged_kv/weights/config.json``; until the
    weights are there, from :class:`~paged_kv.config.ModelConfig`'s defaults."""
    from .checkpoint import CONFIG_FILE, weights_dir
    from .config import ModelConfig

    path = weights_dir() / CONFIG_FILE
    if path.is_file():
        return ModelSpec.from_config(ModelConfig.from_json(path), name="tiny", source="paged_kv/weights/config.json")
    return ModelSpec.from_config(ModelConfig(), name="tiny", source="ModelConfig() defaults (no bundled weights yet)")


MODEL_PRESETS: dict[str, ModelSpec] = {"tiny": tiny_spec(), **{m.name: m for m in _PUBLIC_MODELS}}


def _lookup(table: dict, name: str, what: str):
    if not isinstance(name, str):
        raise UnknownPresetError(f"{what} preset names are strings, got {name!r}")
    for key, value in table.items():
        if key.lower() == name.strip().lower():
            return key, value
    raise UnknownPresetError(f"unknown {what} preset {name!r}; known: {', '.join(table)}")


def model_preset(name: str) -> ModelSpec:
    """The :class:`ModelSpec` named ``name`` (case-insensitive), e.g. ``"llama-3-8b"``.

    ``"tiny"`` is re-read from the bundled config on every call.

    Raises:
        UnknownPresetError: the name is not a preset; the message lists the known ones.
    """
    key, spec = _lookup(MODEL_PRESETS, name, "model")
    return tiny_spec() if key == "tiny" else spec


def gpu_preset(name: str) -> GPUSpec:
    """The :class:`GPUSpec` named ``name`` (case-insensitive): T4, A100-40GB, A100-80GB,
    H100-80GB, H200.  ``"A100"`` and ``"H100"`` mean their 80 GB versions.

    Raises:
        UnknownPresetError: the name is not a preset; the message lists the known ones.
    """
    aliases = {"a100": "A100-80GB", "h100": "H100-80GB"}
    name = aliases.get(name.strip().lower(), name) if isinstance(name, str) else name
    return _lookup(GPU_PRESETS, name, "GPU")[1]


# The vLLM paper's Table 1 as printed (Kwon et al. 2023, SOSP): model, GPUs, the memory it gives
# to the KV cache, and the "max. # KV cache slots" it prints.  Chapter 3 recomputes the slots.
PAPER_TABLE1 = [
    {"model": "OPT-13B", "gpus": "1 x A100 (40 GB)", "tp": 1, "kv_gb": 12, "slots_printed": "15.7K"},
    {"model": "OPT-66B", "gpus": "4 x A100 (40 GB)", "tp": 4, "kv_gb": 21, "slots_printed": "9.7K"},
    {"model": "OPT-175B", "gpus": "8 x A100-80GB", "tp": 8, "kv_gb": 264, "slots_printed": "60.1K"},
]
