"""The KV-cache memory ledger: bytes per token, per sequence, per GPU; weights; what fits.

Follows the vLLM paper (Kwon et al. 2023, §2-3: "800 KB" per OPT-13B token, Table 1's KV slots)
and how engines lay the cache out: per layer, one K and one V vector of ``head_dim`` elements per
KV head per token (MHA, GQA, MQA), or one compressed latent of ``kv_lora_rank`` plus the
decoupled RoPE key of ``qk_rope_head_dim`` elements (MLA, DeepSeek-V2 §2.1 / V3, no factor 2).
Sliding-window layers keep at most ``sliding_window`` tokens, or, paged, whole blocks
(:mod:`~paged_kv.memory.window`, vLLM v1's rule).  Tensor parallelism splits KV heads
over GPUs as vLLM does (each KV head replicated when there are fewer KV heads than GPUs; the MLA
latent is replicated on every GPU).  Pipeline parallelism (``pp`` stages) splits the *layers*:
each GPU holds its stage's layers whole, so nothing is replicated; the ledger sizes the busiest
stage, ``ceil(L / pp)`` layers (full and sliding-window layers split alike).

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

from ..errors import ConfigError
from ..validate import count
from .kv_dtype import KVDType, get_kv_dtype
from .presets import model_preset
from .spec import WEIGHT_DTYPE_BITS, ModelSpec, weights_dtype_name
from .window import window_peak_blocks

__all__ = ["as_spec", "attention_variant", "budget_range_for_slots", "layers_per_stage", "kv_bytes_per_token", "kv_bytes_per_token_per_layer", "kv_cache_bytes",
           "kv_heads_per_gpu", "kv_slots", "tokens_to_reach", "weights_bytes"]


def as_spec(model) -> ModelSpec:
    """A :class:`ModelSpec` from a spec, a preset name or a :class:`~paged_kv.model.ModelConfig`."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return model_preset(model)
    if hasattr(model, "num_parameters") and hasattr(model, "num_kv_heads"):
        return ModelSpec.from_config(model)
    raise ConfigError(f"expected a ModelSpec, ModelConfig or preset name, got {type(model).__name__}")


def kv_heads_per_gpu(spec: ModelSpec, tp: int = 1) -> int:
    """KV heads each of ``tp`` tensor-parallel GPUs stores (vLLM's rule).

    ``Hkv >= tp``: ``Hkv / tp`` heads each.  ``Hkv < tp``: one head each, every head replicated
    on ``tp / Hkv`` GPUs (e.g. Llama-3.1-405B's 8 KV heads over 16 GPUs: 2 copies of each).
    MLA: the latent is not split by heads; each GPU keeps all of it (returns 1).

    Raises:
        ConfigError: ``tp < 1``, ``num_heads % tp != 0``, or Hkv and tp that divide neither way.
    """
    tp = count("tp", tp, 1)
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


