"""Serving a trace of requests with the engine: arrivals over time, latency against request rate.

:func:`serve_trace` feeds a :class:`~paged_kv.sim.Trace` (arrival times, prompt and output
lengths) to an :class:`~paged_kv.engine.LLMEngine` as the clock passes each arrival, the way a
benchmark client does, and returns per-request times.  With a timing model (``model=None``) the
engine runs no tensors: the same scheduler and block manager as with the tiny model, and each
step costs what :class:`paged_kv.sim.IterationTime` charges for the tokens it reads and prefills
(for the paper's set-up, OPT-13B on an A100-40GB by roofline: :class:`paged_kv.sim.ServingSetup`).

:func:`rate_sweep` repeats that over request rates for several engine configurations: the shape of
the vLLM paper's Figure 12 (normalized latency against request rate, §6.2).

:func:`shared_prefix_workload` makes requests whose prompts start with one shared few-shot prefix
(the paper's §6.4 translation workload, in shape), for prefix caching (chapter 8); its prompts are
token ids, which :func:`serve_trace` then sends instead of lengths alone.

Legend: N requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from ..model.sampling import SamplingParams
from ..sim import ServingSetup, Trace, normalized_latency, sweep_rates
from ..validate import count, real
from .config import EngineConfig
from .llm_engine import LLMEngine
from .metrics import SLO, EngineStats, inter_token_latencies, request_goodput, slo_attainment

__all__ = ["PAPER_SHARED_PREFIX", "ServeResult", "SharedPrefixWorkload", "SwapTime", "engine_config_for",
           "rate_sweep", "serve_static", "serve_sweep", "serve_trace", "shared_prefix_workload"]

PCIE4_X16_BYTES_PER_S = 25e9     # an assumption: PCIe 4.0 x16 is 32 GB/s per direction, ~25 GB/s achieved
COPY_CALL_S = 10e-6              # an assumption: fixed cost of one small cudaMemcpyAsync (launch + DMA set-up)

# The vLLM paper's shared-prefix result (Kwon et al., SOSP 2023, §6.4, Fig. 16): LLaMA-13B serving
# WMT16 English-to-German translation whose prompts share a few-shot prefix; vLLM's throughput
# over Orca (Oracle).  Cited facts, typed in; not results of this package.
PAPER_SHARED_PREFIX = {
    "source": "Kwon et al., SOSP 2023 (arXiv:2309.06180), §6.4, Fig. 16",
    "model": "LLaMA-13B", "baseline": "Orca (Oracle)", "workload": "WMT16 En-De translation",
    "one-shot": {"prefix_tokens": 80, "speedup": 1.67},
    "five-shot": {"prefix_tokens": 341, "speedup": 3.58},
}


@dataclass(frozen=True)
class SwapTime:
    """Seconds to move ``num_blocks`` blocks one way between GPU and CPU memory.

    ``copies * per_copy_s + bytes / bytes_per_s``, where ``bytes = num_blocks * block_size *
    kv_bytes_per_token``.  ``per_block_copies=True`` models vLLM v0's ``swap_blocks``, one
    ``cudaMemcpyAsync`` per block, per layer, for K and for V (``copies = 2 * L * num_blocks``): with
    small blocks the fixed cost per copy dominates, which is why the paper (§7.3, Fig. 19) finds
    swapping slow at small block sizes.  ``False`` models this book's
    :func:`kernels.cache_ops.swap_blocks`, which gathers the blocks and copies once per layer and
    tensor (``copies = 2 * L``).

    The two hardware figures are assumptions, not measurements: ``bytes_per_s`` (default 25 GB/s, a
    PCIe 4.0 x16 link, 32 GB/s per direction in theory) and ``per_copy_s`` (default 10 us).
    """

    kv_bytes_per_token: int
    num_layers: int
    bytes_per_s: float = PCIE4_X16_BYTES_PER_S
    per_copy_s: float = COPY_CALL_S
    per_block_copies: bool = True

    def __post_init__(self) -> None:
        count("kv_bytes_per_token", self.kv_bytes_per_token)
        count("num_layers", self.num_layers)
        for label in ("bytes_per_s", "per_copy_s"):
            real(label, getattr(self, label), 0.0, low_open=label == "bytes_per_s")

    def __call__(self, num_blocks: int, block_size: int) -> float:
        copies = 2 * self.num_layers * (num_blocks if self.per_block_copies else 1)
        return copies * self.per_copy_s + num_blocks * block_size * self.kv_bytes_per_token / self.bytes_per_s


@dataclass
class ServeResult:
    """What :func:`serve_trace` measured.

    Attributes:
        trace: the requests served.  ``n``: samples per request.
        first_token_s, finish_s: ``[N]`` float64, clock times (s) of each request's first token and
            of its last.
        stats: the engine's :class:`EngineStats` (steps, preemptions, swapped blocks, KV usage).
        first_scheduled_s: ``[N]`` float64, clock times (s) of each request's first admission
            (``None`` where not measured: :func:`serve_static`).
        itl_s: ``[G]`` float64, every gap (s) between two consecutive token steps of every
            request, pooled in request order (the sample a benchmark's ITL percentiles come from).
    """

    trace: Trace
    n: int
    first_token_s: np.ndarray
    finish_s: np.ndarray
    stats: EngineStats
    first_scheduled_s: np.ndarray | None = None
    itl_s: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def ttft_s(self) -> np.ndarray:
        """``[N]`` time to first token (s)."""
        return self.first_token_s - self.trace.arrival_s

    @property
    def queue_s(self) -> np.ndarray:
        """``[N]`` time each request waited before its first admission (s; vLLM's queue time).

        Raises:
            ConfigError: the run did not record admissions (:func:`serve_static`)."""
        if self.first_scheduled_s is None:
            raise ConfigError("this result has no admission times (serve_static does not record them)")
        return self.first_scheduled_s - self.trace.arrival_s

    @property
    def latency_s(self) -> np.ndarray:
        """``[N]`` end-to-end latency (s)."""
        return self.finish_s - self.trace.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        """``[N]`` time per output token (s) after the first: ``(finish - first token) / (output
        tokens - 1)``, ``nan`` for a one-token output."""
        out = self.trace.output_len.astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(out > 1, (self.finish_s - self.first_token_s) / (out - 1), np.nan)

    @property
    def duration_s(self) -> float:
        """The run's span (s): first arrival to last finish (a benchmark's duration)."""
        return float(self.finish_s.max() - self.trace.arrival_s.min())

    def slo_attainment(self, slo: SLO) -> float:
        """The share of requests meeting ``slo`` (:func:`paged_kv.engine.metrics.slo_attainment`)."""
        return slo_attainment(self.ttft_s, self.tpot_s, slo)

    def goodput(self, slo: SLO) -> float:
        """Requests meeting ``slo`` per second of :attr:`duration_s`
        (:func:`paged_kv.engine.metrics.request_goodput`)."""
        return request_goodput(self.ttft_s, self.tpot_s, slo, self.duration_s)

    @property
    def normalized_latency(self) -> float:
        """The paper's metric (§6.1), :func:`paged_kv.sim.normalized_latency` (s/token)."""
        return normalized_latency(self.trace, self.finish_s)

    @property
    def throughput(self) -> float:
        """Requests finished per second of clock, from the first arrival to the last finish."""
        span = self.duration_s
        return len(self.trace) / span if span > 0 else math.nan


def engine_config_for(setup: ServingSetup, reservation: str = "none", block_size: int = 16,
                      preemption_mode: str = "recompute", **kw) -> EngineConfig:
    """An :class:`EngineConfig` over ``setup``'s KV budget: ``pool_slots // block_size`` blocks,
    ``max_model_len = setup.max_seq_len``, no watermark unless given, and a token budget no step
    reaches (the paper's vLLM had no chunked prefill; the simulator of chapter 4 has no budget)."""
    kw.setdefault("watermark", 0.0)
    kw.setdefault("max_num_batched_tokens", setup.pool_slots)
    return EngineConfig(block_size=block_size, num_gpu_blocks=setup.pool_slots // block_size,
                        max_model_len=setup.max_seq_len, reservation=reservation,
                        preemption_mode=preemption_mode, **kw)


def serve_trace(trace: Trace, config: EngineConfig, iteration_time, n: int = 1,
                use_tqdm: bool = False, swap_time=None, prompts=None) -> ServeResult:
    """Serve ``trace`` on a timing-model engine: request ``i`` arrives at ``trace.arrival_s[i]``
    with a ``prompt_len[i]``-token prompt and generates ``output_len[i]`` tokens per sample.

    Args:
        config: the engine's knobs.  iteration_time: seconds per step, see :class:`TimingRunner`.
        n: samples per request (parallel sampling: they share the prompt's blocks).
        use_tqdm: a progress bar over finished requests.
        swap_time: seconds per swap, see :class:`SwapTime` (``None``: swaps are free).
        prompts: the prompts' token ids, one list per request of ``prompt_len[i]`` tokens (what
            prefix caching looks at); ``None``: every token is 0 (only lengths matter then, and
            with prefix caching on every prompt would hit every other: do not mix the two).

    A request the pool can never hold raises :class:`~paged_kv.errors.AdmissionError` before any
    request is served.
    """
    if not isinstance(trace, Trace):
        raise ConfigError(f"trace must be a paged_kv.sim.Trace, got {type(trace).__name__}")
    n = count("n (samples per request)", n)
    if prompts is not None and (len(prompts) != len(trace) or
                                [len(p) for p in prompts] != trace.prompt_len.tolist()):
        raise ConfigError(f"prompts must be {len(trace)} token lists of the trace's prompt lengths")
    engine = LLMEngine(None, config, iteration_time=iteration_time, swap_time=swap_time)
    arrivals, outputs = trace.arrival_s.tolist(), trace.output_len.tolist()
    prompts = [[0] * p for p in trace.prompt_len.tolist()] if prompts is None else [list(p) for p in prompts]
    params = [SamplingParams(max_tokens=o, n=n, temperature=1.0 if n > 1 else 0.0, seed=0 if n > 1 else None)
              for o in outputs]
    for p, sp in zip(prompts, params):               # refuse the whole trace before serving any
        engine.check_admissible(p, sp)
    bar = None
    if use_tqdm:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(trace), desc=trace.name, unit="req")
    nxt, done = 0, 0
    while done < len(trace):
        while nxt < len(trace) and arrivals[nxt] <= engine.clock:
            engine.add_request(prompts[nxt], params[nxt], request_id=nxt, arrival=arrivals[nxt])
            nxt += 1
        if not engine.has_unfinished_requests():
            engine.clock = arrivals[nxt]             # idle until the next arrival
            continue
        for out in engine.step():
            if out.finished:
                done += 1
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    outs = [engine.output(i) for i in range(len(trace))]
    first = np.array([o.first_token for o in outs])
    finish = np.array([o.finish for o in outs])
    scheduled = np.array([o.first_scheduled for o in outs])
    return ServeResult(trace, n, first, finish, engine.stats, first_scheduled_s=scheduled,
                       itl_s=np.asarray(inter_token_latencies(outs), dtype=np.float64))


