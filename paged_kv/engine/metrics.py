"""What an engine measures over a run, as engines log it (vLLM's scheduler and iteration stats),
and the latency metrics a serving benchmark reports from it.

* :class:`EngineStats`: counters and per-step series, kept by :class:`~paged_kv.engine.LLMEngine`
  after every step.  Time is the wall clock with the tiny model, the modelled clock with a timing
  model.
* Latency as a **distribution**, as vLLM's serving benchmark reports it (``vllm bench serve``,
  ``vllm/benchmarks/serve.py``): :func:`percentile` (linear between the two nearest ranks, numpy's
  default, which that benchmark uses), :func:`summarize` (mean, p50, p90, p99, max), and
  :func:`inter_token_latencies`, every gap between two consecutive tokens of every request pooled
  into one sample (the benchmark's ITL; a request's TPOT is the mean of its own gaps).
* **Goodput** under a service-level objective (:class:`SLO`: a TTFT and a TPOT bound, both met for
  a request to count).  :func:`slo_attainment` is the share of requests that meet it;
  :func:`request_goodput` the requests meeting it per second of the run (``vllm bench serve
  --goodput``, whose help text refers to DistServe for the definition); :func:`goodput_rate`
  DistServe's own definition (Zhong et al., OSDI 2024, §1): "the maximum request rate that can be
  served adhering to the SLO attainment goal (say, 90%)", read off attainment measured at several
  rates.

Legend: N requests; G gaps (all requests' inter-token gaps together).  Units: seconds.

Plain Python, no numpy (the browser build runs it), computing what numpy computes to the last bit:
:func:`percentile` as ``numpy.percentile``'s default method, the mean as ``numpy.mean`` (its
pairwise summation, :func:`pairwise_sum`); ``tests/engine/test_metrics.py`` checks both against
numpy on random samples.
"""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass, field, fields
from typing import Iterable, Sequence

from ..errors import ConfigError
from ..validate import real

__all__ = ["DISTSERVE_CHATBOT_OPT13B", "EngineStats", "SLO", "goodput_rate", "inter_token_latencies",
           "pairwise_sum", "percentile", "request_goodput", "slo_attainment", "summarize"]


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
        num_draft_tokens, num_accepted_tokens: with speculative decoding, draft tokens verified
            and accepted (vLLM's ``vllm:spec_decode_num_draft_tokens`` and
            ``..._num_accepted_tokens``); :attr:`acceptance_rate` is their ratio.
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
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

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
    def acceptance_rate(self) -> float:
        """Accepted / drafted draft tokens (vLLM's draft acceptance rate); ``nan`` before any draft."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else math.nan

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


# --- latency distributions --------------------------------------------------------------------------

def _sample(values, label: str) -> list[float]:
    """``values`` (numbers, nested sequences of them, or an array: flattened) as a list of floats
    without NaNs (a one-token output has no TPOT: left out), or ConfigError naming ``label``."""
    if isinstance(values, numbers.Real):
        values = [values]
    elif hasattr(values, "tolist"):                # an array (numpy's, if loaded): its values as Python's
        values = values.tolist()
        values = values if isinstance(values, list) else [values]
    if isinstance(values, (str, bytes)):
        raise ConfigError(f"{label} must be numbers (seconds), got {values!r:.80}")
    out: list[float] = []
    try:
        stack = [iter(values)]
        while stack:
            for v in stack[-1]:
                if isinstance(v, (list, tuple)):
                    stack.append(iter(v))
                    break
                out.append(float(v))
            else:
                stack.pop()
    except (TypeError, ValueError):
        raise ConfigError(f"{label} must be numbers (seconds), got {values!r:.80}") from None
    return [v for v in out if not math.isnan(v)]


def _floats(values, label: str) -> list[float]:
    """``values`` flattened to floats, NaNs kept (one per request), or ConfigError naming ``label``."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    try:
        return [float(v) for v in (values if isinstance(values, list) else list(values))]
    except (TypeError, ValueError):
        raise ConfigError(f"{label} must be numbers (seconds), one per request, got {values!r:.80}") from None


