"""The KV-cache memory ledger: bytes per token, per sequence, per GPU; weights; what fits.

Follows the vLLM paper (Kwon et al. 2023, §2-3: "800 KB" per OPT-13B token, Table 1's KV slots)
and how engines lay the cache out: per layer, one K and one V vector of ``head_dim`` elements per
KV head per token (MHA, GQA, MQA), or one compressed latent of ``kv_lora_rank`` plus the
decoupled RoPE key of ``qk_rope_head_dim`` elements (MLA, DeepSeek-V2 §2.1 / V3, no factor 2).
Sliding-window layers keep at most ``sliding_window`` tokens.  Tensor parallelism splits KV heads
over GPUs as vLLM does (each KV head replicated when there are fewer KV heads than GPUs; the MLA
latent is replicated on every GPU).

Units: every function counts **bytes** (an ``int``).  ``GiB`` = 2**30 and ``GB`` = 10**9 are
kept apart wherever a number is printed (:func:`format_bytes`).

Inputs: counts (lengths, batch sizes, ``tp``, bytes) may be Python ints or numpy integers;
bools, floats and strings raise ``ConfigError``, as do dtype names that are not known (names
of KV and weights dtypes are case-insensitive).  A ``tp`` is valid when it splits the query
heads and the KV heads (:func:`kv_heads_per_gpu`); every function that takes ``tp`` applies
that one rule.

Legend: B batch, T tokens, L layers, Hkv kv heads, D head_dim.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from .errors import ConfigError
from .presets import (GPU_PRESETS, MODEL_PRESETS, PAPER_TABLE1, WEIGHT_DTYPE_BITS, GPUSpec,
                      ModelSpec, as_count, gpu_preset, model_preset, weights_dtype_name)

__all__ = [
    "GB", "GiB", "KV_DTYPES", "KVDType", "MODEL_PRESETS", "GPU_PRESETS", "PAPER_TABLE1", "GPUSpec",
    "MemoryPlan", "ModelSpec", "WEIGHT_DTYPE_BITS", "as_spec", "attention_variant", "format_bytes",
    "get_kv_dtype", "gpu_preset", "kv_bytes_per_token", "kv_cache_bytes", "kv_heads_per_gpu",
    "kv_slots", "max_batch_size", "max_tokens", "model_preset", "plan_memory", "tokens_to_reach",
    "weights_bytes",
]

KiB, MiB, GiB = 2**10, 2**20, 2**30
KB, MB, GB = 10**3, 10**6, 10**9


def format_bytes(n: int, unit: str = "both") -> str:
    """``n`` bytes as text.

    ``"both"``: ``"160.00 GiB (171.80 GB)"``; ``"auto"``: the largest binary unit that
    keeps the number >= 1, and its decimal partner: ``"6.13 MiB (6.43 MB)"``; or one
    unit: ``"B"``, ``"KiB"``, ``"MiB"``, ``"GiB"``, ``"KB"``, ``"MB"``, ``"GB"``.
    """
    units = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "KB": KB, "MB": MB, "GB": GB}
    if unit == "auto":
        if abs(n) < KiB:
            return f"{n:,} B"
        pairs = [("GiB", "GB"), ("MiB", "MB"), ("KiB", "KB")]
        binary, decimal = next((b, d) for b, d in pairs if abs(n) >= units[b])
        return f"{n / units[binary]:,.2f} {binary} ({n / units[decimal]:,.2f} {decimal})"
    if unit == "both":
        return f"{n / GiB:,.2f} GiB ({n / GB:,.2f} GB)"
    if unit not in units:
        known = ", ".join(["both", "auto", *units])
        raise ConfigError(f"unknown unit {unit!r}; known: {known}")
    return f"{n:,} B" if unit == "B" else f"{n / units[unit]:,.2f} {unit}"


# --- KV dtypes ------------------------------------------------------------------------------
@dataclass(frozen=True)
class KVDType:
    """How one cached element is stored.

    Attributes:
        name: e.g. ``"fp8"``.
        bits: bits per element (int4: 4, two elements per byte).
        group_size: elements that share one scale (and zero point), counted along one head's
            K or V vector of one token; ``None`` means the whole vector (``head_dim`` elements,
            or the MLA latent), i.e. per-token, per-head quantisation.  Ignored when
            ``scale_bytes`` is 0.
        scale_bytes: metadata bytes per group stored beside the values (0: none per token).

    Raises:
        ConfigError: ``bits < 1``, ``group_size < 1``, ``scale_bytes < 0`` or a non-integer.
    """

    name: str
    bits: int
    group_size: int | None = None
    scale_bytes: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"a KVDType's name must be a non-empty string, got {self.name!r}")
        minimum = {"bits": 1, "group_size": 1, "scale_bytes": 0}
        for field, low in minimum.items():
            value = getattr(self, field)
            if field == "group_size" and value is None:
                continue
            try:
                object.__setattr__(self, field, as_count(field, value, low))
            except ConfigError as e:
                extra = " (or None: one group per vector)" if field == "group_size" else ""
                raise ConfigError(f"KVDType {self.name!r}: {e}{extra}") from None

    def vector_bytes(self, n: int) -> int:
        """Bytes to store one vector of ``n`` elements, its scales included."""
        if (n * self.bits) % 8:
            raise ConfigError(f"{n} elements of {self.bits} bits do not fill whole bytes")
        groups = -(-n // (self.group_size or n)) if self.scale_bytes else 0  # ceil
        return n * self.bits // 8 + groups * self.scale_bytes


# fp8 keeps one fp32 scale per layer for K and one for V (vLLM's per-tensor k_scale/v_scale):
# 8 bytes a layer, not per token, so they do not appear here.  int8 and int4 are assumed to
# store an fp16 scale and an fp16 zero point (4 bytes) per group, one group per head vector.
KV_DTYPES: dict[str, KVDType] = {d.name: d for d in [
    KVDType("fp32", 32), KVDType("fp16", 16), KVDType("bf16", 16),
    KVDType("fp8", 8), KVDType("fp8_e4m3", 8), KVDType("fp8_e5m2", 8),
    KVDType("int8", 8, None, 4), KVDType("int4", 4, None, 4),
]}


def get_kv_dtype(d: str | KVDType) -> KVDType:
    """A :class:`KVDType` from its name (or itself).  Raises ``ConfigError`` on an unknown name."""
    if isinstance(d, KVDType):
        return d
    if isinstance(d, str) and d.lower() in KV_DTYPES:
        return KV_DTYPES[d.lower()]
    raise ConfigError(f"unknown KV dtype {d!r}; known: {', '.join(KV_DTYPES)} (or a KVDType)")


# --- the ledger -----------------------------------------------------------------------------
def as_spec(model) -> ModelSpec:
    """A :class:`ModelSpec` from a spec, a preset name or a :class:`~paged_kv.config.ModelConfig`."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return model_preset(model)
    if hasattr(model, "num_parameters") and hasattr(model, "num_kv_heads"):
        return ModelSpec.from_config(model)
    raise ConfigError(f"expected a ModelSpec, ModelConfig or preset name, got {type(model).__name__}")


