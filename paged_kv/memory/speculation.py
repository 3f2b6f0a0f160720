"""When speculative decoding pays: tokens per target pass, the verify step's time, the speed-up
and the batch where it stops paying (chapter 9).

The model is Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative
Decoding" (ICML 2023), §3: each draft token is accepted independently with the same probability
``alpha`` (their i.i.d. assumption; real acceptance varies along a text), so a pass over ``k``
drafts emits ``(1 - alpha^(k+1)) / (1 - alpha)`` tokens on average (their eq. 1); a draft model
costs ``c`` target steps per draft token (their ``c``; 0 for prompt lookup, which only searches
token ids).  Where the paper takes the target's verify pass to cost one step whatever ``k``, the
pass's time here comes from the roofline of :mod:`~paged_kv.memory.decode_cost`: a
``(1 + k)``-token pass per sequence reads every weight once, as a decode step does, but computes
``1 + k`` times the linear-layer FLOPs, so while it is memory-bound (small batch) it costs about
one step and speculation pays.  As the batch grows it is the pass, with its ``1 + k`` times the
FLOPs, that crosses the ridge point first (for Llama-3-70B at 1024 cached tokens the decode step
stays memory-bound at every batch that fits, its bytes more and more K/V); from there the pass
costs more than a step, up to ``1 + k`` steps, and the speed-up falls below 1.

Units: seconds, tokens.  Legend: B batch, t cached tokens per sequence, k draft tokens, alpha the
acceptance rate per draft token, c a draft step's cost in target steps.
"""

from __future__ import annotations

from fractions import Fraction
from numbers import Rational

from ..errors import ConfigError
from ..validate import count, real
from .decode_cost import StepTime, ridge_point, step_flops, weights_read_per_step
from .kv_dtype import KVDType
from .ledger import as_spec, kv_cache_bytes
from .plan import max_batch_size
from .presets import gpu_preset
from .spec import GPUSpec

__all__ = ["crossover_batch", "draft_time", "expected_tokens_per_pass", "speedup", "verify_step_time"]

DEFAULT_CONTEXT = 1024     # cached tokens per sequence when none is given (a chat turn's order)


def _alpha(alpha):
    """``alpha`` in [0, 1]; a Fraction (or int) stays exact, anything else becomes a float."""
    if isinstance(alpha, Rational) and not isinstance(alpha, bool):
        if not 0 <= alpha <= 1:
            raise ConfigError(f"alpha (acceptance rate per draft token) must be in [0, 1], got {alpha}")
        return Fraction(alpha)
    return real("alpha (acceptance rate per draft token)", alpha, 0.0, 1.0)


def expected_tokens_per_pass(alpha, k: int):
    """Mean tokens one verify pass emits when each of its ``k`` drafts is accepted with
    probability ``alpha``, independently, until the first rejection; the target's own token always
    comes out: ``(1 - alpha^(k+1)) / (1 - alpha)`` (Leviathan et al. 2023, eq. 1), ``k + 1`` at
    ``alpha = 1``, 1 at ``alpha = 0`` or ``k = 0``.

    Args:
        alpha: acceptance rate per draft token, in [0, 1]; a ``Fraction`` gives an exact
            ``Fraction``, a float a float.
        k: draft tokens per pass (>= 0).

    Raises:
        ConfigError: ``alpha`` outside [0, 1] or not a number, ``k`` not an int >= 0.
    """
    a, k = _alpha(alpha), count("k (draft tokens per pass)", k, 0)
    if a == 1:
        return a * (k + 1)
    return (1 - a ** (k + 1)) / (1 - a)


def verify_step_time(model, gpu, context_len: int, batch_size: int = 1, k: int = 0,
                     kv_dtype: str | KVDType = "fp16", weights_dtype: str | None = None, *,
                     tp: int = 1) -> StepTime:
    """Both roofline bounds on one target pass that feeds ``1 + k`` tokens to each of ``B``
    sequences holding ``t`` cached tokens (``k = 0``: a plain decode step, the baseline).

    Bytes: every weight once (:func:`~paged_kv.memory.decode_cost.weights_read_per_step`), the K/V
    of ``t + 1 + k`` tokens per sequence read (the cache, then the pass's own, which attention
    reads back after the store) and of ``1 + k`` written.  FLOPs:
    :func:`~paged_kv.memory.decode_cost.step_flops` for ``B (1 + k)`` queries over ``t + 1 + k``
    keys each (the causal mask inside the chunk saves at most ``k`` keys per query: not counted).
    So a ``k``-token verify reads a few more bytes than a decode step and computes ``1 + k`` times
    its FLOPs: about one step while memory-bound, up to ``1 + k`` steps once compute-bound.
    Activations and kernel overheads are not modelled (as in ``decode_cost``).

    Raises:
        ConfigError, UnknownPresetError: as :func:`~paged_kv.memory.decode_cost.step_time`.
    """
    ridge_point(gpu)                   # a GPU without bandwidth or peak FLOP/s is refused there
    g, spec = (gpu if isinstance(gpu, GPUSpec) else gpu_preset(gpu)), as_spec(model)
    t = count("context_len", context_len, 0)
    b = count("batch_size", batch_size, 1)
    q = 1 + count("k (draft tokens per pass)", k, 0)
    flops = sum(step_flops(spec, t + q, b * q, tp=tp).values())
    nbytes = (weights_read_per_step(spec, weights_dtype, tp=tp) + kv_cache_bytes(spec, t + q, b, kv_dtype, tp=tp)
              + kv_cache_bytes(spec, q, b, kv_dtype, tp=tp))
    return StepTime(flops, nbytes, flops / g.peak_flops, nbytes / g.bandwidth)