def serve_sweep(setup: ServingSetup, rates, configs: dict[str, EngineConfig], n: int = 1,
                num_requests: int = 300, seed: int = 0,
                stop_above: float | None = None) -> dict[str, tuple[list[float], list[ServeResult]]]:
    """Serve ``setup``'s trace at each request rate (req/s) on each named engine config, by
    :func:`paged_kv.sim.sweep_rates` (every config serves the same trace at each rate), keeping
    every :class:`ServeResult`: ``{name: (rates served, results)}``, for any metric of the runs
    (normalized latency, TTFT percentiles, SLO attainment).  ``stop_above`` (s/token): a config's
    higher rates are skipped once its normalized latency exceeds it."""
    step_time = setup.iteration_time()
    kept: dict[str, list[ServeResult]] = {name: [] for name in configs}

    def serve(name: str, config: EngineConfig):
        def run(trace: Trace) -> float:
            kept[name].append(serve_trace(trace, config, step_time, n))
            return kept[name][-1].normalized_latency
        return run
    curves = sweep_rates(setup, rates, {name: serve(name, c) for name, c in configs.items()},
                         num_requests, seed, stop_above)
    return {name: (curves[name][0], kept[name]) for name in configs}


def rate_sweep(setup: ServingSetup, rates, configs: dict[str, EngineConfig], n: int = 1,
               num_requests: int = 300, seed: int = 0,
               stop_above: float | None = None) -> dict[str, tuple[list[float], list[float]]]:
    """Normalized latency (s/token) against request rate (req/s) for each named engine config on
    ``setup``'s lengths and step time (:func:`serve_sweep`; ``stop_above`` in s/token):
    ``{name: (rates, latencies)}``."""
    runs = serve_sweep(setup, rates, configs, n, num_requests, seed, stop_above)
    return {name: (xs, [r.normalized_latency for r in results]) for name, (xs, results) in runs.items()}


