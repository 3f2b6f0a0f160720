"""The step simulator: an iteration-level scheduler driving one KV memory policy over a trace.

Pure bookkeeping, no tensors; only the memory policy differs between runs.  A step (Orca's
iteration-level scheduling and vLLM's scheduler, vLLM paper §4.5 and §6.1), in this order:

1. requests that have arrived join the waiting queue (FCFS);
2. every running request grows by one token; while the policy lacks blocks for that (paging
   only), the latest arrival is preempted by recompute: requeued at the front, all its tokens now
   its prompt;
3. if nothing was preempted, the head of the queue is admitted while it fits and the caps allow
   (head-of-line blocking); it prefills, with its first output token, in this step;
4. memory is classified (:mod:`paged_kv.sim.memory_policy`), the step's time charged, finished
   requests freed.

The rules of steps 2-3 are :mod:`paged_kv.scheduling.rules`'s, which the serving engine calls too.
Time comes from :class:`IterationTime`: the default, 1 s per step, makes a hand-made trace's
arrival times read as step numbers; the paper's set-up
(:data:`paged_kv.sim.paper_setup.PAPER_SETUP`) charges a roofline estimate.  A run's record is :mod:`paged_kv.sim.result`'s.  A step costs O(1)
Python work plus O(1) per event (admission, completion, preemption, new block), so 10,000 requests
take seconds (``benchmarks/simulate_bench.py``).
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from ..defaults import MAX_NUM_SEQS
from ..errors import ConfigError, PagedKVError
from ..memory.decode_cost import IterationTime
from ..scheduling.rules import may_admit, preemption_victim, requeue_preempted
from ..validate import count, real
from .memory_policy import MemoryPolicy
from .result import STEP_FIELDS, Layout, SimResult
from .traces import Trace

__all__ = ["IterationTime", "simulate"]   # IterationTime: memory.decode_cost's, here where the simulator was its home


def _layout_steps(layouts) -> tuple[int, set]:
    if layouts is None:
        return 0, set()
    if isinstance(layouts, (int, np.integer, bool, np.bool_)):
        return count("layouts (record every k-th step)", layouts), set()
    try:
        return 0, {count("layouts (a step number)", s, minimum=0) for s in layouts}
    except TypeError:
        raise ConfigError(f"layouts must be None, an int k >= 1 or step numbers, got {layouts!r}") from None


def _layout_times(times) -> list[float]:
    if times is None:
        return []
    try:
        return sorted(real("layout_times (a time in s)", t, 0.0) for t in times)
    except TypeError:
        raise ConfigError(f"layout_times must be None or an iterable of times (s), got {times!r}") from None


def simulate(trace: Trace, policy: MemoryPolicy, *, iteration_time: IterationTime | None = None,
             max_batch: int = MAX_NUM_SEQS, max_prefill_tokens: int | None = None, layouts=None,
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
        ConfigError: an empty trace, a request that could never fit (longer than ``max_seq_len``
            or the pool), a policy already in use, or a bad argument (the message names it).
        PagedKVError: a step where nothing runs and the head cannot be admitted (only a policy
            that breaks its own ``fits`` gets there; raised rather than looping forever).
    """
    if not isinstance(trace, Trace):
        raise ConfigError(f"trace must be a paged_kv.sim.Trace, got {type(trace).__name__}")
    if not len(trace):
        raise ConfigError(f"trace {trace.name!r} holds no requests")
    if not isinstance(policy, MemoryPolicy):
        raise ConfigError(f"policy must be a paged_kv.sim.MemoryPolicy, got {policy!r}")
    if iteration_time is not None and not isinstance(iteration_time, IterationTime):
        raise ConfigError(f"iteration_time must be an IterationTime or None, got {iteration_time!r}")
    it = iteration_time or IterationTime()
    if policy.num_seqs:
        raise ConfigError("simulate needs a fresh policy (this one has running requests)")
    max_batch = count("max_batch", max_batch)
    if max_prefill_tokens is not None:
        max_prefill_tokens = count("max_prefill_tokens", max_prefill_tokens)
    arr, P, O = trace.arrival_s.tolist(), trace.prompt_len.tolist(), trace.output_len.tolist()
    N = len(arr)
    for i in range(N):
        if not policy.fits(P[i], O[i]):
            raise ConfigError(f"request {i} (prompt {P[i]}, output {O[i]}) can never fit {policy!r} "
                              f"with max_seq_len {policy.max_seq_len}")
    every, at = _layout_steps(layouts)
    times = _layout_times(layout_times)
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
                recorded.append(Layout(-1, times[ti], *policy.layout(None), policy.borders()))
                ti += 1
            clock = arr[nxt]
            continue
        preempted = 0
        while running and shortfall(step):
            v = preemption_victim(running)  # the latest arrival (request ids are arrival order)
            running.remove(v)
            gen = policy.length(v) - p_now[v]
            policy.free(v)
            epoch[v] += 1
            npre[v] += 1
            p_now[v] += gen
            o_left[v] -= gen
            requeue_preempted(waiting, v)
            preempted += 1
        append(step)
        admitted = prefill = 0
        while waiting:  # FCFS: only the head may be admitted; if it cannot, nobody behind it is
            r = waiting[0]
            p, o = p_now[r], o_left[r]
            if not may_admit(preempted > 0, len(running), max_batch, admitted, prefill, policy.prefill_tokens(p),
                             max_prefill_tokens):
                break
            if not can_admit(p, o, r):  # memory: the policy's "can I?"
                break
            waiting.popleft()
            admit(r, p, o, step)
            running.append(r)
            heapq.heappush(heap, (step + o - 1, r, epoch[r]))
            if first_admit[r] != first_admit[r]:  # NaN: first admission
                first_admit[r] = clock
            admitted += 1
            prefill += policy.prefill_tokens(p)
        if not running:
            raise PagedKVError(f"step {step}: nothing runs and request {waiting[0]} cannot be admitted")
        tok, res, internal = totals()
        head = need(p_now[waiting[0]], o_left[waiting[0]], waiting[0]) if waiting else None
        ext, free = split_free(head)
        dt = base + k_kv * policy.read_tokens() + k_pf * prefill
        if check:
            policy.check(head)
        due = 0
        while ti < len(times) and clock >= times[ti]:
            ti += 1
            due += 1
        if due or (every and step % every == 0) or step in at:
            owner, cat = policy.layout(head)
            recorded.extend([Layout(step, clock, owner, cat, policy.borders())] * max(due, 1))
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
