"""What fits on a GPU: the memory of one GPU split into weights, a reserve and the KV budget, and
the batch that budget holds (chapter 3's calculator).

``reserve_fraction`` defaults to :data:`paged_kv.defaults.RESERVE_FRACTION` (vLLM's
``gpu_memory_utilization=0.9``).  All bytes are per GPU of a tensor-parallel group.  Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..defaults import RESERVE_FRACTION
from ..units import format_bytes
from ..validate import count, real
from .kv_dtype import KVDType, get_kv_dtype
from .ledger import as_spec, kv_bytes_per_token, kv_cache_bytes, weights_bytes
from .presets import gpu_preset
from .spec import GPUSpec, weights_dtype_name

__all__ = ["MemoryPlan", "max_batch_size", "max_tokens", "plan_memory"]


@dataclass(frozen=True)
class MemoryPlan:
    """The memory of one GPU of a ``tp x pp``-GPU group serving ``model`` (all bytes are per GPU;
    with ``pp > 1``, the busiest pipeline stage's GPU).

    ``kv_budget_bytes = gpu_bytes - reserve_bytes - weights_bytes`` (0 if the weights do not
    fit); ``max_tokens`` and ``max_batch_size`` are what that budget holds.  ``block_size``: the
    tokens per block when the cache is paged (whole blocks per sequence), ``None`` when counted
    per token.
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
    pp: int = 1
    block_size: int | None = None

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
            f"{self.model} on {self.tp * self.pp} x {self.gpu}"
            f"{f' (TP={self.tp} x PP={self.pp})' if self.pp > 1 else ''}, KV in {self.kv_dtype}, "
            f"weights in {self.weights_dtype} (per GPU):",
            f"  GPU memory        {format_bytes(self.gpu_bytes)}",
            f"  weights           {format_bytes(self.weights_bytes)}",
            f"  reserve           {format_bytes(self.reserve_bytes)}",
            f"  KV budget         {format_bytes(self.kv_budget_bytes)}",
            f"  KV per token      {self.kv_bytes_per_token:,} B"
            + (f", in whole blocks of {self.block_size} tokens" if self.block_size and self.block_size > 1
               else ", in blocks of 1 token" if self.block_size else ""),
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
                pp: int = 1, reserve_fraction: float = RESERVE_FRACTION, block_size: int | None = None) -> MemoryPlan:
    """Size the KV cache of ``model`` on ``tp`` GPUs of type ``gpu``.

    Args:
        seq_len, batch_size: the workload (tokens per sequence, sequences).
        reserve_fraction: share of each GPU kept for activations, the CUDA context and allocator
            slack.  0.10 matches vLLM's default ``gpu_memory_utilization=0.9`` (vLLM also
            subtracts the activation peak it profiles; we fold that into the reserve).
        block_size: if given, each sequence takes whole blocks of this many tokens (paging): on
            a full layer ``ceil(seq_len / block_size)``, on a sliding-window layer the peak it
            holds on the way to ``seq_len`` (:func:`~paged_kv.memory.window.window_peak_blocks`,
            vLLM v1's rule), so the batch is sized for the peak.  ``None``: counted per token
            (a sliding layer keeps ``min(seq_len, window)`` tokens).
        tp, pp: tensor-parallel GPUs per stage and pipeline stages (the plan is the busiest
            stage's GPU: ``ceil(L / pp)`` layers of weights and cache).

    ``seq_len`` may exceed the model's ``max_position`` (the plan says so:
    :attr:`MemoryPlan.within_max_context`); the arithmetic does not depend on it.

    Raises:
        ConfigError: impossible sizes, tp, dtype or reserve; UnknownPresetError: unknown names.
    """
    spec = as_spec(model)
    gpu = gpu if isinstance(gpu, GPUSpec) else gpu_preset(gpu)
    seq_len = count("seq_len", seq_len, 1)
    batch_size = count("batch_size", batch_size, 0)
    tp = count("tp", tp, 1)
    pp = count("pp", pp, 1)
    reserve_fraction = real("reserve_fraction", reserve_fraction, 0.0, 1.0, high_open=True)
    if block_size is not None:
        block_size = count("block_size", block_size, 1)
    dt = get_kv_dtype(kv_dtype)
    weights_dtype = weights_dtype_name(weights_dtype or spec.weights_dtype)
    w = weights_bytes(spec, weights_dtype, tp=tp, pp=pp)
    reserve = int(gpu.memory_bytes * reserve_fraction)
    budget = max(0, gpu.memory_bytes - reserve - w)
    per_token = kv_bytes_per_token(spec, dt, tp=tp, pp=pp)
    per_seq = kv_cache_bytes(spec, seq_len, 1, dt, tp=tp, pp=pp, block_size=block_size)
    tokens = budget // per_token if block_size is None else budget // (per_token * block_size) * block_size
    return MemoryPlan(
        model=spec.name, gpu=gpu.name, tp=tp, seq_len=seq_len, batch_size=batch_size, kv_dtype=dt.name,
        weights_dtype=weights_dtype, gpu_bytes=gpu.memory_bytes, weights_bytes=w, reserve_bytes=reserve,
        kv_budget_bytes=budget, kv_bytes_per_token=per_token, kv_bytes_per_sequence=per_seq,
        kv_bytes=batch_size * per_seq, max_tokens=tokens, max_batch_size=budget // per_seq,
        max_position=spec.max_position, pp=pp, block_size=block_size)


def max_batch_size(model, gpu: str | GPUSpec, seq_len: int, kv_dtype: str | KVDType = "fp16",
                   **kwargs) -> int:
    """Sequences of ``seq_len`` tokens whose KV cache fits next to the weights (0: none; see
    :func:`plan_memory` for the keyword arguments)."""
    return plan_memory(model, gpu, seq_len, 1, kv_dtype, **kwargs).max_batch_size


def max_tokens(model, gpu: str | GPUSpec, kv_dtype: str | KVDType = "fp16", **kwargs) -> int:
    """Token slots that fit in the KV budget of each GPU (see :func:`plan_memory`)."""
    return plan_memory(model, gpu, 1, 1, kv_dtype, **kwargs).max_tokens