def serve_static(trace: Trace, batch_size: int, iteration_time) -> ServeResult:
    """The same trace with **static batching**, the way serving worked before iteration-level
    scheduling (Orca, OSDI 2022): when no batch runs, up to ``batch_size`` waiting requests start
    together (one prefill step for all of them), then decode in lockstep until the *longest* is
    done; a request's answer is complete when its own last token is out, but nobody joins the batch
    until every member has finished.  Memory is not modelled (an upper bound for static batching).
    """
    if not isinstance(trace, Trace):
        raise ConfigError(f"trace must be a paged_kv.sim.Trace, got {type(trace).__name__}")
    batch_size = count("batch_size", batch_size)
    arr, P, O = trace.arrival_s.tolist(), trace.prompt_len.tolist(), trace.output_len.tolist()
    first, finish = [math.nan] * len(arr), [math.nan] * len(arr)
    gaps: list[list[float]] = [[] for _ in arr]          # per request, its inter-token gaps (s)
    stats, clock, nxt = EngineStats(), 0.0, 0
    while nxt < len(arr):
        clock = max(clock, arr[nxt])
        batch = [i for i in range(nxt, len(arr)) if arr[i] <= clock][:batch_size]
        nxt = batch[-1] + 1
        clock += iteration_time(sum(P[i] for i in batch), sum(P[i] for i in batch))  # prefill + first token
        stats.steps += 1
        for i in batch:
            first[i] = clock
            if O[i] == 1:
                finish[i] = clock
        held = sum(P[i] + 1 for i in batch)
        for k in range(2, max(O[i] for i in batch) + 1):
            dt = iteration_time(held, 0)
            clock += dt
            held += len(batch)
            stats.steps += 1
            for i in batch:
                if O[i] >= k:
                    gaps[i].append(dt)
                if O[i] == k:
                    finish[i] = clock
    stats.clock_s = clock
    stats.generated = int(sum(O))
    return ServeResult(trace, 1, np.array(first), np.array(finish), stats,
                       itl_s=np.array([g for per_request in gaps for g in per_request], dtype=np.float64))