def pairwise_sum(x: Sequence[float]) -> float:
    """The sum of ``x`` as numpy adds a float64 array (``numpy.add.reduce``): from 0.0, by pairwise
    summation, below 8 values in order, up to 128 in eight running sums, above that the two halves
    (split at a multiple of 8) summed apart (numpy's ``pairwise_sum``, ``loops_utils.h.src``).
    Its rounding error grows as ``log n`` where a running sum's grows as ``n``."""
    def block(lo: int, n: int) -> float:
        if n < 8:
            res = 0.0
            for i in range(lo, lo + n):
                res += x[i]
            return res
        if n <= 128:
            r = [x[lo + j] for j in range(8)]
            i = 8
            while i < n - n % 8:
                for j in range(8):
                    r[j] += x[lo + i + j]
                i += 8
            res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
            for k in range(lo + i, lo + n):
                res += x[k]
            return res
        half = n // 2
        half -= half % 8
        return block(lo, half) + block(lo + half, n - half)

    return 0.0 + block(0, len(x))


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's ``_lerp``: from the nearer end, so ``t = 1`` gives ``b`` exactly."""
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def _percentile_sorted(x: list[float], q: float) -> float:
    """The ``q``-th percentile of the sorted, NaN-free ``x`` (not empty), as ``numpy.percentile``'s
    ``"linear"`` method computes it, operation for operation."""
    n = len(x)
    h = (n - 1) * (q / 100)
    if h >= n - 1:                 # numpy takes the last value twice (its weight then is moot)
        return _lerp(x[-1], x[-1], h + 1)
    lo = math.floor(h)
    return _lerp(x[lo], x[lo + 1], h - lo)


def percentile(values, q: float) -> float:
    """The ``q``-th percentile of ``values`` (s), linear between the two nearest ranks: with the
    ``n`` values sorted as ``x[0] <= ... <= x[n-1]``, rank ``h = (n - 1) q / 100`` and the result
    ``x[floor h] + (h - floor h) (x[floor h + 1] - x[floor h])`` (numpy's default method, the one
    vLLM's serving benchmark uses, computed as numpy does: the same float to the last bit).  NaNs
    are left out; ``nan`` for no values.

    Raises:
        ConfigError: ``q`` outside 0..100, or values that are not numbers.
    """
    q = real("q (percent, 0 to 100)", q, 0.0, 100.0)
    x = sorted(_sample(values, "values"))
    return _percentile_sorted(x, q) if x else math.nan


