"""A hypothesis state machine for the :class:`~paged_kv.scheduling.Scheduler` alone (pure bookkeeping,
no model: the sampled tokens are made up).

Random requests arrive (prompts sharing prefixes, ``n`` 1-3, ``max_tokens`` 1-8, some refused as
never), steps run (``schedule()`` then ``update()``), and running requests are preempted between
steps, under a configuration drawn per run (block size, a small pool, small and large token
budgets, chunked prefill on and off, watermarks, recompute and swap with a CPU pool that is
sometimes too small, prefix caching, a small ``max_num_seqs``, the FCFS or the longest-prefix-match
policy).  A :class:`Driver` keeps what the
scheduler should hold (each sample's tokens) and, as :mod:`tests.blocks.test_manager` does, a dict
that stands for the KV cache: every step is "run" from its :class:`~paged_kv.scheduling.SchedulerOutput`
alone (swaps, copies, then each chunk reads its context and writes its tokens), so a step that is not
self-contained, or a block handed to two owners, reads back the wrong K/V.

Every invariant is a named ``check_*`` function that raises ``AssertionError`` naming what broke; the
tests at the end corrupt a valid state once per check to prove each one fires.

Legend: BS block size (tokens per block), NB blocks in the GPU pool.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import Phase, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from paged_kv.blocks import BlockSpaceManager
from paged_kv.errors import AdmissionError, PagedKVError
from paged_kv.scheduling import Request, Scheduler, SchedulerConfig, SchedulerOutput


def fail(check: str, message: str) -> None:
    raise AssertionError(f"{check}: {message}")


# --- what the scheduler should hold: an oracle built from the real block manager and the samples ---
@functools.cache
def peak_blocks(prompt_len: int, max_tokens: int, n: int, block_size: int) -> int:
    """The most blocks ``n`` samples of one prompt hold, by brute force on a real block manager:
    the prompt once, ``n - 1`` forks, then ``max_tokens - 1`` decode tokens each (the last sampled
    token is never fed back), copies on write taken as they come.  Not the algebra under test."""
    m = BlockSpaceManager(n * (prompt_len + max_tokens) + 1, block_size)
    m.allocate(0, prompt_len)
    for i in range(1, n):
        m.fork(0, i)
    peak = m.num_blocks - m.num_free_blocks
    for _ in range(max_tokens - 1):
        for i in range(n):
            m.append_slot(i)
        m.take_copies()
        peak = max(peak, m.num_blocks - m.num_free_blocks)
    return peak


def never_reasons(cfg: SchedulerConfig, prompt_len: int, n: int, max_tokens: int) -> list[str]:
    """Words of each documented reason a request can never run here (``never_reason``'s docstring):
    its samples cannot all run at once, it is longer than ``max_model_len``, its peak does not fit
    the pool, its largest admission (a lone sequence re-prefills all it holds after a recompute)
    does not fit the pool less the watermark, or, with chunked prefill off, its largest prefill
    does not fit the token budget."""
    bs, nb = cfg.block_size, cfg.num_gpu_blocks
    stored = prompt_len + max_tokens - 1
    reasons = []
    if n > cfg.max_num_seqs:
        reasons.append("max_num_seqs")
    if cfg.max_model_len is not None and prompt_len + max_tokens > cfg.max_model_len:
        reasons.append("max_model_len")
    if peak_blocks(prompt_len, max_tokens, n, bs) > nb:
        reasons.append(f"but the pool has {nb}")
    admission = prompt_len if n > 1 else stored
    if -(-admission // bs) > nb - int(cfg.watermark * nb):
        reasons.append("watermark")
    largest = max(prompt_len, max_tokens - 1) if n > 1 else stored
    if not cfg.enable_chunked_prefill and largest > cfg.max_num_batched_tokens:
        reasons.append("chunked prefill off")
    return reasons


@dataclass
class Expect:
    """One accepted request as the driver sees it: the prompt and each sample's sampled tokens."""

    prompt: list[int]
    n: int
    max_tokens: int
    extra_key: object
    outputs: list[list[int]] = field(default_factory=list)   # per sample index; [] until the first sample
    errored: bool = False                                     # its part of a step failed: it ended early

    def tokens(self, index: int) -> list[int]:
        return self.prompt + (self.outputs[index] if self.outputs else [])

    @property
    def done(self) -> bool:
        return len(self.outputs) == self.n and all(len(o) == self.max_tokens for o in self.outputs)


def kv_keys(tokens: list[int], extra_key) -> list[int]:
    """What the K/V at each position depends on: the extra key and every token up to it (a chained
    hash stands for the vector)."""
    return list(itertools.accumulate(tokens, lambda h, t: hash((h, t)), initial=hash(("kv", extra_key))))[1:]


@dataclass
class Before:
    """The queues as a step found them; ``ranked``: with ``policy="lpm"``, the waiting requests in the
    order admission must walk them (:func:`lpm_ranking`), ``None``: arrival order (FCFS)."""

    running: list
    swapped: list
    waiting: list
    unfinished: bool
    ranked: list | None = None


def lpm_ranking(sch: Scheduler, expect: dict) -> list:
    """The longest-prefix-match order of the waiting queue as the step finds it, by selection: take
    the request whose tokens to prefill (the prompt for ``n > 1``, everything it holds for one
    sample) find the most tokens in the prefix cache, the earliest arrival among equals; repeat.
    The hits come from the manager's lookup (tested on its own elsewhere); the order is not the
    scheduler's code."""
    bs, m = sch.config.block_size, sch.manager
    left = []
    for r in sch.waiting:
        e = expect[r.request_id]
        tokens = e.prompt if e.n > 1 else e.tokens(0)
        left.append((len(m.cache_hit(tokens, e.extra_key)) * bs, r.order, r.request_id))
    ranked = []
    while left:
        best = left[0]
        for cand in left[1:]:
            if cand[0] > best[0] or (cand[0] == best[0] and cand[1] < best[1]):
                best = cand
        left.remove(best)
        ranked.append(best[2])
    return ranked


# --- the checks ---------------------------------------------------------------------------------
def check_pools(sch: Scheduler) -> None:
    """1. The scheduler's own check: both pools consistent, block holders match the queues."""
    try:
        sch.check()
    except PagedKVError as e:
        fail("1 pools", f"Scheduler.check() failed: {e}")


def _tables(sch: Scheduler, requests, where: str) -> dict:
    m = sch.manager
    ids = set(m.seq_ids) if where == "gpu" else set(m.swapped_ids)
    get = m.block_ids if where == "gpu" else (lambda s: tuple(m.swapped_table(s).block_ids))
    return {s.seq_id: get(s.seq_id) for r in requests for s in r.seqs if s.seq_id in ids}


def check_blocks_equal_tables(sch: Scheduler) -> None:
    """2. The GPU blocks in use are exactly the distinct blocks of the running sequences' tables
    (cached-free blocks sit on the free list, so they count as free), the CPU blocks in use those of
    the swapped requests' tables; every running or swapped request holds a table, and each table holds
    at least what its sequence has computed and at most its tokens."""
    m = sch.manager
    for where, requests, alloc, held_ids in (("gpu", sch.running, m.allocator, m.seq_ids),
                                             ("cpu", sch.swapped, m.cpu_allocator, m.swapped_ids)):
        tables = _tables(sch, requests, where)
        strays = sorted(set(held_ids) - set(tables))
        if strays:
            fail("2 blocks = tables", f"sequences {strays} hold {where.upper()} blocks but belong to no "
                                      f"{'running' if where == 'gpu' else 'swapped'} request")
        distinct = set().union(*map(set, tables.values())) if tables else set()
        used = 0 if alloc is None else alloc.num_blocks - alloc.num_free_blocks
        if used != len(distinct):
            fail("2 blocks = tables", f"{used} {where.upper()} blocks are in use but the tables of the "
                                      f"{'running' if where == 'gpu' else 'swapped'} sequences hold "
                                      f"{len(distinct)} distinct blocks")
        for r in requests:
            if not any(s.seq_id in tables for s in r.seqs):
                fail("2 blocks = tables", f"{r.status} request {r.request_id!r} holds no {where.upper()} block")
            for s in r.seqs:
                if s.seq_id in tables:
                    held = (m.num_tokens(s.seq_id) if where == "gpu" else m.swapped_table(s.seq_id).num_tokens)
                    if not s.num_computed <= held <= len(s.tokens):
                        fail("2 blocks = tables", f"sequence {s.seq_id} of {r.request_id!r}: its table holds "
                                                  f"{held} tokens, but it computed {s.num_computed} of "
                                                  f"{len(s.tokens)}")


def check_ref_counts(sch: Scheduler) -> None:
    """3. Every block's reference count equals the number of running (GPU) or swapped (CPU) sequences
    whose table holds it."""
    m = sch.manager
    for where, requests, alloc in (("gpu", sch.running, m.allocator), ("cpu", sch.swapped, m.cpu_allocator)):
        if alloc is None:
            continue
        holders = Counter(b for t in _tables(sch, requests, where).values() for b in t)
        for b in range(alloc.num_blocks):
            if alloc.ref_count(b) != holders[b]:
                fail("3 ref counts", f"{where.upper()} block {b} has ref count {alloc.ref_count(b)} but "
                                     f"{holders[b]} {'running' if where == 'gpu' else 'swapped'} sequences hold it")


def check_token_budget(out: SchedulerOutput, sch: Scheduler) -> None:
    """4. A step's prefill and decode tokens are its chunks' tokens, within ``max_num_batched_tokens``;
    with chunked prefill off no prefill is split: each chunk ends where its sequence's pending run
    ends (all its tokens, or the prompt for the leader of a group not yet forked)."""
    c = sch.config
    total = sum(ch.query_len for ch in out.chunks)
    if out.prefill_tokens + out.decode_tokens != total:
        fail("4 token budget", f"prefill {out.prefill_tokens} + decode {out.decode_tokens} tokens != "
                               f"{total} tokens in the chunks")
    if total > c.max_num_batched_tokens:
        fail("4 token budget", f"the step runs {total} tokens > max_num_batched_tokens {c.max_num_batched_tokens}")
    if out.decode_tokens > len(out.chunks) or any(ch.query_len < 1 for ch in out.chunks):
        fail("4 token budget", f"{out.decode_tokens} decode tokens in {len(out.chunks)} chunks, "
                               f"query lengths {out.query_lens}")
    if not c.enable_chunked_prefill:
        for ch in out.chunks:
            req = sch.requests[ch.request_id]
            seq = next(s for s in req.seqs if s.seq_id == ch.seq_id)
            if ch.seq_len != len(seq.tokens) and not (req.n > 1 and not req.forked and ch.seq_len == req.prompt_len):
                fail("4 token budget", f"chunked prefill is off but sequence {ch.seq_id} of {ch.request_id!r} "
                                       f"runs {ch.start}..{ch.seq_len} of its {len(seq.tokens)} tokens")


def check_queue_order(sch: Scheduler) -> None:
    """5a. Each request is in exactly one queue with the matching status; ``swapped`` and ``waiting`` are
    in arrival order (``Request.order``): a preempted request re-enters ``waiting`` at the head, as
    it arrived before the requests still waiting, but behind an older preempted one
    (``requeue_preempted``).  ``running`` is not kept in order (``schedule()`` sorts it)."""
    places = [("waiting", list(sch.waiting)), ("running", sch.running), ("swapped", sch.swapped),
              ("finished", sch.finished)]
    seen = Counter(r.request_id for _, q in places for r in q)
    if set(seen) != set(sch.requests) or any(k > 1 for k in seen.values()):
        fail("5 FCFS", f"requests and queues disagree: in queues {dict(seen)}, known {sorted(sch.requests, key=str)}")
    for status, q in places:
        wrong = [r.request_id for r in q if r.status != status]
        if wrong:
            fail("5 FCFS", f"requests {wrong} sit in {status} with another status")
    for name in ("waiting", "swapped"):
        orders = [(r.order, r.request_id) for r in getattr(sch, name)]
        if orders != sorted(orders):
            fail("5 FCFS", f"{name} is not in arrival order: (order, id) {orders}")


def check_fcfs_step(before: Before, out: SchedulerOutput, sch: Scheduler) -> None:
    """5b. One step served the queues in the documented order: running requests first (oldest first),
    then swapped ones (oldest first, a prefix of the swapped queue), then waiting ones (the head first,
    head-of-line blocking; with ``policy="lpm"`` the head of ``before.ranked``, longest prefix match
    first); nobody admitted in a step that preempted, nobody from ``waiting`` while anyone stays
    swapped out, no admission from ``waiting`` of a request that arrived after one still waiting
    (FCFS) or that ranks after one still waiting (LPM), and every admission from ``waiting`` runs a
    chunk."""
    order = {rid: r.order for rid, r in sch.requests.items()}
    was_running, was_swapped, was_waiting = set(before.running), set(before.swapped), list(before.waiting)
    if len(set(out.admitted)) != len(out.admitted) or not set(out.admitted) <= was_swapped | set(was_waiting):
        fail("5 FCFS", f"admitted {out.admitted} but only swapped {before.swapped} or waiting {was_waiting} can be")
    from_swapped = [r for r in out.admitted if r in was_swapped]
    from_waiting = [r for r in out.admitted if r in set(was_waiting)]
    if out.preempted and out.admitted:
        fail("5 FCFS", f"the step preempted {out.preempted} and still admitted {out.admitted}")
    oldest_swapped = sorted(before.swapped, key=order.__getitem__)[:len(from_swapped)]
    if from_swapped != oldest_swapped:
        fail("5 FCFS", f"swapped in {from_swapped}, not the oldest swapped requests {oldest_swapped}")
    if from_waiting and sch.swapped:
        fail("5 FCFS", f"admitted {from_waiting} from waiting while {[r.request_id for r in sch.swapped]} "
                       f"are swapped out")
    walk = was_waiting if before.ranked is None else before.ranked
    if sorted(walk) != sorted(was_waiting):
        fail("5 FCFS", f"the ranking {walk} is not a permutation of waiting {was_waiting}")
    if from_waiting != walk[:len(from_waiting)]:
        what = "its head" if before.ranked is None else "the head of its longest-prefix-match order"
        fail("5 FCFS", f"admitted {from_waiting} from waiting {walk}: not {what} (head-of-line blocking)")
    still = [rid for rid in was_waiting if rid not in set(from_waiting)]
    late = [(a, w) for a in from_waiting for w in still if order[a] > order[w]] if before.ranked is None else []
    if late:
        fail("5 FCFS", f"admitted {late[0][0]!r} (order {order[late[0][0]]}) while {late[0][1]!r} "
                       f"(order {order[late[0][1]]}), which arrived earlier, still waits")
    phase = {rid: 1 for rid in was_running} | {rid: 2 for rid in from_swapped} | {rid: 3 for rid in from_waiting}
    rank = {rid: k for k, rid in enumerate(from_waiting)}
    runs = [rid for rid, _ in itertools.groupby(ch.request_id for ch in out.chunks)]
    if len(runs) != len(set(runs)):
        fail("5 FCFS", f"a request's chunks are not together: {runs}")
    if any(rid not in phase for rid in runs):
        fail("5 FCFS", f"chunks of {[r for r in runs if r not in phase]}, neither running nor admitted")
    key = [(phase[rid], rank[rid] if phase[rid] == 3 else order[rid]) for rid in runs]
    if key != sorted(key):
        fail("5 FCFS", f"chunks not in queue order (running, swapped, waiting; oldest first): {runs}")
    idle = [rid for rid in from_waiting if rid not in set(runs)]
    if idle:
        fail("5 FCFS", f"admitted {idle} from waiting without running a chunk for them")


def check_max_num_seqs(sch: Scheduler) -> None:
    """At most ``max_num_seqs`` samples run at once (each running request counts its unfinished
    samples, all ``n`` before it forks)."""
    live = sum(r.n - sum(1 for s in r.seqs if s.num_generated >= r.max_tokens) for r in sch.running)
    if live > sch.config.max_num_seqs:
        fail("max_num_seqs", f"{live} samples run, max_num_seqs {sch.config.max_num_seqs}")


def check_progress(before: Before, out: SchedulerOutput) -> None:
    """6. Something happens whenever anything is unfinished: a chunk runs, a request is swapped in, or
    one is preempted (the carry of a preemption between steps does not count)."""
    if before.unfinished and not (out.chunks or out.swap_in or out.preempted):
        fail("6 progress", f"requests are unfinished (running {before.running}, swapped {before.swapped}, "
                           f"waiting {before.waiting}) but the step does nothing")


def check_chunks(out: SchedulerOutput, sch: Scheduler, expect: dict, finished_last: list) -> None:
    """7. The step as data: each chunk's block table is the manager's right after ``schedule()``, its slot
    mapping is ``block_table[p // BS] * BS + p % BS``, its tokens are the sequence's (as sampled) at its
    positions and start where the sequence's computed tokens end; it samples exactly when the sequence
    is then fully computed; ``num_samples == n`` only for a fresh leader; a sequence appears once;
    ``finished_req_ids`` names the requests finished since the last step."""
    bs, m = sch.config.block_size, sch.manager
    if list(out.finished_req_ids) != list(finished_last):
        fail("7 step as data", f"finished_req_ids {out.finished_req_ids} but {finished_last} finished "
                               f"since the last step")
    seen = Counter(ch.seq_id for ch in out.chunks)
    if any(k > 1 for k in seen.values()):
        fail("7 step as data", f"a sequence has two chunks in one step: {dict(seen)}")
    for ch in out.chunks:
        where = f"chunk of sequence {ch.seq_id} ({ch.request_id!r}, {ch.start}..{ch.seq_len})"
        req = sch.requests.get(ch.request_id)
        seq = next((s for s in req.seqs if s.seq_id == ch.seq_id), None) if req else None
        if seq is None or seq.index != ch.index:
            fail("7 step as data", f"{where}: no such sequence with sample index {ch.index}")
        e = expect[ch.request_id]
        tokens = e.tokens(ch.index)
        if ch.block_table != m.block_ids(ch.seq_id):
            fail("7 step as data", f"{where}: block table {ch.block_table} but the manager's is "
                                   f"{m.block_ids(ch.seq_id)}")
        want = tuple(ch.block_table[p // bs] * bs + p % bs for p in ch.positions)
        if ch.slot_mapping != want:
            fail("7 step as data", f"{where}: slot mapping {ch.slot_mapping}, its block table gives {want}")
        if ch.token_ids != tuple(tokens[ch.start:ch.seq_len]) or ch.seq_len > len(tokens):
            fail("7 step as data", f"{where}: tokens {ch.token_ids} but the sequence holds "
                                   f"{tuple(tokens[ch.start:ch.seq_len])} there")
        if ch.seq_len != ch.start + ch.query_len or ch.start != seq.num_computed:
            fail("7 step as data", f"{where}: starts at {ch.start}, the sequence computed {seq.num_computed}")
        if ch.sample != (ch.seq_len == len(tokens)):
            fail("7 step as data", f"{where}: sample={ch.sample} but the sequence holds {len(tokens)} tokens")
        fresh = ch.sample and not e.outputs
        if ch.num_samples != (e.n if fresh else 1):
            fail("7 step as data", f"{where}: num_samples {ch.num_samples} (n={e.n}, "
                                   f"{'a fresh leader' if fresh else 'not a fresh leader'})")
        if e.outputs and len(e.outputs[ch.index]) >= e.max_tokens:
            fail("7 step as data", f"{where}: the sample has all its {e.max_tokens} tokens already")


def check_tokens(sch: Scheduler, expect: dict) -> None:
    """Every sample holds exactly the prompt and the tokens sampled for it, in order (none lost, none
    sampled twice, across preemptions), never more than ``max_tokens``; a request is finished exactly
    when all ``n`` samples have ``max_tokens`` tokens."""
    for rid, e in expect.items():
        req = sch.requests[rid]
        if sorted(s.index for s in req.seqs) != list(range(e.n if e.outputs else 1)):
            fail("tokens", f"{rid!r} has samples {[s.index for s in req.seqs]}, expected "
                           f"{e.n if e.outputs else 1} (n={e.n})")
        for s in req.seqs:
            if s.tokens != e.tokens(s.index) or s.prompt_len != len(e.prompt):
                fail("tokens", f"{rid!r} sample {s.index} holds {s.tokens}, sampled {e.tokens(s.index)}")
        if (req.status == "finished") != (e.done or e.errored):
            fail("tokens", f"{rid!r} is {req.status} with outputs of lengths {[len(o) for o in e.outputs]} "
                           f"(max_tokens {e.max_tokens}, n {e.n})")


def check_kv_reads_back(sch: Scheduler, expect: dict, gpu_kv: dict, cpu_kv: dict, pending: set) -> None:
    """8. The dict standing for the KV cache holds, for every sequence holding blocks, the K/V of each
    token it computed, through its own table (GPU for running, CPU for swapped requests whose swap-out
    has been run): no two owners ever wrote one slot, swaps and copies moved the right blocks."""
    m, bs = sch.manager, sch.config.block_size
    for where, requests, kv in (("gpu", sch.running, gpu_kv), ("cpu", sch.swapped, cpu_kv)):
        for r in requests:
            if r.request_id in pending:
                continue
            e = expect[r.request_id]
            tables = _tables(sch, [r], where)
            for s in r.seqs:
                if s.seq_id not in tables:
                    continue
                keys, table = kv_keys(e.tokens(s.index), e.extra_key), tables[s.seq_id]
                for p in range(s.num_computed):
                    if kv.get(table[p // bs] * bs + p % bs) != keys[p]:
                        fail("8 KV reads back", f"{where.upper()} slot of token {p} of sequence {s.seq_id} "
                                                f"({r.request_id!r}) does not hold its K/V")


# --- the driver: a scheduler, what it should hold, and a dict for the KV cache --------------------
class Driver:
    """Drives one :class:`Scheduler` with every check; the state machine and the corruption tests
    both use it.  ``echo``: every sampled token is 5 (identical samples share decode blocks in the
    prefix cache); else each sampled token is new."""

    def __init__(self, cfg: SchedulerConfig, echo: bool = False) -> None:
        self.sch, self.cfg, self.echo = Scheduler(cfg), cfg, echo
        self.expect: dict = {}
        self.gpu_kv: dict[int, int] = {}
        self.cpu_kv: dict[int, int] = {}
        self.pending_swaps: set = set()     # swapped out between steps: the next step runs the copy
        self.finished_last: list = []
        self.next_token = 100
        self.next_id = 0
        self.seen: Counter = Counter()      # what the run exercised (reported as hypothesis events)

    def _token(self) -> int:
        self.next_token += 1
        return 5 if self.echo else self.next_token

    # --- rules ---------------------------------------------------------------------------------
    def add(self, prompt: list[int], n: int, max_tokens: int, extra_key=None):
        rid = f"r{self.next_id}"
        self.next_id += 1
        reasons = never_reasons(self.cfg, len(prompt), n, max_tokens)
        waiting = list(self.sch.waiting)
        if reasons:
            with pytest.raises(AdmissionError, match="can never run") as err:
                self.sch.add(rid, prompt, n=n, max_tokens=max_tokens, extra_key=extra_key)
            assert any(r in str(err.value) for r in reasons), f"refused for {err.value}, expected one of {reasons}"
            assert list(self.sch.waiting) == waiting and rid not in self.sch.requests, "a refused request was queued"
            self.seen["refused"] += 1
            return None
        self.sch.add(rid, prompt, n=n, max_tokens=max_tokens, extra_key=extra_key)
        self.seen["accepted"] += 1
        assert self.sch.waiting[-1].request_id == rid
        self.expect[rid] = Expect(list(prompt), n, max_tokens, extra_key)
        return rid

    def step(self, faulty=None) -> SchedulerOutput:
        """One step, checked.  ``faulty``: picks, from the ids of the requests with chunks in the step,
        one whose part fails: the driver writes none of its K/V (the worst case), and runs none of the
        requests whose hits read what it was to write (``readers_of``, as the runner does)."""
        sch = self.sch
        before = Before([r.request_id for r in sch.running], [r.request_id for r in sch.swapped],
                        [r.request_id for r in sch.waiting], sch.has_unfinished,
                        lpm_ranking(sch, self.expect) if self.cfg.policy == "lpm" else None)
        try:
            out = sch.schedule()
        except PagedKVError as e:
            fail("6 progress", f"schedule() raised though every queued request passed admission: {e}")
        check_progress(before, out)
        check_token_budget(out, sch)
        check_fcfs_step(before, out, sch)
        check_chunks(out, sch, self.expect, self.finished_last)
        admitted = [rid for rid in out.admitted if rid in set(before.waiting)]
        if admitted != before.waiting[:len(admitted)]:
            self.seen["lpm admitted a later arrival first"] += 1
        self.seen.update(what for what in ("preempted", "swapped", "swap_in", "copies", "cache_hits")
                         if getattr(out, what))
        if out.preempted and set(out.recomputed) & set(out.preempted) and self.cfg.preemption_mode == "swap":
            self.seen["swap fell back to recompute"] += 1
        failed = {}
        if faulty is not None and out.chunks:
            failed = {faulty(sorted({c.request_id for c in out.chunks}, key=str)): "injected fault"}
            self.seen["a failed part"] += 1
        unread = out.readers_of(failed)
        if unread:
            self.seen["a failed part with same-step readers"] += 1
        self.seen.update(["same-step hits"] if out.same_step_hits else [])
        self.run(out, skip=set(failed) | unread)
        sampled = {c.seq_id: [self._token() for _ in range(c.num_samples)] for c in out.chunks
                   if c.sample and c.request_id not in failed and c.request_id not in unread}
        done = sch.update(out, sampled, failed) if failed else sch.update(out, sampled)
        for rid in failed:
            self.expect[rid].errored = True
        for rid in unread:
            assert sch.requests[rid].status == "waiting", f"{rid!r}, which read a failed part's blocks, is not back in waiting"
        for c in out.chunks:
            if c.seq_id in sampled:
                e = self.expect[c.request_id]
                if not e.outputs:
                    e.outputs = [[t] for t in sampled[c.seq_id]]
                else:
                    e.outputs[c.index].append(sampled[c.seq_id][0])
        self.finished_last = [r.request_id for r in done]
        unfinished = [r for r in self.finished_last if not (self.expect[r].done or self.expect[r].errored)]
        assert not unfinished, f"update() reported {unfinished} finished before their max_tokens"
        self.pending_swaps.clear()
        return out

    def run(self, out: SchedulerOutput, skip=frozenset()) -> None:
        """Run the step from its output alone, as the model runner does: swap out, swap in, copy, then
        two passes, the decode tokens (one token after a context, sampling, of a request that reads
        nothing this step writes) and then the prefill chunks; in each pass every chunk first writes its tokens through its own block table (a
        layer stores before it attends), then reads its context.  A chunk writes only into blocks
        no one else holds, or that only the requests reading them in this step hold (a block
        registered at schedule time, hit by a request admitted later in the step:
        ``same_step_hits`` names the writer).  The chunks of the requests in ``skip`` (a failed part,
        and those that read its blocks) neither write nor read."""
        bs, m = self.cfg.block_size, self.sch.manager
        for src_kv, dst_kv, pairs in ((self.gpu_kv, self.cpu_kv, out.swap_out), (self.cpu_kv, self.gpu_kv, out.swap_in),
                                      (self.gpu_kv, self.gpu_kv, out.copies)):
            moved = {dst * bs + o: src_kv.get(src * bs + o) for src, dst in pairs for o in range(bs)}
            dst_kv.update(moved)
        holders = {}
        for r in self.sch.running:
            for s in r.seqs:
                if s.seq_id in m:
                    for b in m.block_ids(s.seq_id):
                        holders.setdefault(b, set()).add((r.request_id, s.seq_id))
        written: set[int] = set()
        chunks = [c for c in out.chunks if c.request_id not in skip]
        decode = [c for c in chunks if c.query_len == 1 and c.start > 0 and c.sample
                  and c.request_id not in out.same_step_hits]   # a same-step reader goes second
        for part in (decode, [c for c in chunks if c not in decode]):
            for c in part:
                keys = kv_keys(self.expect[c.request_id].tokens(c.index), self.expect[c.request_id].extra_key)
                for p, slot in zip(c.positions, c.slot_mapping):
                    if slot in written:
                        fail("8 KV reads back", f"two chunks of one step write slot {slot}")
                    others = {rid for rid, seq in holders.get(slot // bs, ()) if seq != c.seq_id}
                    readers = {rid for rid in others if c.request_id in out.same_step_hits.get(rid, ())}
                    if others - readers:
                        fail("8 KV reads back", f"sequence {c.seq_id} writes into block {slot // bs}, which "
                                                f"{sorted(others - readers)} also hold")
                    written.add(slot)
                    self.gpu_kv[slot] = keys[p]
            for c in part:
                keys = kv_keys(self.expect[c.request_id].tokens(c.index), self.expect[c.request_id].extra_key)
                for p in range(c.start):
                    if self.gpu_kv.get(c.block_table[p // bs] * bs + p % bs) != keys[p]:
                        fail("8 KV reads back", f"chunk of sequence {c.seq_id} ({c.request_id!r}) reads token {p} "
                                                f"of its context from a slot that does not hold its K/V")

    def preempt(self, rid, mode) -> str:
        sch, m = self.sch, self.sch.manager
        req = sch.requests[rid]
        tables = _tables(sch, [req], "gpu")
        inside = Counter(b for t in tables.values() for b in t)
        only_here = [b for b in inside if m.allocator.ref_count(b) == inside[b]]
        wanted = mode or self.cfg.preemption_mode
        swap = (wanted == "swap" and self.cfg.num_cpu_blocks > 0 and not self.cfg.enable_prefix_caching
                and len(inside) <= m.cpu_allocator.num_free_blocks)
        gpu_free, cpu_free = m.num_free_blocks, m.cpu_allocator.num_free_blocks if m.cpu_allocator else 0
        used = sch.preempt(rid, mode)
        self.seen[f"preempt() by {used}"] += 1
        assert used == ("swap" if swap else "recompute"), f"preempt({rid!r}, {mode!r}) did a {used}"
        assert m.num_free_blocks == gpu_free + len(only_here), "the preempted request's blocks did not come back"
        if swap:
            assert req in sch.swapped and m.cpu_allocator.num_free_blocks == cpu_free - len(inside)
            self.pending_swaps.add(rid)
        else:
            assert req in sch.waiting and all(s.num_computed == 0 for s in req.seqs)   # where: check_queue_order
        return used

    def drain(self) -> int:
        """Steps until idle, bounded generously by the requests' sizes; then every request finished
        with exactly ``max_tokens`` tokens per sample and every block is free."""
        work = sum(e.n * (len(e.prompt) + e.max_tokens) for e in self.expect.values())
        bound = 20 + 2 * (len(self.expect) + 1) * work
        steps = 0
        while self.sch.has_unfinished:
            if steps == bound:
                fail("6 progress", f"not idle after {bound} steps: running {[r.request_id for r in self.sch.running]}, "
                                   f"swapped {[r.request_id for r in self.sch.swapped]}, "
                                   f"waiting {[r.request_id for r in self.sch.waiting]}")
            self.step()
            self.check_all()
            steps += 1
        check_all_finished(self.sch, self.expect)
        return steps

    def check_all(self) -> None:
        check_pools(self.sch)
        check_blocks_equal_tables(self.sch)
        check_ref_counts(self.sch)
        check_queue_order(self.sch)
        check_max_num_seqs(self.sch)
        check_tokens(self.sch, self.expect)
        check_kv_reads_back(self.sch, self.expect, self.gpu_kv, self.cpu_kv, self.pending_swaps)


def check_all_finished(sch: Scheduler, expect: dict) -> None:
    """6. Idle means done: every accepted request finished once, each sample with exactly ``max_tokens``
    tokens, and every block is free (cached-free blocks are on the free list)."""
    m = sch.manager
    left = [rid for rid, e in expect.items() if not (e.done or e.errored) or sch.requests[rid].status != "finished"]
    if left or sorted(r.request_id for r in sch.finished) != sorted(expect):
        fail("6 progress", f"idle, but {left} did not finish (finished: {[r.request_id for r in sch.finished]})")
    for rid, e in expect.items():
        got = sch.requests[rid].outputs
        if e.errored and not e.outputs and not any(got):          # it failed before its first token
            continue
        if got != e.outputs:
            fail("6 progress", f"{rid!r} finished with {sch.requests[rid].outputs}, sampled {e.outputs}")
    cpu = m.cpu_allocator
    if m.num_free_blocks != m.num_blocks or (cpu is not None and cpu.num_free_blocks != cpu.num_blocks):
        fail("6 progress", f"idle with {m.num_blocks - m.num_free_blocks} GPU and "
                           f"{0 if cpu is None else cpu.num_blocks - cpu.num_free_blocks} CPU blocks still held")


# --- the state machine ------------------------------------------------------------------------
@st.composite
def configs(draw):
    caching = draw(st.sampled_from([False, False, True]), label="enable_prefix_caching")
    mode = "recompute" if caching else draw(st.sampled_from(["recompute", "swap"]), label="preemption_mode")
    cpu = draw(st.integers(1, 16), label="num_cpu_blocks") if mode == "swap" else \
        draw(st.sampled_from([0, 0, 8]), label="num_cpu_blocks")
    return SchedulerConfig(
        num_gpu_blocks=draw(st.integers(4, 24) | st.integers(1, 3), label="num_gpu_blocks"),
        block_size=draw(st.integers(1, 8), label="block_size"),
        num_cpu_blocks=cpu,
        max_num_seqs=draw(st.sampled_from([1, 2, 3, 256]), label="max_num_seqs"),
        max_num_batched_tokens=draw(st.integers(1, 8) | st.integers(32, 512), label="max_num_batched_tokens"),
        enable_chunked_prefill=draw(st.booleans(), label="chunked"),
        watermark=draw(st.sampled_from([0.0, 0.01, 0.1, 0.25]), label="watermark"),
        preemption_mode=mode,
        max_model_len=draw(st.sampled_from([None, None, 16]), label="max_model_len"),
        enable_prefix_caching=caching,   # without caching LPM must be FCFS: drawn less often there
        policy=draw(st.sampled_from(["fcfs", "lpm"] if caching else ["fcfs"] * 3 + ["lpm"]), label="policy"))


class SchedulerMachine(RuleBasedStateMachine):
    """Random add / step / preempt on one scheduler; every invariant after every rule, and a drain
    until idle at the end."""

    def __init__(self):
        super().__init__()
        self.d: Driver | None = None

    @initialize(cfg=configs(), echo=st.booleans(), base=st.lists(st.integers(0, 2), min_size=16, max_size=16),
                data=st.data(), burst=st.integers(1, 4))
    def start(self, cfg, echo, base, data, burst):
        """The run's configuration and first requests (hypothesis's swarm testing switches whole rules
        off in some runs, ``add`` among them)."""
        self.d, self.base = Driver(cfg, echo), base
        self.add(data, burst)

    @rule(data=st.data(), burst=st.integers(1, 4))
    def add(self, data, burst):
        """A burst of requests (so several run at once and the pool runs short).  Each prompt is a piece
        of the run's shared base (so prefixes are shared) and a tail; three in four are sized to fit a
        pool that the watermark and (chunked prefill off) the token budget leave, the others any size."""
        c = self.d.cfg
        cap = (c.num_gpu_blocks - int(c.watermark * c.num_gpu_blocks)) * c.block_size
        if not c.enable_chunked_prefill:
            cap = min(cap, c.max_num_batched_tokens)
        for _ in range(burst):
            fit = data.draw(st.sampled_from([True, True, True, False]), label="sized to fit")
            max_tokens = data.draw(st.integers(1, min(8, cap) if fit and cap >= 1 else 8), label="max_tokens")
            room = cap - max_tokens + 1 if fit else 20
            length = data.draw(st.integers(1, max(1, min(20, room))), label="prompt length")
            most = min(len(self.base), length)        # as much as it can, half the time: same-step hits
            shared = data.draw(st.integers(0, most) | st.just(most), label="shared")
            tail = data.draw(st.lists(st.integers(0, 2), min_size=length - shared, max_size=length - shared),
                             label="tail")
            n = data.draw(st.integers(1, 3), label="n")
            extra = "adapter" if c.enable_prefix_caching and data.draw(st.booleans(), label="salted") else None
            self.d.add(self.base[:shared] + tail, n, max_tokens, extra)

    @rule(k=st.sampled_from([1, 1, 2]))
    def step(self, k):
        for _ in range(k):
            self.d.step()
            self.d.check_all()

    @rule(data=st.data())
    def step_with_a_fault(self, data):
        """A step in which one request's part fails: it ends with an error, and every check still holds
        after it, the K/V check included, so no request reads, then or later, a slot that the failed
        part was to write (a block registered for it at schedule time must leave the cache)."""
        self.d.step(faulty=lambda rids: data.draw(st.sampled_from(rids), label="failing request"))
        self.d.check_all()

    @rule(data=st.data(), mode=st.sampled_from([None, "recompute", "swap"]))
    def preempt(self, data, mode):
        """Preempt a running request between steps; a no-op when nothing runs (as a precondition, that
        left no rule enabled in many runs, which hypothesis's swarm testing switches off at random)."""
        if not self.d.sch.running:
            return
        rid = data.draw(st.sampled_from(sorted((r.request_id for r in self.d.sch.running), key=str)))
        self.d.preempt(rid, mode)

    @invariant()
    def every_invariant_holds(self):
        if self.d is not None:
            self.d.check_all()

    def teardown(self):
        if self.d is not None:
            self.d.drain()
            seen = self.d.seen
            event(f"run: accepted {min(seen['accepted'], 4)}{'+' if seen['accepted'] >= 4 else ''}")
            for what in sorted(seen):
                if what != "accepted":
                    event(f"run: {what}")


# ~10 s on one core.  No explain phase: on a failure it replays the machine for minutes to name lines.
SchedulerMachine.TestCase.settings = settings(max_examples=250, stateful_step_count=30, deadline=None,
                                              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
test_scheduler_state_machine = SchedulerMachine.TestCase


# --- each check fires: a valid state, corrupted on purpose once per check ----------------------------
def _busy() -> Driver:
    """A driver mid-run with every queue in use: r0 (2 samples, forked, sharing its prompt's full
    blocks) and r2 running, r3 swapped out by the step, r1 swapped out between steps (its copy not
    run yet), r4 and r5 waiting behind them."""
    d = Driver(SchedulerConfig(num_gpu_blocks=10, block_size=2, num_cpu_blocks=8, preemption_mode="swap",
                               watermark=0.0, max_num_batched_tokens=64, max_num_seqs=8))
    d.add([0, 1, 2, 0, 1], 2, 4), d.add([1, 1, 1], 1, 6), d.add([2] * 7, 1, 3), d.add([0], 1, 2)
    for _ in range(2):
        d.step()
        d.check_all()
    d.preempt("r1", "swap")
    d.add([1], 1, 1), d.add([2], 1, 1)
    d.check_all()
    q = d.sch
    assert ([r.request_id for r in q.running], [r.request_id for r in q.swapped], [r.request_id for r in q.waiting]) \
        == (["r0", "r2"], ["r1", "r3"], ["r4", "r5"])
    assert q.running[0].forked and len(set(q.manager.block_ids(0)) & set(q.manager.block_ids(4))) == 2
    return d


def _held_block(d: Driver) -> int:
    return d.sch.manager.block_ids(d.sch.running[1].seqs[0].seq_id)[0]


def _stray_table(d: Driver) -> None:
    d.sch.manager.allocate(999, 1)


def _requeue_running(d: Driver) -> None:
    """r2 moves to the waiting queue, still holding its blocks."""
    r = d.sch.running.pop()
    r.status = "waiting"
    d.sch.waiting.append(r)


def _cpu_leak(d: Driver) -> None:
    d.sch.manager.cpu_allocator.allocate()


def _overcomputed(d: Driver) -> None:
    s = d.sch.running[1].seqs[0]
    s.num_computed = len(s.tokens) + 1


CORRUPTIONS = {
    "1 pools: an extra holder": (check_pools, lambda d: d.sch.manager.allocator.share(_held_block(d)), "ref count"),
    "1 pools: a holder in the wrong queue": (check_pools, _requeue_running,
                                             "do not match the queues|computed tokens but holds no blocks"),
    "2 blocks = tables: a leaked GPU block": (check_blocks_equal_tables, lambda d: d.sch.manager.allocator.allocate(),
                                              "GPU blocks are in use but the tables of the running"),
    "2 blocks = tables: a leaked CPU block": (check_blocks_equal_tables, _cpu_leak, "CPU blocks are in use"),
    "2 blocks = tables: a table of nobody": (check_blocks_equal_tables, _stray_table, r"sequences \[999\] hold GPU"),
    "2 blocks = tables: computed past the table": (check_blocks_equal_tables, _overcomputed, "its table holds"),
    "3 ref counts: GPU": (check_ref_counts, lambda d: d.sch.manager.allocator.share(_held_block(d)),
                          "ref count 2 but 1"),
    "3 ref counts: CPU": (check_ref_counts, lambda d: d.sch.manager.cpu_allocator.share(0),
                          "CPU block 0 has ref count 2"),
    "5 FCFS: waiting out of order": (check_queue_order, lambda d: d.sch.waiting.rotate(1), "waiting is not in arrival"),
    "5 FCFS: swapped out of order": (check_queue_order, lambda d: d.sch.swapped.reverse(), "swapped is not in arrival"),
    "5 FCFS: a status that lies": (check_queue_order, lambda d: setattr(d.sch.waiting[0], "status", "running"),
                                   "sit in waiting with another status"),
    "max_num_seqs": (check_max_num_seqs, lambda d: setattr(d.sch, "config", replace(d.cfg, max_num_seqs=2)),
                     "3 samples run, max_num_seqs 2"),
    "tokens: one too many": (check_tokens, lambda d: d.sch.running[1].seqs[0].tokens.append(9), "r2' sample 0 holds"),
    "tokens: a sample lost": (check_tokens, lambda d: d.sch.running[0].seqs.pop(), "r0' has samples"),
}


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_each_state_check_fires(name):
    check, corrupt, match = CORRUPTIONS[name]
    args = {check_tokens: lambda d: (d.sch, d.expect)}.get(check, lambda d: (d.sch,))
    d = _busy()
    check(*args(d))                                       # the valid state passes
    corrupt(d)
    with pytest.raises(AssertionError, match=match):
        check(*args(d))


def test_the_kv_check_fires_on_gpu_and_cpu_and_in_a_step():
    d = _busy()
    check_kv_reads_back(d.sch, d.expect, d.gpu_kv, d.cpu_kv, d.pending_swaps)
    bs = d.cfg.block_size
    cpu = d.sch.manager.swapped_table(d.sch.swapped[1].seqs[0].seq_id).block_ids[0] * bs      # r3's first token
    d.cpu_kv[cpu] = -1
    with pytest.raises(AssertionError, match=r"8 KV reads back: CPU slot of token 0 of sequence 3 \('r3'\)"):
        check_kv_reads_back(d.sch, d.expect, d.gpu_kv, d.cpu_kv, d.pending_swaps)
    d = _busy()
    d.gpu_kv[d.sch.manager.block_ids(0)[0] * bs + 1] = -1    # token 1 of r0's prompt, shared by its samples
    with pytest.raises(AssertionError, match=r"GPU slot of token 1 of sequence 0 \('r0'\)"):
        check_kv_reads_back(d.sch, d.expect, d.gpu_kv, d.cpu_kv, d.pending_swaps)
    with pytest.raises(AssertionError, match=r"chunk of sequence 0 \('r0'\) reads token 1 of its context"):
        d.step()                                             # the runner reads it too


def _step_out(d: Driver) -> SchedulerOutput:
    out = d.sch.schedule()
    check_chunks(out, d.sch, d.expect, d.finished_last)    # the real step passes
    check_token_budget(out, d.sch)
    return out


def _first(out: SchedulerOutput, **change) -> None:
    out.chunks[0] = out.chunks[0]._replace(**change)


def _start_early(out: SchedulerOutput, d: Driver) -> None:
    """The first chunk starts one token earlier, consistent in itself (its sequence's tokens there, the
    slots its block table gives): it would run a computed token again."""
    c, bs = out.chunks[0], d.cfg.block_size
    tokens = d.expect[c.request_id].tokens(c.index)
    _first(out, start=c.start - 1, token_ids=tuple(tokens[c.start - 1:c.seq_len]),
           slot_mapping=tuple(c.block_table[p // bs] * bs + p % bs for p in range(c.start - 1, c.seq_len)))


CHUNK_CORRUPTIONS = {
    "block table": (lambda out, d: _first(out, block_table=out.chunks[0].block_table[::-1]), "but the manager's is"),
    "slot mapping": (lambda out, d: _first(out, slot_mapping=tuple(s + 1 for s in out.chunks[0].slot_mapping)),
                     "its block table gives"),
    "tokens": (lambda out, d: _first(out, token_ids=(7,) * out.chunks[0].query_len), "but the sequence holds"),
    "start": (_start_early, "starts at 5, the sequence computed 6"),   # r0: prompt 5 + 1 decoded
    "sample": (lambda out, d: _first(out, sample=False), "sample=False"),
    "num_samples": (lambda out, d: _first(out, num_samples=2), "not a fresh leader"),
    "a sequence twice": (lambda out, d: out.chunks.append(out.chunks[0]), "two chunks in one step"),
    "finished_req_ids": (lambda out, d: out.finished_req_ids.append("r9"), "finished_req_ids"),
}


@pytest.mark.parametrize("name", CHUNK_CORRUPTIONS)
def test_each_chunk_check_fires(name):
    corrupt, match = CHUNK_CORRUPTIONS[name]
    d = _busy()
    out = _step_out(d)
    corrupt(out, d)
    with pytest.raises(AssertionError, match="7 step as data: .*" + match):
        check_chunks(out, d.sch, d.expect, d.finished_last)


def test_the_budget_check_fires(monkeypatch):
    d = _busy()
    out = _step_out(d)
    out.prefill_tokens += 1
    with pytest.raises(AssertionError, match=r"4 token budget: prefill \d+ \+ decode \d+ tokens != \d+"):
        check_token_budget(out, d.sch)
    out.prefill_tokens -= 1
    monkeypatch.setattr(d.sch, "config", replace(d.cfg, max_num_batched_tokens=out.num_tokens - 1))
    with pytest.raises(AssertionError, match="> max_num_batched_tokens"):
        check_token_budget(out, d.sch)
    d = Driver(SchedulerConfig(num_gpu_blocks=8, block_size=2, max_num_batched_tokens=3))
    d.add([1] * 7, 1, 2)
    out = _step_out(d)                                       # chunked prefill: 3 of 7 tokens
    monkeypatch.setattr(d.sch, "config", replace(d.cfg, enable_chunked_prefill=False))
    with pytest.raises(AssertionError, match="chunked prefill is off but sequence 0 of 'r0' runs 0..3 of its 7"):
        check_token_budget(out, d.sch)


def test_the_fcfs_step_check_fires():
    d = Driver(SchedulerConfig(num_gpu_blocks=16, block_size=2, max_num_seqs=2))
    for _ in range(3):
        d.add([1, 2, 3], 1, 3)
    before = Before([], [], ["r0", "r1", "r2"], True)
    out = d.sch.schedule()                                   # r0 and r1 start, r2 waits (max_num_seqs)
    check_fcfs_step(before, out, d.sch)
    with pytest.raises(AssertionError, match=r"not its head \(head-of-line blocking\)"):
        check_fcfs_step(replace(before, waiting=["r2", "r0", "r1"]), out, d.sch)
    reordered = replace(out, chunks=out.chunks[::-1], admitted=[])
    with pytest.raises(AssertionError, match="not its head"):
        check_fcfs_step(before, replace(out, admitted=["r1"]), d.sch)
    with pytest.raises(AssertionError, match="not in queue order"):
        check_fcfs_step(replace(before, running=["r0", "r1"], waiting=["r2"]), reordered, d.sch)
    with pytest.raises(AssertionError, match="without running a chunk"):
        check_fcfs_step(before, replace(out, chunks=out.chunks[:1]), d.sch)
    with pytest.raises(AssertionError, match=r"preempted \['r9'\] and still admitted"):
        check_fcfs_step(before, replace(out, preempted=["r9"]), d.sch)
    d.sch.requests["r2"].order = -1                          # as if r2, still waiting, had arrived first
    with pytest.raises(AssertionError, match=r"admitted 'r0' \(order 0\) while 'r2' \(order -1\), which arrived"):
        check_fcfs_step(before, out, d.sch)


def test_the_lpm_step_check_fires():
    """With ``policy="lpm"`` the step must admit the head of the longest-prefix-match ranking: a later
    arrival that hits the cache (r2) before an earlier one that does not (r1)."""
    d = Driver(SchedulerConfig(num_gpu_blocks=32, block_size=2, max_num_seqs=1, watermark=0.0,
                               enable_prefix_caching=True, policy="lpm"))
    d.add([1, 2, 3, 4, 5], 1, 1)
    d.drain()
    d.add([7, 8, 9], 1, 1), d.add([1, 2, 3, 4, 6], 1, 1)
    before = Before([], [], ["r1", "r2"], True, lpm_ranking(d.sch, d.expect))
    assert before.ranked == ["r2", "r1"]
    out = d.sch.schedule()
    check_fcfs_step(before, out, d.sch)
    assert out.admitted == ["r2"]
    with pytest.raises(AssertionError, match="not the head of its longest-prefix-match order"):
        check_fcfs_step(replace(before, ranked=["r1", "r2"]), out, d.sch)
    with pytest.raises(AssertionError, match="not a permutation of waiting"):
        check_fcfs_step(replace(before, ranked=["r2"]), out, d.sch)


def test_the_progress_checks_fire(monkeypatch):
    with pytest.raises(AssertionError, match="6 progress: requests are unfinished"):
        check_progress(Before([], [], ["r0"], True), SchedulerOutput())
    check_progress(Before([], [], [], False), SchedulerOutput())
    # the documented impossible case: a request that never passed admission raises, never loops
    d = Driver(SchedulerConfig(num_gpu_blocks=2, block_size=2))
    big = Request("big", [1] * 9, max_tokens=1)
    big.seqs.append(d.sch._new_seq(list(big.prompt), big.prompt_len, 0))
    d.sch.requests["big"] = big
    d.sch.waiting.append(big)
    with pytest.raises(PagedKVError, match="nothing can run: request 'big' cannot start"):
        d.sch.schedule()
    with pytest.raises(AssertionError, match="6 progress: schedule.. raised though"):
        d.step()
    # a scheduler that keeps preempting and never finishes: the drain's bound stops it
    d = Driver(SchedulerConfig(num_gpu_blocks=8, block_size=2))
    d.add([1], 1, 1)
    monkeypatch.setattr(d.sch, "schedule", lambda: SchedulerOutput(preempted=["r0"]))
    monkeypatch.setattr(d.sch, "update", lambda out, sampled: [])
    with pytest.raises(AssertionError, match="6 progress: not idle after 28 steps"):
        d.drain()                          # 20 + 2 * (1 request + 1) * (n 1 * (prompt 1 + max_tokens 1))
    # idle but something left behind
    d = _busy()
    d.drain()
    d.sch.manager.allocator.allocate()
    with pytest.raises(AssertionError, match="6 progress: idle with 1 GPU and 0 CPU blocks still held"):
        check_all_finished(d.sch, d.expect)
    d.expect["r4"].outputs[0].append(0)
    with pytest.raises(AssertionError, match=r"6 progress: idle, but \['r4'\] did not finish"):
        check_all_finished(d.sch, d.expect)


# --- the bugs the machine found, one deterministic example each ---------------------------------
def test_regression_an_older_preempted_request_stays_ahead_in_waiting():
    """A preempted request was put at the *front* of ``waiting`` ("it arrived before every request
    still waiting"), but an older preempted one may wait there already; the newer one then started
    first.  Here no preemption between steps is involved: ``b`` is recomputed while ``c`` is swapped
    out (the CPU pool holds one block), ``c`` comes back, grows, and its second swap falls back to
    recompute: ``waiting`` was ``[c, b]`` and ``c`` re-prefilled before ``b``, which arrived first."""
    d = Driver(SchedulerConfig(num_gpu_blocks=4, block_size=2, num_cpu_blocks=1, preemption_mode="swap",
                               watermark=0.0))
    d.add([0], 1, 6), d.add([0] * 3, 1, 4), d.add([0], 1, 4)
    started = []
    for _ in range(5):
        out = d.step()
        d.check_all()
        started += out.admitted
    assert started == ["r0", "r1", "r2", "r2"] and d.sch.num_swaps == 1 and d.sch.num_recomputes == 2
    assert [r.request_id for r in d.sch.waiting] == ["r1", "r2"]
    while d.sch.has_unfinished:
        started += d.step().admitted
    assert started[4:] == ["r1", "r2"]


def test_regression_preemptions_between_steps_keep_arrival_order():
    """The same through ``preempt()``: r0 then r1 preempted; r1 used to stand before r0."""
    d = Driver(SchedulerConfig(num_gpu_blocks=4, block_size=1, watermark=0.0, enable_chunked_prefill=False,
                               max_num_batched_tokens=4))
    d.add([0], 1, 2), d.add([0], 1, 2)
    d.step()
    d.preempt("r0", None), d.preempt("r1", None)
    assert [r.request_id for r in d.sch.waiting] == ["r0", "r1"]
    d.check_all()
    d.drain()


def test_regression_an_explicit_swap_with_prefix_caching_recomputes():
    """``SchedulerConfig`` refuses ``preemption_mode='swap'`` with prefix caching (a swapped request
    would hold cached blocks others share), but ``preempt(rid, "swap")`` on a prefix-caching scheduler
    with a CPU pool tried the swap: with a block shared by another request the manager raised
    ``BlockError`` after the request had left ``running``, and ``check()`` failed from then on.  It
    falls back to recompute, as a swap without room in the CPU pool does."""
    d = Driver(SchedulerConfig(num_gpu_blocks=16, block_size=2, num_cpu_blocks=8, watermark=0.0,
                               enable_prefix_caching=True))
    d.add([1, 2, 3, 4, 5], 1, 4)
    d.step()
    d.add([1, 2, 3, 4, 9], 1, 4)
    out = d.step()
    assert out.cache_hits == {"r1": 4}                      # r1 holds r0's two full blocks too
    assert d.sch.preempt("r1", "swap") == "recompute"
    d.check_all()
    d.drain()
    d = Driver(d.cfg)                                        # unshared blocks: no swap either
    d.add([1, 2, 3], 1, 4)
    d.step()
    assert d.preempt("r0", "swap") == "recompute"
    d.drain()


# --- same-step hits and faults: a denser workload than the machine's -----------------------------
@settings(max_examples=150, deadline=None)
@given(data=st.data(), block_size=st.integers(1, 4), num_blocks=st.integers(6, 32),
       budget=st.sampled_from([4, 16, 64]), chunked=st.booleans(), echo=st.booleans())
def test_same_step_hits_and_failed_parts_never_read_unwritten_kv(data, block_size, num_blocks, budget, chunked, echo):
    """Bursts of requests sharing prefixes of one base, on pools roomy enough to admit several at
    once, caching on: requests admitted together hit blocks the same step writes (registered at
    schedule time).  Now and then one request's part of a step fails (the driver writes none of its
    K/V).  After every step every check holds, the driver's K/V dict included: each chunk reads only
    slots written with its own prefix's K/V, so no hit, in that step or later, reads K/V that a failed
    part was to write; at the end every request finished and every block is free."""
    cfg = SchedulerConfig(num_gpu_blocks=num_blocks, block_size=block_size, watermark=0.0,
                          max_num_batched_tokens=budget, enable_chunked_prefill=chunked, enable_prefix_caching=True)
    d = Driver(cfg, echo)
    base = list(range(1, 13))
    for _ in range(data.draw(st.integers(1, 4), label="rounds")):
        for _ in range(data.draw(st.integers(2, 4), label="burst")):
            shared = data.draw(st.integers(0, len(base)), label="shared")
            tail = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=4), label="tail")
            d.add(base[:shared] + tail, data.draw(st.integers(1, 2), label="n"),
                  data.draw(st.integers(1, 4), label="max_tokens"))
        for _ in range(data.draw(st.integers(1, 4), label="steps")):
            if not d.sch.has_unfinished:
                break
            fault = data.draw(st.booleans(), label="a part fails")
            d.step(faulty=(lambda rids: data.draw(st.sampled_from(rids), label="failing request")) if fault else None)
            d.check_all()
    d.drain()
    for what in ("same-step hits", "a failed part with same-step readers"):
        if d.seen[what]:
            event(what)