@dataclass(frozen=True)
class SharedPrefixWorkload:
    """Requests whose prompts are one shared prefix followed by a request's own text.

    Attributes:
        trace: arrivals and lengths (prompt = prefix + own tokens).
        prompts: each request's token ids (the prefix is tokens ``1 .. prefix_len``; own tokens are
            drawn from ids above it, so no two requests share more than the prefix by accident).
        prefix_len: tokens of the shared prefix.
    """

    trace: Trace
    prompts: list
    prefix_len: int

    @property
    def prompt_tokens(self) -> int:
        return int(self.trace.prompt_len.sum())


def shared_prefix_workload(num_requests: int, prefix_len: int, rate_per_s: float | None = None,
                           own_mean: float = 30.0, output_mean: float = 30.0, sigma: float = 0.5,
                           num_prefixes: int = 1, warm: bool = False, seed: int = 0) -> SharedPrefixWorkload:
    """A translation-like workload in the shape of the paper's §6.4: every prompt is a shared
    few-shot prefix (``prefix_len`` tokens; 0 for none) then the request's own sentence.

    ``num_prefixes``: how many different prefixes (say, one per task or per system prompt); each
    request picks one uniformly at random.  ``warm``: request 0 arrives alone, a microsecond before
    the others, so its prefix is computed and cached before they come (as if the provider had
    stored the prefix's K/V ahead, the paper's §4.4).

    The own and output lengths are log-normal with means ``own_mean`` and ``output_mean`` tokens
    (spread ``sigma``), at least 1 token: an assumption standing in for WMT16 En-De sentence
    lengths, which the paper does not print.  Arrivals are Poisson at ``rate_per_s``, or all at
    time 0 with ``None`` (an offline batch, which measures throughput at saturation).
    """
    num_requests = count("num_requests", num_requests)
    prefix_len = count("prefix_len (tokens)", prefix_len, 0)
    own_mean, output_mean = (real(k, v, 0.0, low_open=True) for k, v in (("own_mean", own_mean),
                                                                         ("output_mean", output_mean)))
    sigma = real("sigma", sigma, 0.0)
    rng = np.random.default_rng(count("seed", seed, 0))

    def lognormal(mean):
        return np.maximum(1, np.rint(rng.lognormal(np.log(mean) - sigma ** 2 / 2, sigma, num_requests))).astype(np.int64)
    own, out = lognormal(own_mean), lognormal(output_mean)
    num_prefixes = count("num_prefixes", num_prefixes)
    if rate_per_s is None:
        arrivals = np.zeros(num_requests)
    else:
        rate_per_s = real("rate_per_s", rate_per_s, 0.0, low_open=True)
        arrivals = np.cumsum(rng.exponential(1.0 / rate_per_s, num_requests))
    if warm:
        arrivals[1:] = np.maximum(arrivals[1:], arrivals[0] + 1e-6)
    first = num_prefixes * prefix_len + 1                     # own tokens start above every prefix
    which = rng.integers(0, num_prefixes, num_requests)
    prompts = [list(range(1 + p * prefix_len, 1 + (p + 1) * prefix_len)) +
               rng.integers(first, first + 30000, int(k)).tolist() for p, k in zip(which.tolist(), own)]
    trace = Trace(arrivals, own + prefix_len, out, f"shared prefix {prefix_len}")
    return SharedPrefixWorkload(trace, prompts, prefix_len)