def layers_per_stage(spec: ModelSpec, pp: int = 1) -> tuple[int, int]:
    """``(full, sliding)`` layers the busiest of ``pp`` pipeline stages holds:
    ``ceil(full / pp)`` and ``ceil(sliding / pp)`` (Llama-3.1-405B's 126 layers over 2 stages: 63).

    Raises:
        ConfigError: ``pp < 1`` or more stages than layers.
    """
    pp = count("pp", pp, 1)
    if pp > spec.num_layers:
        raise ConfigError(f"{spec.name}: {spec.num_layers} layers cannot fill pp={pp} pipeline stages")
    full = spec.num_layers - spec.sliding_layers
    return -(-full // pp), -(-spec.sliding_layers // pp)


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


def kv_bytes_per_token(model, kv_dtype: str | KVDType = "fp16", *, tp: int = 1, pp: int = 1) -> int:
    """Bytes of KV cache per token over all layers (of the busiest of ``pp`` pipeline stages), on
    each of the ``tp`` GPUs of a stage.

    ``2 (K and V) x num_layers x num_kv_heads x head_dim x bytes_per_element`` (+ scales for
    int8/int4), with ``head_dim`` from the config.  MLA: ``num_layers x (kv_lora_rank +
    qk_rope_head_dim) x bytes_per_element``.  For sliding-window models this is the rate while
    the sequence is shorter than the window; :func:`kv_cache_bytes` applies the cap.

    Args:
        model: a :class:`ModelSpec`, a :class:`~paged_kv.model.ModelConfig` or a preset name.
        kv_dtype: a name from :data:`KV_DTYPES` or a :class:`KVDType`.
        tp: tensor-parallel degree (see :func:`kv_heads_per_gpu`).
        pp: pipeline stages (see :func:`layers_per_stage`).
    """
    spec = as_spec(model)
    return sum(layers_per_stage(spec, pp)) * kv_bytes_per_token_per_layer(spec, kv_dtype, tp=tp)


def kv_cache_bytes(model, seq_len: int, batch_size: int,
                   kv_dtype: str | KVDType = "fp16", *, tp: int = 1, pp: int = 1,
                   block_size: int | None = None) -> int:
    """Bytes of KV cache for ``batch_size`` sequences of ``seq_len`` tokens, on each of
    ``tp`` GPUs.

    Without ``block_size`` (an unpaged count, per token): sliding-window layers hold
    ``min(seq_len, sliding_window)`` tokens (assumes the engine frees what falls out of the
    window, as a ring buffer does).

    With ``block_size`` (paging): every layer holds whole blocks of ``block_size`` tokens, a full
    layer ``ceil(seq_len / BS)``, a sliding layer the most it holds at any length up to
    ``seq_len`` when vLLM v1's manager frees the blocks wholly outside the window
    (:func:`~paged_kv.memory.window.window_peak_blocks`, ``ceil(min(T, W + BS - 1) / BS)``): the
    bytes a pool must set aside for the sequences to reach ``seq_len``.

    Raises:
        ConfigError: a negative length or batch size, a block size below 1, or an impossible ``tp``.
    """
    spec = as_spec(model)
    seq_len = count("seq_len", seq_len, 0)
    batch_size = count("batch_size", batch_size, 0)
    per_layer = kv_bytes_per_token_per_layer(spec, kv_dtype, tp=tp)
    full_layers, sliding_layers = layers_per_stage(spec, pp)
    if block_size is not None:
        bs = count("block_size", block_size, 1)
        blocks = full_layers * -(-seq_len // bs)
        if sliding_layers:
            blocks += sliding_layers * window_peak_blocks(seq_len, spec.sliding_window, bs)
        return batch_size * blocks * bs * per_layer
    tokens = full_layers * seq_len
    if sliding_layers:
        tokens += sliding_layers * min(seq_len, spec.sliding_window)
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
    nbytes = count("nbytes", nbytes, 0)
    batch_size = count("batch_size", batch_size, 1)
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


def kv_slots(model, kv_bytes: int, kv_dtype: str | KVDType = "fp16", *, tp: int = 1, pp: int = 1) -> int:
    """How many tokens (the paper's "KV cache slots") fit in ``kv_bytes`` per GPU."""
    return count("kv_bytes", kv_bytes, 0) // kv_bytes_per_token(model, kv_dtype, tp=tp, pp=pp)


def budget_range_for_slots(model, printed: str, kv_dtype: str | KVDType = "fp16", *,
                           tp: int = 1) -> tuple[int, int]:
    """The KV budgets (bytes per GPU, ``[low, high)``) whose slot count prints as ``printed``.

    ``printed`` is a count rounded as a paper prints it: ``"9.7K"`` stands for any count in
    ``[9,650, 9,750)``, ``"15.7K"`` for ``[15,650, 15,750)``, ``"512"`` for exactly 512.  E.g. the
    vLLM paper's OPT-66B row (Table 1, "9.7K" slots, "21 GB"): 21.20-21.42 GiB.

    Raises:
        ConfigError: a ``printed`` that is not a decimal number with an optional ``K``/``M``.
    """
    text = printed.strip() if isinstance(printed, str) else ""
    scale = {"K": 1000, "M": 10**6}.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale > 1 else text
    try:
        value = float(digits)
    except ValueError:
        raise ConfigError(f"printed must look like '9.7K', '60.1K' or '512', got {printed!r}") from None
    decimals = len(digits.partition(".")[2])
    half = scale * 10 ** -decimals / 2
    low, high = math.ceil(value * scale - half), math.ceil(value * scale + half)
    per_token = kv_bytes_per_token(model, kv_dtype, tp=tp)
    return low * per_token, high * per_token


def weights_bytes(model, weights_dtype: str | None = None, *, tp: int = 1, pp: int = 1) -> int:
    """Bytes of weights on each of ``tp x pp`` GPUs: ``ceil(num_params x bits / 8 / (tp pp))`` (an
    estimate: real checkpoints keep some tensors in higher precision and quantised ones add
    scales; pipeline stages also differ by the embedding and the head).  ``weights_dtype`` (any
    case) defaults to the model's serving dtype.

    Raises:
        ConfigError: an unknown dtype, or a ``tp`` that :func:`kv_heads_per_gpu` refuses (the
            same rule as the KV cache: tensor parallelism splits the attention heads).
    """
    spec = as_spec(model)
    bits = WEIGHT_DTYPE_BITS[weights_dtype_name(weights_dtype or spec.weights_dtype)]
    tp = count("tp", tp, 1)
    kv_heads_per_gpu(spec, tp)  # one rule for a valid tp, weights and cache alike
    pp = count("pp", pp, 1)
    layers_per_stage(spec, pp)
    return -(-spec.num_params * bits // (8 * tp * pp))  # ceil, in exact integers


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