_check_count = as_count  # ints and numpy integers; ConfigError naming the value otherwise


def kv_heads_per_gpu(spec: ModelSpec, tp: int = 1) -> int:
    """KV heads each of ``tp`` tensor-parallel GPUs stores (vLLM's rule).

    ``Hkv >= tp``: ``Hkv / tp`` heads each.  ``Hkv < tp``: one head each, every head replicated
    on ``tp / Hkv`` GPUs (e.g. Llama-3.1-405B's 8 KV heads over 16 GPUs: 2 copies of each).
    MLA: the latent is not split by heads; each GPU keeps all of it (returns 1).

    Raises:
        ConfigError: ``tp < 1``, ``num_heads % tp != 0``, or Hkv and tp that divide neither way.
    """
    tp = _check_count("tp", tp, 1)
    if spec.num_heads % tp:
        raise ConfigError(f"{spec.name}: {spec.num_heads} query heads cannot be split over tp={tp} GPUs")
    if spec.kv_lora_rank:
        return 1
    if spec.num_kv_heads >= tp:
        if spec.num_kv_heads % tp:
            raise ConfigError(f"{spec.name}: {spec.num_kv_heads} KV heads cannot be split over tp={tp} GPUs")
        return spec.num_kv_heads // tp
    if tp % spec.num_kv_heads:
        raise ConfigError(f"{spec.name}: {spec.num_kv_heads} KV heads cannot be replicated evenly over tp={tp} GPUs")
    return 1