def summarize(values, qs: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
    """``{"n", "mean", "p50", "p90", "p99", "max"}`` (one ``"p<q>"`` per entry of ``qs``) of
    ``values`` (s; NaNs left out): how a benchmark prints a latency.  With few values the high
    percentiles sit near the maximum: p99 of 5 values is 96% of the way from the 4th to the 5th.
    Every entry but ``n`` is ``nan`` for no values.

    Raises:
        ConfigError: a ``q`` outside 0..100, or values that are not numbers.
    """
    x = _sample(values, "values")
    out = {"n": len(x), "mean": pairwise_sum(x) / len(x) if x else math.nan}    # in the given order, as numpy
    x.sort()
    for q in qs:
        q = real("q (percent, 0 to 100)", q, 0.0, 100.0)
        out[f"p{q:g}"] = _percentile_sorted(x, q) if x else math.nan
    out["max"] = x[-1] if x else math.nan
    return out


def inter_token_latencies(outputs: Iterable) -> list[float]:
    """``[G]`` every inter-token gap (s) of every request in ``outputs``
    (:class:`~paged_kv.engine.RequestOutput`), pooled in request order: the sample whose
    distribution a serving benchmark reports as ITL (vLLM's ``vllm bench serve`` pools the gaps
    of all requests the same way).  A request of ``k`` token steps gives ``k - 1`` gaps.

    Raises:
        ConfigError: an item without ``itl`` (not a RequestOutput).
    """
    gaps: list[float] = []
    for o in outputs:
        if not hasattr(o, "itl"):
            raise ConfigError(f"outputs must be RequestOutputs (with .itl), got {type(o).__name__}")
        gaps += o.itl
    return [float(g) for g in gaps]


# --- service-level objectives and goodput -------------------------------------------------------------

@dataclass(frozen=True)
class SLO:
    """A latency service-level objective: a request meets it when its TTFT is at most ``ttft_s``
    **and** its TPOT at most ``tpot_s`` (both in seconds, > 0), DistServe's two-bound SLO (§2).
    A one-token output has no TPOT (``nan``) and is judged on its TTFT alone, as vLLM's benchmark
    counts its TPOT as 0.  ``name``: where the numbers come from.

    Raises:
        ConfigError: a bound that is not a positive number.
    """

    ttft_s: float
    tpot_s: float
    name: str = ""

    def __post_init__(self) -> None:
        for label in ("ttft_s", "tpot_s"):
            object.__setattr__(self, label, real(f"{label} (s)", getattr(self, label), 0.0, low_open=True))

    def met(self, ttft_s, tpot_s):
        """``[N]`` bool: which requests meet both bounds, from their ``[N]`` TTFTs and TPOTs (s): a
        numpy bool array if either input is a numpy array (numpy is then loaded; it is looked up,
        never imported), else a list of bools.

        Raises:
            ConfigError: the two arrays differ in length, or a TTFT is ``nan`` (a request that
                never produced a token cannot be judged: serve the run to the end first).
        """
        ttft, tpot = _floats(ttft_s, "ttft_s"), _floats(tpot_s, "tpot_s")
        if len(ttft) != len(tpot):
            raise ConfigError(f"one TTFT and one TPOT per request: got {len(ttft)} TTFTs and {len(tpot)} TPOTs")
        missing = sum(math.isnan(t) for t in ttft)
        if missing:
            raise ConfigError(f"{missing} requests have no first token (TTFT nan): "
                              f"judge an SLO on finished requests only")
        met = [t <= self.ttft_s and (math.isnan(p) or p <= self.tpot_s) for t, p in zip(ttft, tpot)]
        np = sys.modules.get("numpy")
        if np is not None and (isinstance(ttft_s, np.ndarray) or isinstance(tpot_s, np.ndarray)):
            return np.array(met, dtype=bool)
        return met


# DistServe's chatbot SLO for OPT-13B on ShareGPT (Zhong et al., OSDI 2024, Table 1): a cited number,
# typed in; the paper says it set its SLOs "empirically based on their service target".
DISTSERVE_CHATBOT_OPT13B = SLO(0.25, 0.1, "DistServe, OSDI 2024, Table 1: chatbot, OPT-13B, ShareGPT")


def slo_attainment(ttft_s, tpot_s, slo: SLO) -> float:
    """The share of requests meeting ``slo`` (0..1; DistServe's "SLO attainment"), from their
    ``[N]`` TTFTs and TPOTs (s); ``nan`` for no requests.

    Raises:
        ConfigError: ``slo`` not an :class:`SLO`, or (from :meth:`SLO.met`) mismatched arrays.
    """
    if not isinstance(slo, SLO):
        raise ConfigError(f"slo must be an SLO, got {slo!r:.60}")
    met = slo.met(ttft_s, tpot_s)
    return sum(bool(m) for m in met) / len(met) if len(met) else math.nan


def request_goodput(ttft_s, tpot_s, slo: SLO, duration_s: float) -> float:
    """Requests meeting ``slo`` per second of a run that lasted ``duration_s`` (s, > 0): the request
    goodput of ``vllm bench serve --goodput`` (completed requests that meet every bound, divided by
    the benchmark's duration).  Requests that miss count for nothing, however fast the others are.

    Raises:
        ConfigError: ``duration_s`` not > 0, ``slo`` not an :class:`SLO`, or mismatched arrays.
    """
    if not isinstance(slo, SLO):
        raise ConfigError(f"slo must be an SLO, got {slo!r:.60}")
    duration_s = real("duration_s (s)", duration_s, 0.0, low_open=True)
    return sum(bool(m) for m in slo.met(ttft_s, tpot_s)) / duration_s


def goodput_rate(rates, attainments, goal: float = 0.9) -> float:
    """DistServe's goodput (§1): the request rate (req/s) up to which SLO attainment stays at least
    ``goal``, from attainments measured at increasing ``rates``: where the curve first falls below
    the goal, linear between the two rates around the crossing (as :func:`paged_kv.sim.capacity`
    reads a latency curve).  The last rate if it never falls below, and 0 if even the first rate
    misses the goal: both lower bounds (try higher, or lower, rates).

    Raises:
        ConfigError: rates and attainments of different lengths or none, rates not increasing,
            an attainment outside 0..1, or ``goal`` outside (0, 1].
    """
    goal = real("goal (share of requests, 0 to 1)", goal, 0.0, 1.0, low_open=True)
    rates, att = [float(r) for r in rates], [float(a) for a in attainments]
    if not rates or len(rates) != len(att):
        raise ConfigError(f"one attainment per rate: got {len(rates)} rates and {len(att)} attainments")
    if any(b <= a for a, b in zip(rates, rates[1:])):
        raise ConfigError(f"rates must increase, got {rates}")
    if any(not 0.0 <= a <= 1.0 for a in att):
        raise ConfigError(f"an attainment is a share of requests, 0 to 1: got {att}")
    if att[0] < goal:
        return 0.0
    for (r0, a0), (r1, a1) in zip(zip(rates, att), zip(rates[1:], att[1:])):
        if a1 < goal:
            return r0 + (r1 - r0) * (a0 - goal) / (a0 - a1)
    return rates[-1]