def draft_time(k: int, draft_cost: float, step_s: float) -> float:
    """Seconds the proposer takes for ``k`` drafts: ``k c`` target decode steps of ``step_s``
    seconds (Leviathan et al.'s ``c``: a draft model's step over the target's; 0 for prompt lookup).

    Raises:
        ConfigError: ``k`` not an int >= 0, ``draft_cost`` or ``step_s`` not a finite number >= 0.
    """
    return count("k (draft tokens per pass)", k, 0) * real("draft_cost", draft_cost, 0.0) * real("step_s", step_s, 0.0)


def speedup(alpha, k: int, batch: int, model, gpu, *, context_len: int = DEFAULT_CONTEXT, draft_cost: float = 0.0,
            kv_dtype: str | KVDType = "fp16", weights_dtype: str | None = None, tp: int = 1) -> float:
    """Speculative decoding's speed-up over plain decoding at batch ``B``, by the roofline:
    output tokens per second with speculation over without,
    ``E(alpha, k) T_1 / (T_verify(k) + k c T_1)`` with ``E`` :func:`expected_tokens_per_pass`,
    ``T_1`` a decode step and ``T_verify`` the pass (both :func:`verify_step_time`'s bound,
    ``k = 0`` and ``k``).  With ``T_verify = T_1`` it is the paper's ``(1 - alpha^(k+1)) /
    ((1 - alpha)(k c + 1))``.

    Assumptions: i.i.d. acceptance ``alpha`` per draft token (Leviathan et al. §3.1); every
    sequence of the batch speculates ``k`` tokens; both steps at the roofline bound (real kernels
    reach a fraction of either peak: a ratio of the same kind of bound); the context stays
    ``context_len``.  It does not check that the batch fits in memory
    (:func:`~paged_kv.memory.plan.max_batch_size` does).  Not a measurement.

    Args:
        alpha: acceptance rate per draft token, in [0, 1].
        k: draft tokens per pass (>= 0; 0 gives 1).
        batch: sequences per step (B >= 1).
        model, gpu: presets or specs (:func:`~paged_kv.memory.decode_cost.step_time`'s).
        context_len: cached tokens per sequence (t).
        draft_cost: ``c``, a draft token's cost in target decode steps (0: prompt lookup).

    Raises:
        ConfigError, UnknownPresetError: bad values or names, as :func:`verify_step_time`.
    """
    a = float(_alpha(alpha))
    one = verify_step_time(model, gpu, context_len, batch, 0, kv_dtype, weights_dtype, tp=tp).seconds
    ver = verify_step_time(model, gpu, context_len, batch, k, kv_dtype, weights_dtype, tp=tp).seconds
    return float(expected_tokens_per_pass(a, k)) * one / (ver + draft_time(k, draft_cost, one))


def crossover_batch(alpha, k: int, model, gpu, *, context_len: int = DEFAULT_CONTEXT, draft_cost: float = 0.0,
                    kv_dtype: str | KVDType = "fp16", weights_dtype: str | None = None, tp: int = 1,
                    max_batch: int | None = None) -> int | None:
    """The smallest batch ``B <= max_batch`` at which speculation stops paying (:func:`speedup`
    ``<= 1``), or ``None`` if it pays at every batch up to ``max_batch``.

    ``max_batch`` defaults to the most sequences of ``context_len + 1 + k`` tokens whose KV cache
    fits beside the weights (:func:`~paged_kv.memory.plan.max_batch_size`, its default reserve):
    past it the roofline's answer is about batches the GPU cannot hold.  Where a long context's
    K/V reads dominate the bytes, a step stays memory-bound up to that batch and speculation
    pays at every batch that fits (``None``).

    Found by bisection, which is exact because the speed-up never rises with the batch: the decode
    step and the verify pass read the same weights and nearly the same cache, so while both are
    memory-bound their ratio stays put; once the verify's ``1 + k`` times the FLOPs turn it
    compute-bound first, the ratio grows with ``B`` (FLOPs linear in ``B`` over bytes affine in
    ``B``) until both are compute-bound, where it is ``1 + k``.  (``tests/memory/test_speculation.py``
    checks the bisection against every batch.)

    Raises:
        ConfigError, UnknownPresetError: as :func:`speedup`; ``max_batch`` not an int >= 1.
    """
    if max_batch is None:
        top = max_batch_size(model, gpu, count("context_len", context_len, 0) + 1 + count("k", k, 0), kv_dtype,
                             weights_dtype=weights_dtype, tp=tp)
        if top == 0:
            raise ConfigError(f"not one sequence of {context_len + 1 + k} tokens fits on {gpu!r} beside the weights "
                              f"(tp={tp}); give max_batch to ask the roofline anyway")
    else:
        top = count("max_batch", max_batch, 1)

    def stops(b: int) -> bool:
        return speedup(alpha, k, b, model, gpu, context_len=context_len, draft_cost=draft_cost, kv_dtype=kv_dtype,
                       weights_dtype=weights_dtype, tp=tp) <= 1

    if not stops(top):
        return None
    lo, hi = 0, top                     # stops(hi) holds; stops(lo) does not (lo = 0: no batch)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if stops(mid) else (mid, hi)
    return hi
