"""The engine's knobs (vLLM's names): the scheduler's, plus the pools given in blocks or in bytes,
the attention backend and the order of the forward pass's sums.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..defaults import BLOCK_SIZE, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, WATERMARK
from ..errors import ConfigError
from ..model.reduction_order import ReductionOrder
from ..scheduling import SchedulerConfig
from ..spec_decode import SpeculativeConfig
from ..validate import count

__all__ = ["EngineConfig"]


@dataclass(frozen=True)
class EngineConfig:
    """The engine's knobs (vLLM's names; see :class:`~paged_kv.scheduling.SchedulerConfig`).

    Give the GPU pool as ``num_gpu_blocks`` *or* as ``gpu_memory_bytes`` (bytes for the KV cache,
    all layers, K and V: ``num_gpu_blocks = gpu_memory_bytes // bytes_per_block``, the way vLLM
    turns ``gpu_memory_utilization`` into blocks); likewise ``num_cpu_blocks`` or
    ``swap_space_bytes`` for the CPU pool.

    ``reduction`` (a :class:`~paged_kv.model.reduction.ReductionOrder`, torch backend only; ``None``:
    the references' own order) makes the order of every pass's sums explicit:
    ``ReductionOrder(16, batch_invariant=True)`` is this engine's ``VLLM_BATCH_INVARIANT=1``.

    ``speculative_config`` turns speculative decoding on, as vLLM's ``LLM(speculative_config=...)``:
    ``{"method": "ngram" | "draft_model", "num_speculative_tokens": k, ...}`` (the keys of
    :class:`~paged_kv.spec_decode.SpeculativeConfig`, into which it is turned); ``None`` (the
    default): off.

    Raises:
        ConfigError: neither or both of a pool's two forms, or a bad knob.
    """

    block_size: int = BLOCK_SIZE
    num_gpu_blocks: int | None = None
    gpu_memory_bytes: int | None = None
    num_cpu_blocks: int | None = None
    swap_space_bytes: int | None = None
    max_num_seqs: int = MAX_NUM_SEQS
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    enable_chunked_prefill: bool = True
    watermark: float = WATERMARK
    preemption_mode: str = "recompute"
    max_model_len: int | None = None
    reservation: str = "none"
    backend: str = "torch"
    enable_prefix_caching: bool = False
    prefix_caching_hash_algo: object = "sha256"
    policy: str = "fcfs"
    reduction: ReductionOrder | None = None
    speculative_config: SpeculativeConfig | dict | None = None

    def __post_init__(self) -> None:
        if self.speculative_config is not None:
            object.__setattr__(self, "speculative_config", SpeculativeConfig.from_dict(self.speculative_config))
        if (self.num_gpu_blocks is None) == (self.gpu_memory_bytes is None):
            raise ConfigError("give the GPU pool as num_gpu_blocks or as gpu_memory_bytes (one of them)")
        if self.num_cpu_blocks is not None and self.swap_space_bytes is not None:
            raise ConfigError("give the CPU pool as num_cpu_blocks or as swap_space_bytes, not both")
        if self.backend not in ("torch", "triton"):
            raise ConfigError(f"backend must be 'torch' or 'triton', got {self.backend!r}")
        if self.reduction is not None and not isinstance(self.reduction, ReductionOrder):
            raise ConfigError(f"reduction must be a ReductionOrder or None, got {self.reduction!r:.60}")
        if self.reduction is not None and self.backend != "torch":
            raise ConfigError(f"a reduction order ({self.reduction}) runs on the torch backend, "
                              f"got backend {self.backend!r}")

    def scheduler_config(self, bytes_per_block: int | None = None) -> SchedulerConfig:
        """The :class:`SchedulerConfig`; ``bytes_per_block`` (bytes, all layers, K and V) turns
        the byte budgets into blocks.

        Raises:
            ConfigError: a budget in bytes without ``bytes_per_block``, or one smaller than a block.
        """
        def blocks(n, nbytes, label, minimum):
            if n is not None or nbytes is None:
                return n or 0
            if bytes_per_block is None:
                raise ConfigError(f"{label} is in bytes: the engine needs the model to price a block")
            nbytes = count(label + " (bytes)", nbytes, 0)
            if nbytes // bytes_per_block < minimum:
                raise ConfigError(f"{label} = {nbytes:,} bytes holds no block of {bytes_per_block:,} bytes")
            return nbytes // bytes_per_block
        return SchedulerConfig(
            num_gpu_blocks=blocks(self.num_gpu_blocks, self.gpu_memory_bytes, "gpu_memory_bytes", 1),
            block_size=self.block_size,
            num_cpu_blocks=blocks(self.num_cpu_blocks, self.swap_space_bytes, "swap_space_bytes", 0),
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            enable_chunked_prefill=self.enable_chunked_prefill, watermark=self.watermark,
            preemption_mode=self.preemption_mode, max_model_len=self.max_model_len,
            reservation=self.reservation, enable_prefix_caching=self.enable_prefix_caching,
            prefix_caching_hash_algo=self.prefix_caching_hash_algo, policy=self.policy,
            num_lookahead_tokens=0 if self.speculative_config is None
            else self.speculative_config.num_speculative_tokens)
