"""The step simulator: an iteration-level scheduler driving one KV memory policy over a trace.

Pure bookkeeping, no tensors.  Each step (one model iteration, as in Orca's iteration-level
scheduling and vLLM's scheduler, vLLM paper §4.5 and §6.1) does, in this order:

1. requests that have arrived by the step's start join the waiting queue (FCFS);
2. every running request grows by one token; if the policy lacks blocks for that (paging only),
   the running request that arrived last is preempted (vLLM's first-come-first-served priority)
   and its tokens are recomputed later (vLLM's default, §4.5): it goes back to the front of the
   queue with prompt = all its tokens;
3. if nothing was preempted, waiting requests are admitted in order while the policy can place
   them (head-of-line blocking, as both systems do) and the batch has room; an admitted request
   prefills and gets its first output token in this step;
4. memory is classified (:mod:`paged_kv.policies`), the step's duration is charged, and requests
   that produced their last token are freed.

Only the memory policy differs between runs.  Time comes from :class:`IterationTime`; the default
(1 s per step) makes a hand-made trace's arrival times read as step numbers.  The paper's set-up
(:data:`PAPER_SETUP`, OPT-13B on one A100-40GB) charges a roofline estimate instead.

A step costs O(1) Python work plus O(1) per event (admission, completion, preemption, new
block), so 10,000 requests take seconds (``benchmarks/simulate_bench.py``).
"""

from __future__ import annotations

import heapq
import inspect
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .errors import ConfigError, PagedKVError
from .policies import CATEGORIES, MemoryPolicy, make_policy
from .traces import Trace, synthetic_trace

__all__ = ["A100_40GB", "IterationTime", "Layout", "PAPER_RESULTS", "PAPER_SETUP", "ServingSetup",
           "SimResult", "comparison_rows", "format_table", "simulate"]

STEP_FIELDS = ("time_s", "dt_s", "running", "waiting", *CATEGORIES, "admitted", "prefill_tokens",
               "preempted", "finished")

# NVIDIA A100 40GB SXM4 datasheet: HBM2 bandwidth 1,555 GB/s; fp16 Tensor Core 312 TFLOPS (dense).
A100_40GB = {"hbm_bytes_per_s": 1.555e12, "fp16_flops_per_s": 312e12,
             "source": "NVIDIA A100 Tensor Core GPU datasheet (40GB SXM4)"}

# The numbers the paper prints, to show beside ours.  Cited facts, not results of this package.
PAPER_RESULTS = {
    "citation": ("W. Kwon et al., \"Efficient Memory Management for Large Language Model Serving "
                 "with PagedAttention\", SOSP 2023 (arXiv:2309.06180)"),
    # Fig. 2: share of KV-cache memory holding token states, averaged over the §6.2 experiment.
    "token_state_share": {"existing systems (range)": (0.204, 0.382), "vLLM": 0.963},
    # Fig. 13a: average number of batched requests, OPT-13B, ShareGPT trace at 2 req/s.
    "mean_batch": {"max": 7.00, "pow2": 9.81, "oracle": 13.62, "paged": 30.42},
}


@dataclass(frozen=True)
class IterationTime:
    """Seconds one step takes: ``base_s + per_kv_token_s * kv_tokens + per_prefill_token_s * prefill``.

    ``kv_tokens`` is the tokens held in the KV cache during the step (what decode attention
    reads); ``prefill`` the prompt tokens prefilled in it.
    """

    base_s: float = 1.0
    per_kv_token_s: float = 0.0
    per_prefill_token_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.base_s > 0 and self.per_kv_token_s >= 0 and self.per_prefill_token_s >= 0):
            raise ConfigError(f"need base_s > 0 and non-negative per-token costs, got {self}")

    def __call__(self, kv_tokens: int, prefill_tokens: int) -> float:
        return self.base_s + self.per_kv_token_s * kv_tokens + self.per_prefill_token_s * prefill_tokens

    @classmethod
    def roofline(cls, weight_bytes: float, kv_bytes_per_token: float, hbm_bytes_per_s: float,
                 flops_per_s: float, efficiency: float = 1.0) -> "IterationTime":
        """A memory-bound decode step: read every weight once and every cached K/V once;
        prefill compute-bound at 2 FLOPs per parameter per token (fp16 weights: params = bytes / 2).

        ``efficiency`` (0, 1] scales the hardware peaks; 1 is the ideal, an optimistic bound.
        """
        bw, fl = hbm_bytes_per_s * efficiency, flops_per_s * efficiency
        return cls(weight_bytes / bw, kv_bytes_per_token / bw, 2 * (weight_bytes / 2) / fl)


