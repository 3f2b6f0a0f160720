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

Two more questions the same counts answer.  :func:`step_time`: the two lower bounds on one step's
time (FLOPs / peak and bytes / bandwidth), for a cached decode step or a recompute step (chapter
1's: the whole sequence fed again, the weights read once, no cache).
:func:`max_decode_throughput`: the roofline at the largest batch whose KV cache fits
(:func:`~paged_kv.memory.plan.max_batch_size`), the *memory wall*: a larger batch would raise the
bound, but it does not fit (chapter 2).  :class:`IterationTime`: a serving step's time as a
line in the tokens it reads and prefills, from the same roofline (the simulator's and the timing
engine's clock, chapter 7; here, below both, so the browser build has it without numpy).

Units: bytes (int), FLOPs (int), seconds, tokens per second.  Legend: B batch, t cached tokens per
sequence, L layers, H query heads, Hkv kv heads, D head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..defaults import RESERVE_FRACTION
from ..errors import ConfigError
from ..validate import count, real
from .kv_dtype import KVDType
from .ledger import as_spec, kv_cache_bytes, kv_heads_per_gpu
from .plan import max_batch_size
from .presets import gpu_preset
from .spec import WEIGHT_DTYPE_BITS, GPUSpec, weights_dtype_name

__all__ = ["DecodeCeiling", "IterationTime", "StepTime", "arithmetic_intensity", "generation_time", "max_decode_throughput", "step_bytes",
           "step_flops", "step_time", "ridge_point", "roofline_tokens_per_s", "weights_read_per_step"]


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


def step_flops(model, context_len: int, batch_size: int = 1, *, tp: int = 1,
               recompute: bool = False) -> dict[str, int]:
    """FLOPs of one decode step on each GPU: ``{"linear": ..., "attention": ...}``.

    ``linear = 2 B (params - gathered_params) / tp``: every weight read once per token, the
    RMSNorm weights included (they scale rather than multiply: an over-count of
    ``2 B (2 L + 1) hidden``, under 0.01% for the presets; a spec from shapes alone cannot tell
    them apart).  :func:`paged_kv.decoding.forward_flops` counts the tiny model's matmuls exactly;
    the two differ by that term (tested);
    ``attention = 4 B H D sum_layers(min(t, window)) / tp`` (scores and weighted values of the
    one new query against every cached key of its layer).  MLA is refused (ConfigError): its
    decode attention runs on the latent, which is not modelled here.

    ``recompute=True``: chapter 1's step without a cache, which feeds all ``t = context_len``
    tokens again: ``linear = 2 B t (params - gathered_params) / tp`` and ``attention =
    4 B L H D t^2 / tp``, the full masked ``t x t`` score matrix on every layer (what the torch
    path computes, :func:`paged_kv.decoding.attention_flops`; a causal kernel does about half;
    sliding windows are not applied).
    """
    spec = as_spec(model)
    if spec.kv_lora_rank:
        raise ConfigError(f"{spec.name}: decode FLOPs of MLA are not modelled (attention runs on the latent)")
    t = count("context_len", context_len, 0)
    b = count("batch_size", batch_size, 1)
    tp = count("tp", tp, 1)
    kv_heads_per_gpu(spec, tp)
    if recompute:
        t = count("context_len", t, 1)          # a recompute step feeds at least one token
        return {"linear": 2 * b * t * (spec.num_params - spec.gathered_params) // tp,
                "attention": 4 * b * spec.num_layers * spec.num_heads * spec.head_dim * t * t // tp}
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


@dataclass(frozen=True)
class StepTime:
    """The roofline's two lower bounds on one step's time on one GPU.

    ``flops`` and ``bytes`` are the step's (per GPU); ``compute_s = flops / peak`` (dense
    fp16/bf16) and ``memory_s = bytes / bandwidth`` (datasheet values, :class:`GPUSpec`), in
    seconds.  The step takes at least :attr:`seconds`, the larger of the two; :attr:`limit` names
    it.  Real kernels reach some fraction of either peak, so both are lower bounds.
    """

    flops: int
    bytes: int
    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        """The roofline bound: ``max(compute_s, memory_s)``."""
        return max(self.compute_s, self.memory_s)

    @property
    def limit(self) -> str:
        """``"compute"`` or ``"memory"``: which bound is the larger (compute on a tie)."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


def step_time(model, gpu: str | GPUSpec, context_len: int, batch_size: int = 1,
              kv_dtype: str | KVDType = "fp16", weights_dtype: str | None = None, *, tp: int = 1,
              recompute: bool = False) -> StepTime:
    """Both roofline bounds on one step of ``batch_size`` sequences at ``context_len`` tokens.

    Cached (default): a decode step, :func:`step_flops` and :func:`step_bytes`.
    ``recompute=True``: chapter 1's step, which runs the model over all ``t`` tokens again:
    :func:`step_flops` with ``recompute=True``, and the bytes are the weights read once
    (:func:`weights_read_per_step`), no cache; activations are not counted, so this memory
    bound is low, and a recompute step is compute-bound from a few hundred tokens on.

    Raises:
        ConfigError: a GPU without bandwidth/peak, MLA, impossible sizes (as :func:`step_bytes`);
        UnknownPresetError: unknown names.
    """
    g = _gpu(gpu)
    flops = sum(step_flops(model, context_len, batch_size, tp=tp, recompute=recompute).values())
    if recompute:
        count("batch_size", batch_size, 1)
        nbytes = weights_read_per_step(model, weights_dtype, tp=tp)
    else:
        nbytes = sum(step_bytes(model, context_len, batch_size, kv_dtype, weights_dtype, tp=tp).values())
    return StepTime(flops, nbytes, flops / g.peak_flops, nbytes / g.bandwidth)


def generation_time(model, gpu: str | GPUSpec, num_tokens: int, kv_dtype: str | KVDType = "fp16",
                    weights_dtype: str | None = None, *, tp: int = 1, recompute: bool = False) -> float:
    """Roofline lower bound, in seconds, on generating ``num_tokens`` tokens for one sequence
    after a one-token prompt: the sum over steps ``t = 1..num_tokens`` of :func:`step_time`'s
    bound, each step on whichever side limits it (step ``t`` has ``t`` tokens in the sequence:
    recompute feeds them all, a cached step feeds one and reads the K/V of ``t``).

    Raises:
        ConfigError, UnknownPresetError: as :func:`step_time`.
    """
    n = count("num_tokens", num_tokens, 1)
    spec, g = as_spec(model), _gpu(gpu)
    return sum(step_time(spec, g, t, 1, kv_dtype, weights_dtype, tp=tp, recompute=recompute).seconds
               for t in range(1, n + 1))


def roofline_tokens_per_s(model, gpu: str | GPUSpec, context_len: int, batch_size: int = 1,
                          kv_dtype: str | KVDType = "fp16", weights_dtype: str | None = None, *,
                          tp: int = 1) -> float:
    """Upper bound on decode throughput (tokens/s over the batch): ``B / step time`` with the
    step time at least ``max(bytes / bandwidth, FLOPs / peak)`` (the roofline, per GPU of the
    ``tp`` group, :func:`step_time`).  Real engines reach some fraction of it.  It does not ask
    whether the batch fits in memory: :func:`max_decode_throughput` does."""
    return batch_size / step_time(model, gpu, context_len, batch_size, kv_dtype, weights_dtype, tp=tp).seconds


@dataclass(frozen=True)
class DecodeCeiling:
    """The most decode throughput one GPU can give at one context: the roofline at the largest
    batch that fits (:func:`max_decode_throughput`).

    ``batch_size``: the most sequences of ``context_len`` tokens whose KV cache fits beside the
    weights (0: none); ``tokens_per_s``: the roofline bound at that batch (0.0 if none fits);
    ``step``: its :class:`StepTime` (``None`` if none fits).
    """

    context_len: int
    batch_size: int
    tokens_per_s: float
    step: StepTime | None


def max_decode_throughput(model, gpu: str | GPUSpec, context_len: int, kv_dtype: str | KVDType = "fp16",
                          weights_dtype: str | None = None, *, tp: int = 1,
                          reserve_fraction: float = RESERVE_FRACTION,
                          block_size: int | None = None) -> DecodeCeiling:
    """The memory wall: the roofline bound on tokens/s at the largest batch of ``context_len``-token
    sequences that fits (:func:`~paged_kv.memory.plan.max_batch_size`, the same reserve and
    blocks as :func:`~paged_kv.memory.plan.plan_memory`).

    The roofline grows with the batch (a step's weight reads are shared, its time is at most
    proportional to ``B``), so no batch that fits does better; past that batch the bound of
    :func:`roofline_tokens_per_s` is arithmetic for sequences the GPU cannot hold.  At the wall
    the KV cache nearly fills the budget, so a step reads about the whole budget plus the weights:
    while memory-bound, tokens/s fall as ``1 / t``.

    Raises:
        ConfigError, UnknownPresetError: as :func:`~paged_kv.memory.plan.plan_memory` and
        :func:`step_time`.
    """
    b = max_batch_size(model, gpu, context_len, kv_dtype, weights_dtype=weights_dtype, tp=tp,
                       reserve_fraction=reserve_fraction, block_size=block_size)
    if b == 0:
        _gpu(gpu)
        return DecodeCeiling(context_len, 0, 0.0, None)
    st = step_time(model, gpu, context_len, b, kv_dtype, weights_dtype, tp=tp)
    return DecodeCeiling(context_len, b, b / st.seconds, st)


@dataclass(frozen=True)
class IterationTime:
    """Seconds one step takes: ``base_s + per_kv_token_s * kv_tokens + per_prefill_token_s * prefill``.

    ``kv_tokens`` is the tokens held in the KV cache during the step (what decode attention
    reads); ``prefill`` the prompt tokens prefilled in it.  The clock of the simulator
    (:func:`paged_kv.sim.simulate`) and of the timing engine
    (:class:`~paged_kv.engine.timing_runner.TimingRunner`).

    Raises:
        ConfigError: ``base_s`` not a finite number > 0, or a per-token cost < 0.
    """

    base_s: float = 1.0
    per_kv_token_s: float = 0.0
    per_prefill_token_s: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_s", real("base_s", self.base_s, 0.0, low_open=True))
        for label in ("per_kv_token_s", "per_prefill_token_s"):
            object.__setattr__(self, label, real(label, getattr(self, label), 0.0))

    def __call__(self, kv_tokens: int, prefill_tokens: int) -> float:
        return self.base_s + self.per_kv_token_s * kv_tokens + self.per_prefill_token_s * prefill_tokens

    @classmethod
    def roofline(cls, weight_bytes: float, kv_bytes_per_token: float,
                 hbm_bytes_per_s: float, flops_per_s: float,
                 efficiency: float = 1.0) -> "IterationTime":
        """A memory-bound decode step: read every weight once and every cached K/V once;
        prefill compute-bound, 2 FLOPs per parameter per token (fp16: params = bytes / 2).

        ``efficiency`` in (0, 1] scales the hardware peaks; 1 is the ideal, an optimistic
        bound.

        Raises:
            ConfigError: an argument that is not a finite number > 0, or an efficiency above 1.
        """
        w, kv, bw, fl = (real(n, v, 0.0, low_open=True) for n, v in (
            ("weight_bytes", weight_bytes), ("kv_bytes_per_token", kv_bytes_per_token),
            ("hbm_bytes_per_s", hbm_bytes_per_s), ("flops_per_s", flops_per_s)))
        eff = real("efficiency", efficiency, 0.0, 1.0, low_open=True)
        bw, fl = bw * eff, fl * eff
        return cls(w / bw, kv / bw, 2 * (w / 2) / fl)