def kv_bytes_per_token_per_layer(model, kv_dtype: str | KVDType = "fp16", *,
                                 tp: int = 1) -> int:
    """Bytes one token adds to one layer's cache on each GPU.

    ``2 x Hkv x bytes(D)`` (K and V); for MLA, ``bytes(kv_lora_rank + qk_rope_head_dim)``
    (one latent and one RoPE key, no factor 2).
    """
    spec, dt = as_spec(model), get_kv_dtype(kv_dtype)
    heads = kv_heads_per_gpu(spec, tp)
    if spec.kv_lora_rank:
        return dt.vector_bytes(spec.kv_lora_rank + spec.qk_rope_head_dim)
    return 2 * heads * dt.vector_bytes(spec.head_dim)


def kv_bytes_per_token(model, kv_dtype: str | KVDType = "fp16", *, tp: int = 1) -> int:
    """Bytes of KV cache per token over all layers, on each of ``tp`` GPUs.

    ``2 (K and V) x num_layers x num_kv_heads x head_dim x bytes_per_element`` (+ scales for
    int8/int4), with ``head_dim`` from the config.  MLA: ``num_layers x (kv_lora_rank +
    qk_rope_head_dim) x bytes_per_element``.  For sliding-window models this is the rate while
    the sequence is shorter than the window; :func:`kv_cache_bytes` applies the cap.

    Args:
        model: a :class:`ModelSpec`, a :class:`~paged_kv.config.ModelConfig` or a preset name.
        kv_dtype: a name from :data:`KV_DTYPES` or a :class:`KVDType`.
        tp: tensor-parallel degree (see :func:`kv_heads_per_gpu`).
    """
    spec = as_spec(model)
    return spec.num_layers * kv_bytes_per_token_per_layer(spec, kv_dtype, tp=tp)


def kv_cache_bytes(model, seq_len: int, batch_size: int,
                   kv_dtype: str | KVDType = "fp16", *, tp: int = 1) -> int:
    """Bytes of KV cache for ``batch_size`` sequences of ``seq_len`` tokens, on each of
    ``tp`` GPUs.

    Sliding-window layers hold ``min(seq_len, sliding_window)`` tokens (assumes the engine
    frees what falls out of the window, as a ring buffer or vLLM's hybrid allocator does).

    Raises:
        ConfigError: a negative length or batch size, or an impossible ``tp``.
    """
    spec = as_spec(model)
    seq_len = _check_count("seq_len", seq_len)
    batch_size = _check_count("batch_size", batch_size)
    per_layer = kv_bytes_per_token_per_layer(spec, kv_dtype, tp=tp)
    full_layers = spec.num_layers - spec.sliding_layers
    tokens = full_layers * seq_len
    if spec.sliding_layers:
        tokens += spec.sliding_layers * min(seq_len, spec.sliding_window)
    return batch_size * tokens * per_layer