@dataclass(frozen=True)
class Layout:
    """The pool slot by slot at one step (``-1``: idle): ``owner [pool]`` int32 request id
    (-1 none), ``category [pool]`` int8 index into :data:`paged_kv.policies.CATEGORIES`."""

    step: int
    time_s: float
    owner: np.ndarray
    category: np.ndarray


@dataclass
class SimResult:
    """What :func:`simulate` recorded: one row per step, one entry per request, some layouts.

    Attributes:
        steps: name -> ``[S]`` array for each of :data:`STEP_FIELDS` (slots for the categories,
            seconds for ``time_s``/``dt_s``, counts otherwise).  A step covers
            ``[time_s, time_s + dt_s)``; the pool is idle (everything free) between steps.
        first_admit_s, finish_s: ``[N]`` float64, when each request was first admitted and freed.
        preemptions: ``[N]`` int64, times each request was preempted.
    """

    policy: str
    pool_slots: int
    trace: Trace
    steps: dict[str, np.ndarray]
    first_admit_s: np.ndarray
    finish_s: np.ndarray
    preemptions: np.ndarray
    idle_external: int = 0
    block_size: int | None = None
    layouts: list[Layout] = field(default_factory=list)

    @property
    def num_steps(self) -> int:
        return len(self.steps["time_s"])

    def window(self) -> tuple[float, float]:
        """The measurement window: from the first to the last arrival (s)."""
        return float(self.trace.arrival_s[0]), float(self.trace.arrival_s[-1])

    def time_average(self, name: str, t0: float | None = None, t1: float | None = None) -> float:
        """Time-weighted mean of a step field over ``[t0, t1]`` (default: :meth:`window`),
        with idle time counted as an empty pool."""
        w0, w1 = self.window()
        t0, t1 = (w0 if t0 is None else t0), (w1 if t1 is None else t1)
        if not t1 > t0:
            raise ConfigError(f"empty averaging window [{t0}, {t1}]")
        start = self.steps["time_s"]
        overlap = np.clip(np.minimum(start + self.steps["dt_s"], t1) - np.maximum(start, t0), 0, None)
        idle = {"free": self.pool_slots - self.idle_external, "external": self.idle_external}.get(name, 0)
        busy = float(overlap.sum())
        return (float((self.steps[name] * overlap).sum()) + idle * ((t1 - t0) - busy)) / (t1 - t0)

    def shares(self) -> dict[str, float]:
        """Time-averaged fraction of the pool in each category (sums to 1)."""
        return {c: self.time_average(c) / self.pool_slots for c in CATEGORIES}

    def used_shares(self) -> dict[str, float]:
        """As :meth:`shares` but of the memory not free (token states + reserved + fragmentation):
        the basis of the paper's Fig. 2, which was measured on a full pool."""
        s = self.shares()
        used = 1.0 - s["free"]
        return {c: s[c] / used for c in CATEGORIES if c != "free"}

    def mean_batch(self) -> float:
        """Time-averaged number of running requests over :meth:`window` (the paper's Fig. 13)."""
        return self.time_average("running")

    def summary(self) -> dict:
        """Headline numbers: mean batch, shares, throughput, latency, preemptions, steps."""
        st, used = self.steps, self.used_shares()
        busy = float(st["dt_s"].sum())
        lat = self.finish_s - self.trace.arrival_s
        return {"policy": self.policy, "mean_batch": self.mean_batch(),
                "token_share_of_used": used["token_states"],
                "waste_share_of_used": 1.0 - used["token_states"],
                "free_share": self.shares()["free"],
                "tokens_per_step": float(st["running"].mean()) if self.num_steps else 0.0,
                "tokens_per_s": float(st["running"].sum()) / busy if busy else 0.0,
                "mean_latency_s": float(lat.mean()), "max_waiting": int(st["waiting"].max(initial=0)),
                "preemptions": int(self.preemptions.sum()), "steps": self.num_steps}


