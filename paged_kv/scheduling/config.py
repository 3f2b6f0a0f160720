"""The scheduler's knobs, named as vLLM names them, validated on creation.

Pure Python.  Defaults come from :mod:`paged_kv.defaults`, each with the system it follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..defaults import BLOCK_SIZE, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, WATERMARK
from ..errors import ConfigError
from ..validate import count, real
from .rules import POLICIES

__all__ = ["PREEMPTION_MODES", "RESERVATIONS", "SchedulerConfig"]

PREEMPTION_MODES = ("recompute", "swap")
RESERVATIONS = ("none", "oracle", "max")


@dataclass(frozen=True)
class SchedulerConfig:
    """The knobs, named as vLLM names them.

    Attributes:
        num_gpu_blocks: blocks in the GPU pool (NB).
        block_size: token slots per block (BS; vLLM ``block_size``, default 16).
        num_cpu_blocks: blocks in the CPU swap pool (vLLM sizes it from ``swap_space`` GiB); 0: none.
        max_num_seqs: most sequences running at once (vLLM ``max_num_seqs``, 256).
        max_num_batched_tokens: the token budget of one step, prefill chunks and decode tokens
            together (vLLM ``max_num_batched_tokens``; default 512, vLLM v0's with chunked prefill).
        enable_chunked_prefill: split prompts over steps by the budget; off, a prompt runs whole
            or waits (and one longer than the budget is refused).
        watermark: fraction of the GPU blocks admission keeps free (vLLM's 0.01), so running
            requests can grow a while before anyone is preempted.
        preemption_mode: ``"recompute"`` (vLLM's default) or ``"swap"`` (needs ``num_cpu_blocks``).
        max_model_len: most tokens a sequence may hold (prompt + output); ``None``: no cap.
        reservation: ``"none"`` (paging: blocks on demand), or a contiguous-style reservation made
            at admission, to compare with Orca as the paper does (§6.1): ``"oracle"`` reserves
            the request's exact ``P + max_tokens - 1`` tokens, ``"max"`` reserves ``max_model_len``.
            Modelled in whole blocks, so it is *kinder* than real contiguous allocation (no external
            fragmentation); ``n = 1`` only.
        enable_prefix_caching: automatic prefix caching (vLLM's ``enable_prefix_caching``; off by
            default here, on by default in vLLM v1): full blocks are found again by their prefix.
        prefix_caching_hash_algo: the block hash, ``"sha256"`` (vLLM's name for the option) or a
            function ``(parent, token_ids, extra_key) -> hashable`` (tests inject collisions).
        policy: the order admission walks the waiting queue in (vLLM's ``policy``, its
            ``--scheduling-policy``): ``"fcfs"`` (the default, arrival order) or ``"lpm"`` (longest
            prefix match first, SGLang's ``--schedule-policy lpm``;
            :func:`~paged_kv.scheduling.rules.admission_order` says how, and what it risks).  With
            prefix caching off every request finds 0 tokens cached, so ``"lpm"`` is FCFS (as SGLang
            falls back to FCFS without its radix cache).
        num_lookahead_tokens: speculative decoding's ``k`` (set from ``num_speculative_tokens``):
            the most draft tokens a decoding sequence runs per step, each with a slot of its own
            (a lookahead slot, vLLM v0's ``num_lookahead_slots``); 0 (the default): no
            speculation.  Not vLLM v1's ``num_lookahead_tokens``, which reserves slots for the
            *next* step's drafts (EAGLE, draft models; 0 for n-gram lookup): v1 counts the drafts
            being verified in the request's ``num_new_tokens``.  The scheduler
            needs a proposer for it (:class:`~paged_kv.scheduling.scheduler.Scheduler`).

    Raises:
        ConfigError: a bad value (the message names it), or knobs that cannot go together: swap
            without a CPU pool, ``"max"`` without ``max_model_len``, prefix caching with swap or a
            reservation (as in vLLM v1, which preempts by recompute only and reserves nothing).
    """

    num_gpu_blocks: int
    block_size: int = BLOCK_SIZE
    num_cpu_blocks: int = 0
    max_num_seqs: int = MAX_NUM_SEQS
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    enable_chunked_prefill: bool = True
    watermark: float = WATERMARK
    preemption_mode: str = "recompute"
    max_model_len: int | None = None
    reservation: str = "none"
    enable_prefix_caching: bool = False
    prefix_caching_hash_algo: str | Callable = "sha256"
    policy: str = "fcfs"
    num_lookahead_tokens: int = 0

    def __post_init__(self) -> None:
        fix = lambda name, value: object.__setattr__(self, name, value)  # frozen dataclass
        fix("num_gpu_blocks", count("num_gpu_blocks", self.num_gpu_blocks))
        fix("block_size", count("block_size (tokens per block)", self.block_size))
        fix("num_cpu_blocks", count("num_cpu_blocks", self.num_cpu_blocks, 0))
        fix("max_num_seqs", count("max_num_seqs", self.max_num_seqs))
        fix("max_num_batched_tokens", count("max_num_batched_tokens", self.max_num_batched_tokens))
        fix("watermark", real("watermark (a fraction of the GPU blocks)", self.watermark, 0.0, 1.0, high_open=True))
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ConfigError(f"enable_chunked_prefill must be True or False, got {self.enable_chunked_prefill!r}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ConfigError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")
        if self.preemption_mode == "swap" and not self.num_cpu_blocks:
            raise ConfigError("preemption_mode='swap' needs a CPU pool: set num_cpu_blocks >= 1")
        if self.max_model_len is not None:
            fix("max_model_len", count("max_model_len (tokens)", self.max_model_len))
        fix("num_lookahead_tokens", count("num_lookahead_tokens (draft tokens)", self.num_lookahead_tokens, 0))
        if self.reservation not in RESERVATIONS:
            raise ConfigError(f"reservation must be one of {RESERVATIONS}, got {self.reservation!r}")
        if self.reservation == "max" and self.max_model_len is None:
            raise ConfigError("reservation='max' reserves max_model_len tokens: set max_model_len")
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ConfigError(f"enable_prefix_caching must be True or False, got {self.enable_prefix_caching!r}")
        if self.enable_prefix_caching and (self.preemption_mode == "swap" or self.reservation != "none"):
            raise ConfigError(f"prefix caching works with preemption_mode='recompute' and reservation='none' "
                              f"only (got {self.preemption_mode!r}, {self.reservation!r}): a swapped or "
                              f"reserved request would hold cached blocks other requests share")

    @property
    def watermark_blocks(self) -> int:
        """Blocks admission keeps free: ``int(watermark * num_gpu_blocks)`` (as vLLM rounds)."""
        return int(self.watermark * self.num_gpu_blocks)