def tokens_to_reach(model, nbytes: int, batch_size: int = 1, kv_dtype: str | KVDType = "fp16",
                    *, tp: int = 1) -> int | None:
    """The shortest context (tokens per sequence) at which the KV cache of ``batch_size``
    sequences holds at least ``nbytes`` per GPU; ``None`` if it never does (every layer slides,
    and the window caps the cache below ``nbytes``).  E.g. where the cache equals the weights.

    Raises:
        ConfigError: a negative ``nbytes``, ``batch_size < 1``, or an impossible ``tp``.
    """
    spec = as_spec(model)
    nbytes = _check_count("nbytes", nbytes)
    batch_size = _check_count("batch_size", batch_size, 1)
    size = lambda t: kv_cache_bytes(spec, t, batch_size, kv_dtype, tp=tp)
    full_layers = spec.num_layers - spec.sliding_layers
    if full_layers:  # grows without bound: this many tokens on the full layers alone suffice
        per_layer = kv_bytes_per_token_per_layer(spec, kv_dtype, tp=tp)
        hi = -(-nbytes // (batch_size * full_layers * per_layer))
    else:
        hi = spec.sliding_window
        if size(hi) < nbytes:
            return None
    lo = 0
    while lo < hi:  # the cache grows monotonically with the context: bisect
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if size(mid) >= nbytes else (mid + 1, hi)
    return lo


def kv_slots(model, kv_bytes: int, kv_dtype: str | KVDType = "fp16", *, tp: int = 1) -> int:
    """How many tokens (the paper's "KV cache slots") fit in ``kv_bytes`` per GPU."""
    return _check_count("kv_bytes", kv_bytes) // kv_bytes_per_token(model, kv_dtype, tp=tp)


def weights_bytes(model, weights_dtype: str | None = None, *, tp: int = 1) -> int:
    """Bytes of weights on each of ``tp`` GPUs: ``ceil(num_params x bits / 8 / tp)`` (an
    estimate: real checkpoints keep some tensors in higher precision and quantised ones add
    scales).  ``weights_dtype`` (any case) defaults to the model's serving dtype.

    Raises:
        ConfigError: an unknown dtype, or a ``tp`` that :func:`kv_heads_per_gpu` refuses (the
            same rule as the KV cache: tensor parallelism splits the attention heads).
    """
    spec = as_spec(model)
    bits = WEIGHT_DTYPE_BITS[weights_dtype_name(weights_dtype or spec.weights_dtype)]
    tp = _check_count("tp", tp, 1)
    kv_heads_per_gpu(spec, tp)  # one rule for a valid tp, weights and cache alike
    return -(-spec.num_params * bits // (8 * tp))  # ceil, in exact integers


def attention_variant(model, kind: str, num_kv_heads: int = 8) -> ModelSpec:
    """The same model with another attention: ``"MHA"`` (Hkv = H), ``"GQA"`` (``num_kv_heads``),
    ``"MQA"`` (Hkv = 1) or ``"MLA"`` with DeepSeek-V2's sizes for its head_dim
    (``kv_lora_rank = 4 D``, ``qk_rope_head_dim = D / 2``, DeepSeek-V2 paper §2.1.2)."""
    spec = as_spec(model)
    base = dict(kv_lora_rank=0, qk_rope_head_dim=0, name=f"{spec.name} ({kind})")
    kind = kind.upper()
    if kind == "MHA":
        return spec.replace(num_kv_heads=spec.num_heads, **base)
    if kind == "GQA":
        return spec.replace(num_kv_heads=num_kv_heads, **base)
    if kind == "MQA":
        return spec.replace(num_kv_heads=1, **base)
    if kind == "MLA":
        return spec.replace(num_kv_heads=spec.num_heads, name=base["name"],
                            kv_lora_rank=4 * spec.head_dim, qk_rope_head_dim=spec.head_dim // 2)
    raise ConfigError(f"unknown attention kind {kind!r}; known: MHA, GQA, MQA, MLA")


# --- what fits on a GPU -----------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryPlan:
    """The memory of one GPU of a ``tp``-GPU group serving ``model`` (all bytes are per GPU).

    ``kv_budget_bytes = gpu_bytes - reserve_bytes - weights_bytes`` (0 if the weights do not
    fit); ``max_tokens`` and ``max_batch_size`` are what that budget holds.
    """

    model: str
    gpu: str
    tp: int
    seq_len: int
    batch_size: int
    kv_dtype: str
    weights_dtype: str
    gpu_bytes: int
    weights_bytes: int
    reserve_bytes: int
    kv_budget_bytes: int
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int
    kv_bytes: int
    max_tokens: int
    max_batch_size: int
    max_position: int | None = None

    @property
    def within_max_context(self) -> bool:
        """Whether ``seq_len`` is within the model's declared maximum context (True if unknown)."""
        return self.max_position is None or self.seq_len <= self.max_position

    @property
    def weights_fit(self) -> bool:
        return self.weights_bytes + self.reserve_bytes <= self.gpu_bytes

    @property
    def fits(self) -> bool:
        """Whether the weights and ``batch_size`` sequences of ``seq_len`` tokens fit."""
        return self.weights_fit and self.batch_size <= self.max_batch_size

    @property
    def kv_fraction(self) -> float:
        """The requested batch's KV cache as a fraction of the GPU's memory."""
        return self.kv_bytes / self.gpu_bytes

    def summary(self) -> str:
        """A few lines (under 90 characters) for people; GiB and GB side by side."""
        lines = [
            f"{self.model} on {self.tp} x {self.gpu}, KV in {self.kv_dtype}, "
            f"weights in {self.weights_dtype} (per GPU):",
            f"  GPU memory        {format_bytes(self.gpu_bytes)}",
            f"  weights           {format_bytes(self.weights_bytes)}",
            f"  reserve           {format_bytes(self.reserve_bytes)}",
            f"  KV budget         {format_bytes(self.kv_budget_bytes)}",
            f"  KV per token      {self.kv_bytes_per_token:,} B",
            f"  KV, {self.batch_size:,} x {self.seq_len:,} tokens  {format_bytes(self.kv_bytes)} "
            f"= {self.kv_fraction:.1%} of the GPU",
            f"  max tokens        {self.max_tokens:,}",
            f"  max batch         {self.max_batch_size:,} sequences of {self.seq_len:,} tokens",
        ]
        if not self.weights_fit:
            lines.append("  the weights alone do not fit")
        if not self.within_max_context:
            lines.append(f"  note: {self.seq_len:,} tokens is beyond the model's maximum context "
                         f"({self.max_position:,})")
        return "\n".join(lines)


def plan_memory(model, gpu: str | GPUSpec, seq_len: int, batch_size: int = 1,
                kv_dtype: str | KVDType = "fp16", weights_dtype: str | None = None, *, tp: int = 1,
                reserve_fraction: float = 0.10, block_size: int | None = None) -> MemoryPlan:
    """Size the KV cache of ``model`` on ``tp`` GPUs of type ``gpu``.

    Args:
        seq_len, batch_size: the workload (tokens per sequence, sequences).
        reserve_fraction: share of each GPU kept for activations, the CUDA context and allocator
            slack.  0.10 matches vLLM's default ``gpu_memory_utilization=0.9`` (vLLM also
            subtracts the activation peak it profiles; we fold that into the reserve).
        block_size: if given, each sequence takes whole blocks of this many tokens (paging).

    ``seq_len`` may exceed the model's ``max_position`` (the plan says so:
    :attr:`MemoryPlan.within_max_context`); the arithmetic does not depend on it.

    Raises:
        ConfigError: impossible sizes, tp, dtype or reserve; UnknownPresetError: unknown names.
    """
    spec = as_spec(model)
    gpu = gpu if isinstance(gpu, GPUSpec) else gpu_preset(gpu)
    seq_len = _check_count("seq_len", seq_len, 1)
    batch_size = _check_count("batch_size", batch_size)
    tp = _check_count("tp", tp, 1)
    if (isinstance(reserve_fraction, bool) or not isinstance(reserve_fraction, numbers.Real)
            or not 0 <= reserve_fraction < 1):
        raise ConfigError(f"reserve_fraction must be a number in [0, 1), got {reserve_fraction!r}")
    if block_size is not None:
        block_size = _check_count("block_size", block_size, 1)
    dt = get_kv_dtype(kv_dtype)
    weights_dtype = weights_dtype_name(weights_dtype or spec.weights_dtype)
    w = weights_bytes(spec, weights_dtype, tp=tp)
    reserve = int(gpu.memory_bytes * reserve_fraction)
    budget = max(0, gpu.memory_bytes - reserve - w)
    per_token = kv_bytes_per_token(spec, dt, tp=tp)
    stored_len = seq_len if block_size is None else math.ceil(seq_len / block_size) * block_size
    per_seq = kv_cache_bytes(spec, stored_len, 1, dt, tp=tp)
    tokens = budget // per_token if block_size is None else budget // (per_token * block_size) * block_size
    return MemoryPlan(
        model=spec.name, gpu=gpu.name, tp=tp, seq_len=seq_len, batch_size=batch_size, kv_dtype=dt.name,
        weights_dtype=weights_dtype, gpu_bytes=gpu.memory_bytes, weights_bytes=w, reserve_bytes=reserve,
        kv_budget_bytes=budget, kv_bytes_per_token=per_token, kv_bytes_per_sequence=per_seq,
        kv_bytes=batch_size * per_seq, max_tokens=tokens, max_batch_size=budget // per_seq,
        max_position=spec.max_position)


def max_batch_size(model, gpu: str | GPUSpec, seq_len: int, kv_dtype: str | KVDType = "fp16",
                   **kwargs) -> int:
    """Sequences of ``seq_len`` tokens whose KV cache fits next to the weights (0: none; see
    :func:`plan_memory` for the keyword arguments)."""
    return plan_memory(model, gpu, seq_len, 1, kv_dtype, **kwargs).max_batch_size


def max_tokens(model, gpu: str | GPUSpec, kv_dtype: str | KVDType = "fp16", **kwargs) -> int:
    """Token slots that fit in the KV budget of each GPU (see :func:`plan_memory`)."""
    return plan_memory(model, gpu, 1, 1, kv_dtype, **kwargs).max_tokens