def _layout_steps(layouts) -> tuple[int, set]:
    if layouts is None:
        return 0, set()
    if isinstance(layouts, (int, np.integer)):
        if layouts < 1:
            raise ConfigError(f"layouts=k records every k-th step; k must be >= 1, got {layouts}")
        return int(layouts), set()
    return 0, {int(s) for s in layouts}


def simulate(trace: Trace, policy: MemoryPolicy, *, iteration_time: IterationTime | None = None,
             max_batch: int = 256, max_prefill_tokens: int | None = None, layouts=None,
             layout_times=None, check: bool = False) -> SimResult:
    """Run ``trace`` through ``policy`` (a fresh one: it is mutated) until every request finishes.

    Args:
        iteration_time: seconds per step (default :class:`IterationTime` ``()``: 1 s per step).
        max_batch: most requests running at once (vLLM's ``max_num_seqs``, 256).
        max_prefill_tokens: most prompt tokens admitted per step (``None``: no limit); the first
            admission of a step is always allowed.
        layouts: record the slot-by-slot :class:`Layout` every ``k`` steps (an int) or at the
            given step numbers (an iterable); ``None`` records none.
        layout_times: also record one per time (s) passed before the run ends: the pool at
            the first step starting at or after it (repeated when several times fall in one
            step), or the empty pool (``step=-1``) for a time when nothing ran, so runs of
            different policies over one trace line up frame by frame.
        check: after every step, recount the pool from its layout (:meth:`MemoryPolicy.check`:
            categories sum to the pool, no slot owned twice, paging's ``BS - 1`` bound).  Slow.

    Raises:
        ConfigError: a request that could never fit (longer than ``max_seq_len`` or the pool),
            a policy already in use, or bad arguments.
    """
    it = iteration_time or IterationTime()
    if policy.num_seqs:
        raise ConfigError("simulate needs a fresh policy (this one has running requests)")
    if not isinstance(max_batch, int) or max_batch < 1:
        raise ConfigError(f"max_batch must be a positive int, got {max_batch!r}")
    arr, P, O = trace.arrival_s.tolist(), trace.prompt_len.tolist(), trace.output_len.tolist()
    N = len(arr)
    for i in range(N):
        if not policy.fits(P[i], O[i]):
            raise ConfigError(f"request {i} (prompt {P[i]}, output {O[i]}) can never fit {policy!r} "
                              f"with max_seq_len {policy.max_seq_len}")
    every, at = _layout_steps(layouts)
    times = sorted(float(t) for t in (() if layout_times is None else layout_times))
    ti = 0
    idle_external = policy.split_free(None)[0]
    p_now, o_left = P[:], O[:]  # a recompute preemption turns generated tokens into prompt
    first_admit, finish = [math.nan] * N, [math.nan] * N
    npre, epoch = [0] * N, [0] * N
    waiting: deque[int] = deque()
    running: list[int] = []  # request ids (= arrival order); the largest is preempted first
    heap: list[tuple[int, int, int]] = []  # (last step, rid, epoch) per admission
    rows, recorded = [], []
    base, k_kv, k_pf = it.base_s, it.per_kv_token_s, it.per_prefill_token_s
    shortfall, append, can_admit, admit = policy.shortfall, policy.append, policy.can_admit, policy.admit
    totals, split_free, need = policy.totals, policy.split_free, policy.admission_need
    clock, step, nxt, done = 0.0, 0, 0, 0
    while done < N:
        while nxt < N and arr[nxt] <= clock:
            waiting.append(nxt)
            nxt += 1
        if not running and not waiting:  # idle until the next arrival: the pool is empty
            while ti < len(times) and times[ti] < arr[nxt]:
                recorded.append(Layout(-1, times[ti], *policy.layout(None)))
                ti += 1
            clock = arr[nxt]
            continue
        preempted = 0
        while running and shortfall(step):
            v = max(running)
            running.remove(v)
            gen = policy.length(v) - p_now[v]
            policy.free(v)
            epoch[v] += 1
            npre[v] += 1
            p_now[v] += gen
            o_left[v] -= gen
            waiting.appendleft(v)
            preempted += 1
        append(step)
        admitted = prefill = 0
        if not preempted:
            while waiting and len(running) < max_batch:
                r = waiting[0]
                p, o = p_now[r], o_left[r]
                if admitted and max_prefill_tokens is not None and prefill + p > max_prefill_tokens:
                    break
                if not can_admit(p, o):
                    break
                waiting.popleft()
                admit(r, p, o, step)
                running.append(r)
                heapq.heappush(heap, (step + o - 1, r, epoch[r]))
                if first_admit[r] != first_admit[r]:  # NaN: first admission
                    first_admit[r] = clock
                admitted += 1
                prefill += p
        if not running:
            raise PagedKVError(f"step {step}: nothing runs and request {waiting[0]} cannot be admitted")
        tok, res, internal = totals()
        head = need(p_now[waiting[0]], o_left[waiting[0]]) if waiting else None
        ext, free = split_free(head)
        dt = base + k_kv * tok + k_pf * prefill
        if check:
            policy.check(head)
        due = 0
        while ti < len(times) and clock >= times[ti]:
            ti += 1
            due += 1
        if due or (every and step % every == 0) or step in at:
            owner, cat = policy.layout(head)
            recorded.extend([Layout(step, clock, owner, cat)] * max(due, 1))
        t_start = clock
        clock += dt
        finished = 0
        while heap and heap[0][0] <= step:
            _, r, ep = heapq.heappop(heap)
            if ep != epoch[r]:
                continue  # stale: preempted since
            policy.free(r)
            running.remove(r)
            finish[r] = clock
            finished += 1
        done += finished
        rows.append((t_start, dt, len(running) + finished, len(waiting), tok, res, internal, ext, free,
                     admitted, prefill, preempted, finished))
        step += 1
    table = np.array(rows, dtype=np.float64).reshape(-1, len(STEP_FIELDS))
    steps = {name: (table[:, j] if j < 2 else table[:, j].astype(np.int64)) for j, name in enumerate(STEP_FIELDS)}
    return SimResult(policy.name, policy.pool_slots, trace, steps, np.array(first_admit), np.array(finish),
                     np.array(npre, dtype=np.int64), idle_external, getattr(policy, "block_size", None), recorded)


