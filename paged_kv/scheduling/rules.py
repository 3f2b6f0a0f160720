"""The scheduling rules, named: which waiting request is admitted, which running one is preempted.

The simulator (:func:`paged_kv.sim.simulate`) and the serving engine call the same functions, so
the two cannot drift apart.  Pure Python.

They follow vLLM's scheduler as the paper describes it (Kwon et al., SOSP 2023, §4.5):

* **First come, first served.**  Requests wait in arrival order.  Admission looks at the head of
  the queue only: if the head cannot be admitted, nobody behind it is (head-of-line blocking),
  so a long prompt is never starved by short ones.  A preempted request goes back in arrival order
  (:func:`requeue_preempted`): to the *front*, as it arrived before everything still waiting, unless
  an older preempted request waits there already.
* **Preempt the latest arrival.**  When the running requests need more blocks than are free,
  the one that arrived last is evicted first (:func:`preemption_victim`); §4.5 serves the
  earliest arrivals first and preempts the latest first.
* **No admission in a step that preempted** (:func:`may_admit`): memory was just short, so
  admitting a new prompt would only evict someone again.
* **Caps per step**: at most ``max_num_seqs`` running requests (vLLM's default 256,
  :data:`paged_kv.defaults.MAX_NUM_SEQS`) and, optionally, at most ``max_prefill_tokens``
  prompt tokens admitted in one step; the first admission of a step is always allowed, so a prompt
  longer than the cap still runs.

* **Or longest prefix match** (``policy="lpm"``, SGLang's cache-aware ``--schedule-policy lpm``):
  admission walks the waiting requests by the prompt tokens each already finds in the prefix cache,
  most first, ties by arrival (:func:`admission_order`), still with head-of-line blocking in that
  order.  The queue itself stays in arrival order; only the walk changes.

Whether the *memory* fits is not a rule of the scheduler: the memory policy or block manager
answers that ("can I?"), after :func:`may_admit` says yes.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Hashable, Sequence, TypeVar

from ..errors import ConfigError

__all__ = ["POLICIES", "admission_order", "may_admit", "preemption_victim", "requeue_preempted"]

POLICIES = ("fcfs", "lpm")

R = TypeVar("R", bound=Hashable)


def preemption_victim(running: Sequence[R], arrival: Callable[[R], object] | None = None) -> R:
    """The running request to preempt: the one that arrived last.

    Args:
        running: the running requests (any order).
        arrival: key giving each request's arrival (time or sequence number); ``None``: the
            requests themselves are arrival numbers (the simulator numbers requests in order of
            arrival).  Ties go to the later one in ``running``.

    Raises:
        ConfigError: nothing is running (there is nobody to preempt).
    """
    if not running:
        raise ConfigError("no running request to preempt")
    key = (lambda r: r) if arrival is None else arrival
    victim = running[0]
    for r in running[1:]:
        if key(r) >= key(victim):
            victim = r
    return victim


def requeue_preempted(waiting: deque, request, arrival: Callable[[R], object] | None = None) -> None:
    """Put a preempted request back in the waiting queue in arrival order (FCFS: the oldest first).

    That is the *front* as a rule, since the requests still waiting arrived after it.  But an older
    request may be waiting already, preempted earlier and not yet readmitted (by a preemption
    between steps, or by a swap that fell back to recompute while a newer request was swapped out);
    it stays ahead.  ``arrival``: as for :func:`preemption_victim` (``None``: the requests are
    arrival numbers).  The scan starts at the front, where preempted requests sit.
    """
    key = (lambda r: r) if arrival is None else arrival
    k = 0
    while k < len(waiting) and key(waiting[k]) < key(request):
        k += 1
    waiting.insert(k, request)


def may_admit(preempted_this_step: bool, num_running: int, max_num_seqs: int,
              admitted_this_step: int, prefill_tokens_this_step: int, prompt_tokens: int,
              max_prefill_tokens: int | None) -> bool:
    """Whether the scheduler may admit the head of the waiting queue now (memory aside).

    Args:
        preempted_this_step: a running request was preempted in this step.
        num_running: requests running now; ``max_num_seqs``: the cap on them.
        admitted_this_step: requests already admitted in this step.
        prefill_tokens_this_step: prompt tokens those admissions brought.
        prompt_tokens: the head's prompt (after a recompute preemption: all its tokens so far).
        max_prefill_tokens: cap on prompt tokens admitted per step (``None``: no cap).

    Returns ``False`` when any rule says no; the caller then stops admitting in this step (FCFS,
    head-of-line blocking).
    """
    if preempted_this_step or num_running >= max_num_seqs:
        return False
    if max_prefill_tokens is None or admitted_this_step == 0:
        return True
    return prefill_tokens_this_step + prompt_tokens <= max_prefill_tokens


def admission_order(waiting: Sequence[R], policy: str, cached_tokens: Callable[[R], int] | None = None,
                    arrival: Callable[[R], object] | None = None) -> list[R]:
    """The order in which admission considers the waiting requests (it stops at the first that must
    wait: head-of-line blocking in this order).

    Args:
        waiting: the waiting requests, in arrival order (as the scheduler keeps them).
        policy: ``"fcfs"``: arrival order, ``waiting`` as it is (vLLM's default ``policy``, paper
            §4.5).  ``"lpm"``: longest prefix match first, SGLang's cache-aware policy
            (``python/sglang/srt/managers/schedule_policy.py``, ``CacheAwarePolicy.LPM``): by
            ``cached_tokens(r)``, the tokens ``r`` would find in the prefix cache now, most first;
            ties by ``arrival`` (``None``: the requests are arrival numbers), so with nothing cached
            the order is FCFS's.
        cached_tokens: tokens of each request found in the prefix cache (needed for ``"lpm"``).

    Returns a new list, a permutation of ``waiting``.

    Starvation: ``"lpm"`` has no aging (neither has SGLang's; its issue #31954 measured cache-miss
    requests waiting 20-60 s in production).  A request is passed over by every admissible waiting
    request with a longer hit, *including those that arrived after it*; so while such requests keep
    arriving faster than the engine admits them, its wait has no bound.  It is considered again at
    every step, and is admitted once no waiting request with a longer hit is ahead of it; on a
    finite trace every request is admitted.  ``"fcfs"`` never lets a later arrival pass.

    What SGLang adds and this does not: requests whose hit is short but who share a prefix with
    another waiting request are put last (so one computes the prefix and the others hit it), and
    with more than 128 waiting requests it sorts nothing and falls back to FCFS, to bound the cost
    of the lookups.

    Raises:
        ConfigError: an unknown policy, or ``"lpm"`` without ``cached_tokens``.
    """
    if policy == "fcfs":
        return list(waiting)
    if policy != "lpm":
        raise ConfigError(f"policy must be one of {POLICIES}, got {policy!r}")
    if cached_tokens is None:
        raise ConfigError("policy 'lpm' orders by cached prompt tokens: pass cached_tokens")
    key = (lambda r: r) if arrival is None else arrival
    return sorted(waiting, key=lambda r: (-cached_tokens(r), key(r)))
