"""What one decoding step costs: measured time and counted FLOPs, beside the FLOP formula.

Time is measured (``time.perf_counter``, with a CUDA sync on GPU).  FLOPs are *counted* from the
operations that actually ran, with the per-op rules of PyTorch's ``FlopCounterMode`` (without its
per-module bookkeeping, which is slow), plus a rule for the CPU's fused attention op, which
PyTorch does not count by itself.  :func:`forward_flops` is the independent formula the count is
checked against (Kaplan et al. 2020, §2.1: ~2 FLOPs per parameter per token, plus attention).
The bytes a decode step reads, and the roofline they set, are :mod:`paged_kv.memory.decode_cost`.

:func:`time_decode_attention` times one layer of decode attention alone as the context grows
(chapter 2), built to be stable on a small shared CPU: one thread timed by its own CPU time, no allocation that
grows with the context, lengths interleaved round by round, the median per length.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, shape_wrapper

from ..errors import ConfigError
from ..model.config import ModelConfig
from ..model.llama import TinyLlama
from ..validate import count
from .decoders import make_decoder
from .generate import check_prompts

__all__ = ["AttentionTiming", "StepCost", "attention_crossover", "attention_flops", "decode_attention_head_major",
           "forward_flops", "profile_decoding", "time_decode_attention"]


@dataclass(frozen=True)
class StepCost:
    """One decoding step: ``context_len`` tokens in the sequence after it (prompt + generated)."""

    step: int
    context_len: int
    new_tokens: int
    seconds: float
    flops: int


def _sdpa_flops(q_shape, k_shape, v_shape, *args, **kwargs) -> int:
    """FLOPs of fused attention ``[B, H, Tq, D] x [B, Hkv, Tk, D]``: QK^T and PV, 2 per MAC.

    The fused op computes the full ``Tq x Tk`` score matrix and masks it, so that is what it
    costs (no discount for causality).
    """
    b, h, tq, d = q_shape
    tk = k_shape[2]
    return 4 * b * h * tq * tk * d


class _FlopCounter(TorchDispatchMode):
    """Count FLOPs of the aten ops that run inside it, with PyTorch's own counting rules
    (``torch.utils.flop_counter.flop_registry``) plus :func:`_sdpa_flops`.

    The same per-op rules and the same total as ``FlopCounterMode``, without its per-module
    bookkeeping: ``FlopCounterMode`` hooks every module call to attribute FLOPs to modules,
    which made a counted decoding run several times slower than the run itself.
    """

    def __init__(self) -> None:
        super().__init__()
        self.registry = dict(flop_registry)
        op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
        if op is not None:
            self.registry[op] = shape_wrapper(_sdpa_flops)
        self.total = 0

    def get_total_flops(self) -> int:
        return self.total

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        rule = self.registry.get(func._overloadpacket)
        if rule is not None:
            self.total += rule(*args, **kwargs, out_val=out)
        return out


def _counter() -> _FlopCounter:
    return _FlopCounter()


@torch.no_grad()
def profile_decoding(model: TinyLlama, prompt: list[int], max_new_tokens: int, cache: str,
                     backend: str = "torch", count_flops: bool = True, repeats: int = 3) -> list[StepCost]:
    """Greedy-decode one prompt and record each step's cost.

    Step 0 is the prefill (it processes the whole prompt).  Each step's time is the *minimum*
    over ``repeats`` identical runs: on a shared machine other work only ever adds time, so the
    minimum is the best estimate of the step's own cost.  FLOPs are counted in one further,
    untimed run (the counter slows execution down) when ``count_flops``.

    Raises the same errors as :func:`paged_kv.decoding.generate`, and ``ConfigError`` for
    ``repeats < 1``.
    """
    prompts = check_prompts(model, [prompt], max_new_tokens)
    max_new_tokens = count("max_new_tokens", max_new_tokens, 1)
    repeats = count("repeats", repeats, 1)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)

    def run(count: bool):
        dec = make_decoder(model, cache, backend, prompts, max_new_tokens)
        last, seconds, flops = None, [], []
        for step in range(max_new_tokens):
            t0 = time.perf_counter()
            if count:
                with _counter() as fc:
                    logits = dec.prefill(prompts) if step == 0 else dec.decode([last])
                flops.append(fc.get_total_flops())
            else:
                logits = dec.prefill(prompts) if step == 0 else dec.decode([last])
            sync()
            seconds.append(time.perf_counter() - t0)
            last = int(logits.argmax(-1)[0])
        return seconds, flops

    times = [run(False)[0] for _ in range(repeats)]
    flops = run(True)[1] if count_flops else [0] * max_new_tokens
    out = []
    for step in range(max_new_tokens):
        ctx = len(prompt) + step
        new = len(prompt) if step == 0 or cache == "recompute" else 1
        out.append(StepCost(step, ctx, ctx if cache == "recompute" else new,
                            min(t[step] for t in times), flops[step]))
    return out


def attention_flops(cfg: ModelConfig, new_tokens: int, context_len: int) -> int:
    """The attention part of :func:`forward_flops`: ``4 L H D new_tokens context_len`` (``QK^T``
    and ``PV``, 2 FLOPs per multiply-add, every query head against every key it is scored with).

    This is what the torch path computes: the full masked ``t x t`` score matrix of a recompute
    step.  A causal kernel that skips masked tiles (``kernels/prefill_attention.py``) does about
    ``t (t + 1) / 2`` of the ``t^2`` products.
    """
    return 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * new_tokens * context_len


def attention_crossover(cfg: ModelConfig, cumulative: bool = False) -> int:
    """The shortest sequence at which attention's FLOPs reach the linear layers' in recompute
    decoding (:func:`forward_flops` with ``new_tokens = context_len``).

    Per step (``cumulative=False``): the smallest ``t`` with ``4 L H D t^2 >= 2 t P``, where ``P``
    is the matmul parameters, i.e. ``t >= P / (2 L H D)``.  Summed over steps ``1..n``
    (``cumulative=True``): the smallest ``n`` with ``4 L H D n(n+1)(2n+1)/6 >= P n(n+1)``, about
    ``1.5x`` the per-step crossover (attention grows as ``n^3 / 3``, the linear layers as ``n^2``).
    Both may lie beyond ``cfg.max_seq_len`` (then the model never shows it).
    """
    a = attention_flops(cfg, 1, 1)                       # 4 L H D
    p2 = forward_flops(cfg, 1, 0)                        # 2 P
    if not cumulative:
        return -(-p2 // a)
    # 4LHD (2n + 1) / 6 >= P  <=>  a (2n + 1) >= 3 p2
    return max(1, -(-(3 * p2 - a) // (2 * a)))


def forward_flops(cfg: ModelConfig, new_tokens: int, context_len: int) -> int:
    """Matmul FLOPs of one forward pass over ``new_tokens`` tokens that attend to ``context_len``.

    ``2 * new_tokens * (matmul parameters)`` for the projections, MLP and LM head, plus
    ``4 * L * H * D * new_tokens * context_len`` for ``QK^T`` and ``PV``.  Recompute step t has
    ``new_tokens = context_len = t``; a cached decode step has ``new_tokens = 1``.
    """
    d = cfg.hidden_size
    norms = (2 * cfg.num_layers + 1) * d                         # RMSNorm weights scale, they do not multiply
    lookup = 0 if cfg.tie_embeddings else cfg.vocab_size * d     # an untied input table is only indexed
    matmul_params = cfg.num_parameters() - norms - lookup       # projections, MLP, LM head
    return 2 * new_tokens * matmul_params + attention_flops(cfg, new_tokens, context_len)


@dataclass(frozen=True)
class AttentionTiming:
    """One context length of :func:`time_decode_attention`: ``seconds`` is the median of
    ``runs`` (seconds each, in the order measured); ``bytes_read`` the K/V bytes one call reads
    (``2 t Hkv D x 4``, fp32), so ``bytes_read / seconds`` is the bandwidth it reached."""

    context_len: int
    bytes_read: int
    seconds: float
    runs: tuple[float, ...]


def decode_attention_head_major(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One decode step of GQA attention over a head-major cache, reading each K/V byte once.

    Args:
        q: ``[H, D]`` the new token's queries.
        k, v: ``[Hkv, t, D]`` (a prefix view of a longer cache is fine: it is not copied).

    Returns ``[H, D]``, equal (up to rounding) to
    :func:`kernels.decode_attention.decode_attention_reference` on the same values laid out
    ``[1, t, Hkv, D]``.  Query head ``h`` reads KV head ``h // (H / Hkv)``.  Two batched matmuls
    on the cache in place: their temporaries (``[Hkv, H/Hkv, t]`` scores) are ``D`` times smaller
    than the cache, so the time is the cache's bytes, not the allocator's.
    """
    hkv, _, d = k.shape
    qg = q.reshape(hkv, q.shape[0] // hkv, d)                               # [Hkv, G, D]
    scores = torch.matmul(qg, k.transpose(1, 2)) * (1.0 / math.sqrt(d))     # [Hkv, G, t]
    return torch.matmul(torch.softmax(scores, dim=-1), v).reshape(q.shape)  # [H, D]


def time_decode_attention(context_lens: list[int], num_heads: int = 32, num_kv_heads: int = 8,
                          head_dim: int = 128, repeats: int = 9, threads: int = 1,
                          seed: int = 0, clock=None) -> list[AttentionTiming]:
    """Time one layer of decode attention (fp32, CPU) at each context length.

    The cache is made once, for the longest length, head-major ``[Hkv, T, D]``; each length reads
    a prefix of it (:func:`decode_attention_head_major`).  ``repeats`` rounds, each timing every
    length once in turn after one untimed warm-up round, so a burst of other work on the machine
    lands on all lengths alike; the median of each length's runs is kept.  PyTorch runs on
    ``threads`` threads meanwhile (restored after): on a machine shared with other jobs, more
    threads than free cores make times jump.

    Raises:
        ConfigError: no lengths, a length < 1, ``num_heads`` not a multiple of ``num_kv_heads``,
            ``repeats`` or ``threads`` < 1.
    """
    lens = [count("context_len", t, 1) for t in context_lens]
    if not lens:
        raise ConfigError("context_lens must not be empty")
    h, hkv, d = (count(n, v, 1) for n, v in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads),
                                             ("head_dim", head_dim)))
    if h % hkv:
        raise ConfigError(f"num_heads ({h}) must be a multiple of num_kv_heads ({hkv})")
    repeats, threads = count("repeats", repeats, 1), count("threads", threads, 1)
    if clock is None:
        fine = time.get_clock_info("thread_time").resolution <= 1e-6
        clock = time.thread_time if fine else time.perf_counter
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(h, d, generator=g)
    k = torch.randn(hkv, max(lens), d, generator=g)
    v = torch.randn(hkv, max(lens), d, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        runs: dict[int, list[float]] = {i: [] for i in range(len(lens))}
        for r in range(repeats + 1):
            for i, t in enumerate(lens):
                t0 = clock()
                decode_attention_head_major(q, k[:, :t], v[:, :t])
                if r:                                               # round 0 warms up
                    runs[i].append(clock() - t0)
    finally:
        torch.set_num_threads(before)
    return [AttentionTiming(t, 2 * t * hkv * d * 4, statistics.median(runs[i]), tuple(runs[i]))
            for i, t in enumerate(lens)]
