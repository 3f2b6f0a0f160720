"""What an engine measures over a run, as engines log it (vLLM's scheduler and iteration stats).

Counters and per-step series, kept by :class:`~paged_kv.engine.LLMEngine` after every step.  Time is
the wall clock with the tiny model, the modelled clock with a timing model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

__all__ = ["EngineStats"]


@dataclass
class EngineStats:
    """Counters over a run, as engines log them.

    Attributes:
        steps, clock_s: steps run and the clock (s); ``generated``: output tokens produced;
        prompt_tokens: prompt tokens prefilled (re-prefills included); preemptions, recomputes,
        swaps: events; swapped_blocks: blocks moved to the CPU pool (each shared block once);
        kv_usage: per step, the fraction of GPU blocks held after scheduling (vLLM's "GPU KV cache
        usage"); running, waiting, swapped: per step, queue lengths (requests) after scheduling;
        admitted, finished, preempted_now: per step, requests admitted or resumed, finished,
        preempted in it; step_s: per step, its duration (s).
        prefix_queries, prefix_hits: prompt tokens looked up in the prefix cache at requests' first
            admissions, and found there; preempted_prefix_queries, preempted_prefix_hits: the same
            at re-admissions after a recompute preemption (apart, as vLLM counts them). Hits of
            both kinds are prefill tokens saved.
    """

    steps: int = 0
    clock_s: float = 0.0
    generated: int = 0
    prompt_tokens: int = 0
    preemptions: int = 0
    recomputes: int = 0
    swaps: int = 0
    swapped_blocks: int = 0
    kv_usage: list[float] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    swapped: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    preempted_now: list[int] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    prefix_queries: int = 0
    prefix_hits: int = 0
    preempted_prefix_queries: int = 0
    preempted_prefix_hits: int = 0

    def __repr__(self) -> str:
        """The counters, and each per-step list as its length (``print(engine.stats)`` stays short;
        the lists themselves are attributes)."""
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            parts.append(f"{f.name}=[{len(value)} per-step values]" if isinstance(value, list) else
                         f"{f.name}={value:.4g}" if isinstance(value, float) else f"{f.name}={value!r}")
        return f"EngineStats({', '.join(parts)})"

    @property
    def prefix_hit_rate(self) -> float:
        """First admissions only (vLLM's hit rate): hits / queries; ``nan`` before any lookup."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else math.nan

    @property
    def throughput(self) -> float:
        """Output tokens per second of clock."""
        return self.generated / self.clock_s if self.clock_s else math.nan

    @property
    def peak_kv_usage(self) -> float:
        return max(self.kv_usage, default=0.0)