@dataclass(frozen=True)
class ServingSetup:
    """A serving set-up to simulate: model, KV budget, context length, trace, step time.

    The default, :data:`PAPER_SETUP`, is the paper's Fig. 13a: OPT-13B on one A100-40GB with
    12 GiB for the KV cache (Table 1: 15.7K slots), max length 2048, ShareGPT at 2 req/s.

    ``efficiency`` scales the A100's peak bandwidth and FLOPs in the roofline step time.  The
    default 0.5 puts the simulated engine in the paper's regime.  By Little's law applied to the
    running requests, a mean batch of 30.42 at 2 req/s with 338-token outputs (Fig. 13a) means
    30.42 / (2 x 338) = ~45 ms per generated token, i.e. per step: roughly twice the ideal
    roofline step at that batch (~26 ms).  With the ideal (1.0), 2 req/s does not fill the pool
    and paging's batch is set by arrivals, not by memory; chapter 4 shows both.
    """

    model: str = "OPT-13B"
    kv_dtype: str = "fp16"
    kv_gib: float = 12.0
    max_seq_len: int = 2048
    rate_per_s: float = 2.0
    lengths: str = "sharegpt"
    num_requests: int = 2000
    efficiency: float = 0.5

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per token, from :mod:`paged_kv.memory` (OPT-13B fp16: 819,200)."""
        from . import memory
        return memory.kv_bytes_per_token(memory.model_preset(self.model), self.kv_dtype)

    @property
    def pool_slots(self) -> int:
        """Token slots in the KV budget: ``floor(kv_gib * 2**30 / kv_bytes_per_token)``."""
        return int(self.kv_gib * 2**30) // self.kv_bytes_per_token

    def iteration_time(self) -> IterationTime:
        """Roofline step time on an A100-40GB (:data:`A100_40GB`), scaled by ``efficiency``."""
        from . import memory
        weights = memory.weights_bytes(memory.model_preset(self.model), "fp16")
        return IterationTime.roofline(weights, self.kv_bytes_per_token, A100_40GB["hbm_bytes_per_s"],
                                      A100_40GB["fp16_flops_per_s"], self.efficiency)

    def trace(self, seed: int = 0, num_requests: int | None = None, rate_per_s: float | None = None) -> Trace:
        return synthetic_trace(num_requests or self.num_requests, rate_per_s or self.rate_per_s,
                               self.lengths, seed)

    def policy(self, name: str, **kwargs) -> MemoryPolicy:
        return make_policy(name, self.pool_slots, self.max_seq_len, **kwargs)

    def run(self, name: str, trace: Trace | None = None, seed: int = 0, **kwargs) -> SimResult:
        """Simulate policy ``name`` (kwargs: policy options, or :func:`simulate` options)."""
        sim_keys = set(inspect.signature(simulate).parameters) - {"trace", "policy"}
        sim = {k: kwargs.pop(k) for k in list(kwargs) if k in sim_keys}
        sim.setdefault("iteration_time", self.iteration_time())
        return simulate(trace if trace is not None else self.trace(seed), self.policy(name, **kwargs), **sim)


PAPER_SETUP = ServingSetup()


def comparison_rows(results: dict[str, SimResult]) -> list[dict]:
    """Our figures beside :data:`PAPER_RESULTS`: one row per policy short name in ``results``.

    Columns: mean batch (ours, paper's Fig. 13a) and token-state share of used memory (ours,
    paper's Fig. 2; the paper gives one range for the three Orca variants).
    """
    rows = []
    for key, res in results.items():
        paper_share = (PAPER_RESULTS["token_state_share"]["vLLM"] if key == "paged"
                       else PAPER_RESULTS["token_state_share"]["existing systems (range)"])
        rows.append({"policy": res.policy, "batch (ours)": res.mean_batch(),
                     "batch (paper)": PAPER_RESULTS["mean_batch"].get(key, math.nan),
                     "token share (ours)": res.used_shares()["token_states"],
                     "token share (paper)": paper_share})
    return rows


def _fmt(v, percent: bool) -> str:
    if isinstance(v, tuple):
        return "–".join(_fmt(x, percent) for x in v)
    if isinstance(v, float):
        return f"{100 * v:.1f}%" if percent else f"{v:.2f}"
    return str(v)


def format_table(rows: list[dict]) -> str:
    """Rows of dicts as a fixed-width text table; columns named "... share ..." print as %."""
    if not rows:
        return ""
    cols = list(rows[0])
    cells = [[_fmt(r[c], "share" in c) for c in cols] for r in rows]
    width = [max(len(c), *(len(row[j]) for row in cells)) for j, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.rjust(w) if j else v.ljust(w) for j, (v, w) in enumerate(zip(vals, width)))
    return "\n".join([line(cols), line(["-" * w for w in width]), *map(line, cells)])
