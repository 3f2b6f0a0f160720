"""What one decode step reads and computes: bytes, FLOPs, arithmetic intensity, the roofline.

A cached decode step feeds one new token to each of ``B`` sequences holding ``t`` cached tokens.
It reads every weight once (**one** read serves all ``B``), except tables it only *gathers* from
(an untied input embedding contributes ``B`` rows, not the table,
:attr:`ModelSpec.gathered_params`; a tied one is read whole by the LM head), and every cached K/V
byte of every sequence once (nothing shared).  So the linear layers' arithmetic intensity grows
with the batch (``~B`` FLOP/byte for 2-byte weights) while attention's stays ``H / Hkv`` (2-byte
cache) whatever the batch: each K/V byte serves its group's query heads and one sequence.  The
roofline (Williams et al. 2009) bounds a step's time from below by
``max(bytes / bandwidth, FLOPs / peak)``.  Sources: the "inference arithmetic" accounting of
Chen (2022, kipp.ly) and Pope et al. 2022 (§2, "Efficiently Scaling Transformer Inference").

The one count of the bytes a step reads, for the presets and for the package's own
:class:`~paged_kv.model.ModelConfig` alike (``tests/memory/test_decode_cost.py`` checks it against
a real TinyLlama's and cache's tensors).  Not modelled: MLA (its decode attention runs on the
latent; :class:`ConfigError`), activation traffic, the ``B`` gathered embedding rows
(``B x hidden x 2`` bytes, negligible), kernels' overheads.

Units: bytes (int), FLOPs (int), seconds, tokens per second.  Legend: B batch, t cached tokens per
sequence, L layers, H query heads, Hkv kv heads, D head_dim.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..validate import count
from .kv_dtype import KVDType
from .ledger import as_spec, kv_cache_bytes, kv_heads_per_gpu
from .presets import gpu_preset
from .spec import WEIGHT_DTYPE_BITS, GPUSpec, weights_dtype_name

__all__ = ["arithmetic_intensity", "step_bytes", "step_flops", "ridge_point",
           "roofline_tokens_per_s", "weights_read_per_step"]


def weights_read_per_step(model, weights_dtype: str | None = None, *, tp: int = 1) -> int:
    """Bytes of weights one decode step reads on each of ``tp`` GPUs: every parameter but the
    gathered ones (:attr:`ModelSpec.gathered_params`), ``ceil(params x bits / 8 / tp)``."""
    spec = as_spec(model)
    bits = WEIGHT_DTYPE_BITS[weights_dtype_name(weights_dtype or spec.weights_dtype)]
    tp = count("tp", tp, 1)
    kv_heads_per_gpu(spec, tp)
    return -(-(spec.num_params - spec.gathered_params) * bits // (8 * tp))


def step_bytes(model, context_len: int, batch_size: int = 1, kv_dtype: str | KVDType = "fp16",
               weights_dtype: str | None = None, *, tp: int = 1) -> dict[str, int]:
    """Bytes one decode step reads on each GPU: ``{"weights": ..., "kv_cache": ...}``.

    ``weights``: :func:`weights_read_per_step` (independent of ``B`` and ``t``).  ``kv_cache``:
    the ``B`` sequences' cache of ``context_len`` tokens each (:func:`kv_cache_bytes`,
    ``2 L Hkv D t B`` elements; sliding windows capped), linear in ``t`` and in ``B``.

    Args:
        model: a :class:`ModelSpec`, a :class:`~paged_kv.model.ModelConfig` or a preset name.
        context_len: cached tokens per sequence (t, >= 0).
        batch_size: sequences decoding together (B, >= 1).
        weights_dtype: ``None``: the spec's serving dtype (a ``ModelConfig``'s: fp16).
    """
    spec = as_spec(model)
    context_len = count("context_len", context_len, 0)
    batch_size = count("batch_size", batch_size, 1)
    return {"weights": weights_read_per_step(spec, weights_dtype, tp=tp),
            "kv_cache": kv_cache_bytes(spec, context_len, batch_size, kv_dtype, tp=tp)}


def step_flops(model, context_len: int, batch_size: int = 1, *, tp: int = 1) -> dict[str, int]:
    """FLOPs of one decode step on each GPU: ``{"linear": ..., "attention": ...}``.

    ``linear = 2 B (params - gathered_params) / tp``: every weight read once per token, the
    RMSNorm weights included (they scale rather than multiply: an over-count of
    ``2 B (2 L + 1) hidden``, under 0.01% for the presets; a spec from shapes alone cannot tell
    them apart).  :func:`paged_kv.decoding.forward_flops` counts the tiny model's matmuls exactly;
    the two differ by that term (tested);
    ``attention = 4 B H D sum_layers(min(t, window)) / tp`` (scores and weighted values of the
    one new query against every cached key of its layer).  MLA is refused (ConfigError): its
    decode attention runs on the latent, which is not modelled here.
    """
    spec = as_spec(model)
    if spec.kv_lora_rank:
        raise ConfigError(f"{spec.name}: decode FLOPs of MLA are not modelled (attention runs on the latent)")
    t = count("context_len", context_len, 0)
    b = count("batch_size", batch_size, 1)
    tp = count("tp", tp, 1)
    kv_heads_per_gpu(spec, tp)
    full = spec.num_layers - spec.sliding_layers
    layer_tokens = full * t + spec.sliding_layers * min(t, spec.sliding_window or 0)
    return {"linear": 2 * b * (spec.num_params - spec.gathered_params) // tp,
            "attention": 4 * b * spec.num_heads * spec.head_dim * layer_tokens // tp}


def arithmetic_intensity(model, context_len: int, batch_size: int = 1, kv_dtype: str | KVDType = "fp16",
                         weights_dtype: str | None = None, *, tp: int = 1) -> dict[str, float]:
    """FLOPs per byte read by one decode step: ``{"linear", "attention", "step"}``.

    ``linear ~ B`` for 2-byte weights (``2 B`` FLOPs per parameter read once);
    ``attention = H / Hkv`` for a 2-byte cache, whatever ``B`` and ``t``;
    ``step``: the whole step (FLOPs over bytes), between the two.  ``context_len`` must be >= 1
    (no cached byte to divide by otherwise).
    """
    count("context_len", context_len, 1)
    f = step_flops(model, context_len, batch_size, tp=tp)
    b = step_bytes(model, context_len, batch_size, kv_dtype, weights_dtype, tp=tp)
    return {"linear": f["linear"] / b["weights"], "attention": f["attention"] / b["kv_cache"],
            "step": (f["linear"] + f["attention"]) / (b["weights"] + b["kv_cache"])}


def _gpu(gpu: str | GPUSpec) -> GPUSpec:
    g = gpu if isinstance(gpu, GPUSpec) else gpu_preset(gpu)
    if not (g.bandwidth > 0 and g.peak_flops > 0):
        raise ConfigError(f"GPU {g.name!r} has no bandwidth/peak FLOP/s (got {g.bandwidth}, {g.peak_flops})")
    return g


def ridge_point(gpu: str | GPUSpec) -> float:
    """FLOP per byte at which a kernel on ``gpu`` turns from memory- to compute-bound:
    ``peak_flops / bandwidth`` (dense fp16/bf16; e.g. ~295 for an H100 SXM)."""
    g = _gpu(gpu)
    return g.peak_flops / g.bandwidth


def roofline_tokens_per_s(model, gpu: str | GPUSpec, context_len: int, batch_size: int = 1,
                          kv_dtype: str | KVDType = "fp16", weights_dtype: str | None = None, *,
                          tp: int = 1) -> float:
    """Upper bound on decode throughput (tokens/s over the batch): ``B / step time`` with the
    step time at least ``max(bytes / bandwidth, FLOPs / peak)`` (the roofline, per GPU of the
    ``tp`` group).  Real engines reach some fraction of it."""
    g = _gpu(gpu)
    nbytes = sum(step_bytes(model, context_len, batch_size, kv_dtype, weights_dtype, tp=tp).values())
    flops = sum(step_flops(model, context_len, batch_size, tp=tp).values())
    return batch_size / max(nbytes / g.bandwidth, flops / g.peak_flops)
