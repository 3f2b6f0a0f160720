"""The serving scheduler: who runs in the next step, which tokens, and in which blocks.

Every step of a serving engine begins here (vLLM paper §4.5; vLLM v0's ``Scheduler`` with chunked
prefill, read as a map, not copied).  :meth:`Scheduler.schedule` looks at three queues, in this
order, and fills one step's **token budget** (``max_num_batched_tokens``):

1. **running** requests, oldest first: a decoding sequence costs 1 token, a prompt still being
   prefilled gets a *chunk* of what the budget has left (a chunk may start and end inside a
   block).  The blocks are taken now; when the pool is short, the *latest* arrival still
   unscheduled is preempted (:func:`~paged_kv.scheduling.rules.preemption_victim`), possibly the
   request itself;
2. **swapped** requests, oldest first, if nothing was preempted in this step and the pool can take
   their blocks back above the watermark;
3. **waiting** requests, oldest first, while :meth:`Scheduler.admission` says now.  While anyone is
   swapped out nobody new starts (§4.5, as vLLM v0).  With ``policy="lpm"`` (SGLang's longest
   prefix match) they are walked by the prompt tokens each finds in the prefix cache, most first
   (:func:`~paged_kv.scheduling.rules.admission_order`), ranked at the start of the step, before
   this step's blocks are taken, as SGLang ranks its queue before it builds the prefill batch.

It returns the step as data (:class:`~paged_kv.scheduling.output.SchedulerOutput`); the engine runs
it and reports the sampled tokens back with :meth:`Scheduler.update`.  With prefix caching
(``enable_prefix_caching``, vLLM v1) an admission starts a request from the longest run of its full
blocks already cached, so only the rest is prefilled and charged to the budget.

A block is registered in the cache when the chunk that fills it is scheduled, as vLLM v1's
``KVCacheManager.allocate_slots`` does (it calls ``cache_blocks`` for the tokens the step will have
computed), so a request admitted later in the *same* step can hit it: two requests that share a
system prompt and arrive together compute it once.  That is safe because the runner writes every
K/V of a step before any chunk of the step reads them (the step's ``same_step_hits`` says who reads
whose), and because nothing can end the writer between its scheduling and its run: a preemption
victim is never a request already scheduled in the step, and ``finish_request``/``preempt`` refuse
while a step is in flight.  If the writer's part of the step fails, :meth:`Scheduler.update` drops
the entries registered for it, and each reader (:meth:`SchedulerOutput.readers_of`), which the
runner did not run, goes back to the waiting queue as if it had not been admitted.

**Speculative decoding** (chapter 9; as vLLM v1's scheduler, whose drafts being verified are part of
the request's ``num_new_tokens``, counted from ``num_tokens_with_spec``): given a proposer, a running
sequence that is decoding (one pending token, at least one generated) gets a *verify chunk*: its
last sampled token and up to ``k`` draft tokens, each with a slot of its own (a *lookahead slot*,
vLLM v0's name: ``num_lookahead_slots``), all ``1 + d`` counted against the token budget.  (vLLM
v1's own ``num_lookahead_tokens`` is another thing: slots reserved for the *next* step's drafts
(EAGLE, draft models; 0 for n-gram lookup); this scheduler reserves nothing ahead.)  The draft is capped at
``min(k, max_tokens - generated - 1, budget left - 1)`` (and by ``max_model_len``): the verify
pass emits the accepted drafts and one token more, never past ``max_tokens``.  The rule for
memory: a request's drafts are scheduled only if their extra blocks fit beside what the running
requests not yet scheduled in this step need for their own tokens; otherwise it decodes without
speculation this step.  So speculation never preempts anyone (vLLM v1 may preempt to fit a
request's draft tokens; here a draft, a guess, never evicts verified work), and never takes a block the pool's
other requests need now; it can delay an admission, whose budget and blocks it used.  A verify
chunk registers in the prefix cache only blocks that verified tokens fill (never a draft), and
:meth:`update` rolls the rejected drafts' slots back with
:meth:`~paged_kv.blocks.BlockSpaceManager.truncate`.  Pure Python.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable

from ..blocks import BlockSpaceManager
from ..errors import AdmissionError, ConfigError, OutOfBlocksError, PagedKVError
from ..sampling_params import SamplingParams
from ..spec_decode.proposer import check_draft, check_proposer
from .admission import Admission, Verdict, decide, never_reason, reserved_tokens
from .config import PREEMPTION_MODES, SchedulerConfig
from .output import Chunk, SchedulerOutput
from .preemption import recompute, swap_out
from .request import FINISHED, RUNNING, SWAPPED, WAITING, Request, Sequence
from .rules import admission_order, preemption_victim, requeue_preempted

__all__ = ["Scheduler"]


class Scheduler:
    """Continuous batching with chunked prefill and preemption over one block pool; FCFS, or longest
    prefix match first for the waiting queue (``config.policy``).

    Args:
        config: the :class:`~paged_kv.scheduling.config.SchedulerConfig`.
        proposer: drafts tokens for speculative decoding (:class:`~paged_kv.spec_decode.Proposer`),
            with ``config.num_lookahead_tokens >= 1``; ``None``: no speculation.

    Raises:
        ConfigError: a proposer without ``num_lookahead_tokens``, or the other way round.

    Attributes:
        waiting, running, swapped: the queues (:class:`~paged_kv.scheduling.request.Request`\\ s;
            ``waiting`` and ``swapped`` oldest first, ``waiting`` a deque; ``running`` in no set order,
            :meth:`schedule` serves it oldest first).
        manager: the :class:`~paged_kv.blocks.BlockSpaceManager` (GPU pool and CPU pool).
        finished: requests done, in finishing order.
        num_preemptions, num_recomputes, num_swaps, num_swapped_blocks: counters (blocks moved
            out, each shared block once).
        num_draft_tokens, num_accepted_tokens: draft tokens verified, and accepted (vLLM's
            ``SpecDecodingStats``); their ratio is the acceptance rate.
        prefix_queries, prefix_hits: prompt tokens looked up in the prefix cache at first
            admissions, and found there (vLLM's ``PrefixCacheStats.queries``/``hits``).
        preempted_prefix_queries, preempted_prefix_hits: the same at re-admissions after a
            recompute preemption, counted apart as vLLM does (``preempted_queries``/``hits``): a
            request re-finding its own blocks says nothing about sharing.
    """

    def __init__(self, config: SchedulerConfig, proposer=None) -> None:
        if not isinstance(config, SchedulerConfig):
            raise ConfigError(f"config must be a SchedulerConfig, got {config!r}")
        if (proposer is None) != (config.num_lookahead_tokens == 0):
            raise ConfigError(f"speculation needs both a proposer and num_lookahead_tokens >= 1: got "
                              f"{type(proposer).__name__} and num_lookahead_tokens={config.num_lookahead_tokens}")
        self.config = config
        self.proposer = None if proposer is None else check_proposer(proposer)
        self.num_draft_tokens = self.num_accepted_tokens = 0
        self._drafted: set[int] = set()        # sequences the proposer was asked about (released at their end)
        self.manager = BlockSpaceManager(config.num_gpu_blocks, config.block_size,
                                         num_cpu_blocks=config.num_cpu_blocks,
                                         enable_prefix_caching=config.enable_prefix_caching,
                                         hash_fn=config.prefix_caching_hash_algo)
        self.prefix_queries = self.prefix_hits = 0
        self.preempted_prefix_queries = self.preempted_prefix_hits = 0
        self._hashes: dict[int, list] = {}     # per sequence: its full blocks' chained hashes
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.finished: list[Request] = []
        self.requests: dict[Hashable, Request] = {}
        self.num_preemptions = self.num_recomputes = self.num_swaps = self.num_swapped_blocks = 0
        self._next_seq, self._next_order = 0, 0
        self._carry = SchedulerOutput()        # what a preempt() between steps leaves for the next
        self._step = 0                         # steps scheduled so far
        self._in_flight: SchedulerOutput | None = None   # scheduled, its result not yet recorded
        # the step being scheduled (reset by schedule()): blocks registered for it, by request, as
        # (seq id, block ids); which request writes each; and each admission's hit counts
        self._registered_now: dict[Hashable, list[tuple[int, list[int]]]] = {}
        self._writer_now: dict[int, Hashable] = {}
        self._admitted_now: dict[Hashable, tuple[bool, int, int]] = {}

    # --- submitting ---------------------------------------------------------------------------
    def add(self, request_id: Hashable, prompt: list[int], n: int | None = None, max_tokens: int | None = None,
            arrival: float = 0.0, extra_key: Hashable = None, *, sampling_params: SamplingParams | None = None,
            adapter_shift: int = 0) -> Request:
        """Queue a request (FCFS); returns it.  ``n`` and ``max_tokens`` default to
        ``sampling_params``' (else 1 and 16).  ``extra_key``: what besides the tokens changes its K/V
        (an adapter, a cache salt); it enters every block hash of the request.
        ``sampling_params`` and ``adapter_shift`` travel with its chunks to the runner.

        Raises:
            AdmissionError: it could never run here (the reason says why), or ``request_id`` is in
                use by a live request; nothing is queued.
            PromptError / ConfigError: an empty prompt, a bad count, ``n``/``max_tokens`` that
                disagree with ``sampling_params``.
        """
        try:
            hash(request_id)
        except TypeError:
            raise ConfigError(f"request_id must be hashable (a str or an int, say), got {request_id!r}") from None
        if request_id in self.requests and self.requests[request_id].status != FINISHED:
            raise AdmissionError(f"request id {request_id!r} is already in use")
        p = sampling_params
        if p is not None and not isinstance(p, SamplingParams):
            raise ConfigError(f"sampling_params must be a SamplingParams, got {p!r:.80}")
        n = (p.n if p is not None else 1) if n is None else n
        max_tokens = (p.max_tokens if p is not None else 16) if max_tokens is None else max_tokens
        req = Request(request_id, prompt, n, max_tokens, arrival, self._next_order, extra_key=extra_key,
                      sampling_params=p, adapter_shift=adapter_shift)
        verdict = self.admission(req)
        if verdict.verdict is Verdict.NEVER:
            raise AdmissionError(f"request {request_id!r} can never run: {verdict.reason}")
        req.seqs.append(self._new_seq(list(req.prompt), req.prompt_len, 0))
        self._next_order += 1
        self.requests[request_id] = req
        self.waiting.append(req)
        return req

    def admission(self, request: Request, preempted_this_step: bool = False,
                  budget_left: int | None = None) -> Admission:
        """May ``request`` start (or resume) now?  One function for the submit check and the step
        (:func:`~paged_kv.scheduling.admission.decide`, given this scheduler's state); the
        prefix-cache hit is looked up once, here, and returned with a ``NOW``."""
        never = never_reason(request, self.config)
        if never:
            return Admission(Verdict.NEVER, never)
        return decide(request, self.config, self.manager, self._cache_hit(request), num_swapped=len(self.swapped),
                      num_running=sum(r.n for r in self.running), preempted_this_step=preempted_this_step,
                      budget_left=budget_left)

    # --- one step -----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Plan the next step (see the module's docstring); the blocks are taken now.

        Raises:
            PagedKVError: the last step's result was not recorded yet (:meth:`update` comes first);
                or requests are unfinished but nothing can run (cannot happen when every request
                passed :meth:`admission`; raised rather than looping forever).
        """
        if self._in_flight is not None:
            raise PagedKVError(f"step {self._in_flight.step} is still in flight: record its result with "
                               f"update() before scheduling the next")
        self._step += 1
        self._registered_now, self._writer_now, self._admitted_now = {}, {}, {}
        out, self._carry = self._carry, SchedulerOutput()
        out.step = self._step
        ranked = self._ranked_waiting()
        budget = self.config.max_num_batched_tokens
        queue = sorted(self.running, key=_arrival)
        kept: list[Request] = []
        while queue:
            req = queue.pop(0)
            plan = req.plan(budget, self.config.enable_chunked_prefill)
            if not plan:
                kept.append(req)
                continue
            while self._blocks_for(plan) > self.manager.num_free_blocks:
                victim = self.choose_victim(queue) if queue else req
                if victim is not req:
                    if not any(victim is r for r in queue):    # a scheduled request's blocks may be hit
                        raise PagedKVError(f"choose_victim returned {getattr(victim, 'request_id', victim)!r:.40}, "
                                           f"not one of the candidates (the running requests not yet "
                                           f"scheduled in this step)")
                    queue.remove(victim)
                self._preempt(victim, out)
                if victim is req:
                    break
            else:
                budget -= self._commit(req, plan, out, self._drafts(req, plan, budget, queue))
                kept.append(req)
        self.running = kept
        preempted = bool(out.preempted)
        while self.swapped and not preempted and budget > 0:
            req = self.swapped[0]
            ids = [s.seq_id for s in req.holders()]
            # alone, it only needs its blocks back (its lifetime fits the pool); otherwise keep the
            # watermark and a block for each sequence's next token free as well
            reserve = self.config.watermark_blocks + len(ids) if self.running else 0
            if not self.manager.can_swap_in(ids, reserve) or \
                    sum(r.n for r in self.running) + len(ids) > self.config.max_num_seqs:
                break
            self.swapped.pop(0)
            out.copies.extend(self.manager.take_copies())   # copies go after the swap-in; no overlap
            out.swap_in.extend(self.manager.swap_in(ids))
            req.status = RUNNING
            self.running.append(req)
            out.admitted.append(req.request_id)
            plan = req.plan(budget, self.config.enable_chunked_prefill)
            if plan and self._blocks_for(plan) <= self.manager.num_free_blocks:
                budget -= self._commit(req, plan, out)
        for req in list(self.waiting) if ranked is None else ranked:
            verdict = self.admission(req, preempted, budget)
            if verdict.verdict is not Verdict.NOW:
                break
            self.waiting.remove(req)
            self._admit(req, verdict.hit, out)
            self.running.append(req)
            out.admitted.append(req.request_id)
            budget -= self._commit(req, req.plan(budget, self.config.enable_chunked_prefill), out)
        out.copies.extend(self.manager.take_copies())
        if out.empty and self.has_unfinished and not (out.swap_out or out.preempted):
            if self.running:
                raise PagedKVError(f"nothing can run: requests {[r.request_id for r in self.running]!r} are "
                                   f"running but none has a token to run (a broken state; see check())")
            head = self.waiting[0] if self.waiting else self.swapped[0]
            raise PagedKVError(f"nothing can run: request {head.request_id!r} cannot start "
                               f"({self.admission(head).reason or 'swap-in does not fit'})")
        self._in_flight = out
        return out

    def update(self, out: SchedulerOutput, sampled: dict[int, list[int]],
               failed: dict | None = None) -> list[Request]:
        """Record that ``out`` ran: its chunks' tokens are computed, ``sampled[seq_id]`` holds the
        tokens sampled from each chunk with ``sample`` (``num_samples`` of them, one per sample, for
        a fresh leader).  ``failed``: request id -> the error that stopped its part of the step (a
        runner's :attr:`~paged_kv.engine.runner.ModelRunnerOutput.failed`): those requests record
        nothing of the step (their K/V is not trusted: the blocks registered for them in this step
        leave the cache) and end with ``"error"``.  The readers of their blocks
        (:meth:`SchedulerOutput.readers_of`), which the runner did not run, record nothing either:
        they go back to the waiting queue as if not admitted (their hit is not counted) and are
        looked up again.  Finished sequences give their blocks back.  Returns the requests that
        finished.

        Raises:
            PagedKVError: ``out`` is not the step in flight (a stale, repeated or foreign step); a
                sampled token missing, extra, not an int >= 0, or for a chunk that does not sample.
                Nothing is recorded then.
        """
        if out is not self._in_flight:
            want = "no step" if self._in_flight is None else f"step {self._in_flight.step}"
            raise PagedKVError(f"update() records the step in flight ({want}); got step "
                               f"{getattr(out, 'step', out)!r:.40}: each scheduled step is recorded once, in order")
        failed = dict(failed or {})
        unknown = set(failed) - {c.request_id for c in out.chunks} - set(out.swapped) - set(out.admitted)
        if unknown:
            raise PagedKVError(f"failed names requests that are not in step {out.step}: {sorted(map(repr, unknown))}")
        unread = out.readers_of(failed)                    # nothing they would read was written
        out.check_sampled(sampled, skip=set(failed) | unread)
        self._in_flight = None
        touched: dict = {}
        for c in out.chunks:
            if c.request_id in failed or c.request_id in unread:
                continue
            req = self.requests[c.request_id]
            seq = _find(req, c.seq_id)
            seq.num_computed = c.seq_len                   # its blocks were registered at schedule()
            touched[req.request_id] = req
            if c.spec_token_ids:
                self._record_verified(req, seq, c, sampled[c.seq_id])
            elif c.sample:
                toks = sampled[c.seq_id]
                if c.num_samples > 1:                          # a fresh leader: the samples fork now
                    for i, tok in enumerate(toks[1:], start=1):
                        child = self._new_seq(list(req.prompt) + [tok], req.prompt_len, i)
                        self._fork(req, seq, child)
                        req.note_token(child)
                    req.forked = True
                seq.tokens.append(toks[0])
                req.note_token(seq)
            elif not req.forked and len(req.seqs) > 1 and seq is req.leader \
                    and seq.num_computed == req.prompt_len:
                for child in req.seqs:            # a resumed group: fork again at the prompt's end
                    if child is not seq and not child.finished:
                        self._fork(req, seq, child)
                req.forked = True
        done = [self._end(req) for req in touched.values() if self._free_finished(req)]
        for rid in [*failed, *unread]:                     # their K/V was never written: out of the cache
            for seq_id, blocks in self._registered_now.get(rid, ()):
                if seq_id in self.manager:
                    self.manager.discard_cached(seq_id, blocks)
        for rid, error in failed.items():
            done.append(self.finish_request(rid, "error", error, _in_step=True))
        for req in sorted((self.requests[r] for r in unread), key=_arrival, reverse=True):
            self._unadmit(req)
        return done

    def _record_verified(self, req: Request, seq: Sequence, chunk: Chunk, tokens: list[int]) -> None:
        """A verify chunk ran: ``tokens`` are its accepted drafts and one token more.  They join the
        sequence one by one, as plain decoding would add them, until one finishes it (a stop token
        id, ``max_tokens``): the rest are dropped.  The K/V written for the fed token and the kept
        drafts stays; the slots of the rest go back (:meth:`~paged_kv.blocks.BlockSpaceManager.truncate`,
        which frees the blocks wholly past the cut), as vLLM v1 lowers ``num_computed_tokens`` by
        the rejected count."""
        self.num_draft_tokens += len(chunk.spec_token_ids)
        self.num_accepted_tokens += len(tokens) - 1
        for tok in tokens:
            seq.tokens.append(tok)
            req.note_token(seq)
            if seq.finished:
                break
        seq.num_computed = len(seq.tokens) - 1             # every token but the newest has its K/V
        if not seq.finished and self.manager.num_tokens(seq.seq_id) > seq.num_computed:
            self.manager.truncate(seq.seq_id, seq.num_computed)

    def _unadmit(self, req: Request) -> None:
        """Put ``req``, admitted in the step just recorded, back as if it had not been: its blocks are
        freed, its hit uncounted, and it waits in arrival order (its K/V was never computed, and its
        generators never drew, so it will produce what it would have)."""
        preempted, queries, hits = self._admitted_now.pop(req.request_id)
        if preempted:
            self.preempted_prefix_queries -= queries
            self.preempted_prefix_hits -= hits
        else:
            self.prefix_queries -= queries
            self.prefix_hits -= hits
        req.cache_hits.pop()
        recompute(self.manager, req)
        req.status = WAITING
        self.running.remove(req)
        requeue_preempted(self.waiting, req, _arrival)

    def finish_request(self, request_id, reason: str = "abort", error: str | None = None, *,
                       _in_step: bool = False) -> Request:
        """End a request early, whatever its state (waiting, prefilling, running, swapped out, a
        group sharing blocks): every block it holds is freed once (full cached blocks stay cached
        for others), its unfinished samples get ``reason``, and it leaves its queue.  ``reason``:
        ``"abort"`` (vLLM's ``abort_request``), ``"error"`` (with ``error``, its text) or ``"stop"``
        (one sample reached a stop string: use :meth:`finish_sample`).  A finished request is left
        as it is.  Returns the request.

        Raises:
            PagedKVError: an unknown request, a step in flight, or an unknown reason.
        """
        if reason not in ("abort", "error"):
            raise PagedKVError(f"a request ends early by 'abort' or 'error', got {reason!r}")
        if self._in_flight is not None and not _in_step:
            raise PagedKVError(f"step {self._in_flight.step} is in flight: end a request between steps")
        req = self._request(request_id)
        if req.status == FINISHED:
            return req
        if req.status == SWAPPED:
            self._drop_pending_swap_out(req)
        for s in req.seqs:
            if s.seq_id in self.manager:      # its GPU blocks, or its CPU blocks if swapped out
                self.manager.free(s.seq_id)
            if s.finish_reason is None:
                s.finish_reason = reason
        req.finish_reason, req.error = reason, error
        queue = {WAITING: self.waiting, RUNNING: self.running, SWAPPED: self.swapped}[req.status]
        queue.remove(req)
        return self._end(req)

    def _drop_pending_swap_out(self, req: Request) -> None:
        """A request swapped out by :meth:`preempt` between steps and ended before the next step:
        its GPU -> CPU copies have not run yet.  Drop them, or the next step would copy into CPU
        blocks that ``free`` hands back (and may hand to another swap-out, the same destination
        named twice)."""
        cpu = {b for s in req.seqs if s.seq_id in self.manager.swapped_ids
               for b in self.manager.swapped_table(s.seq_id).block_ids}
        self._carry.swap_out[:] = [(g, c) for g, c in self._carry.swap_out if c not in cpu]
        if req.request_id in self._carry.swapped:
            self._carry.swapped.remove(req.request_id)

    def finish_sample(self, request_id, index: int, reason: str = "stop", drop: int = 0) -> bool:
        """End sample ``index`` of a running request between steps (the engine found a stop string in
        its text); its blocks are freed (shared ones lose a holder) and, if it was the last sample
        generating, the request finishes.  ``drop``: its last tokens to take back first (tokens
        a verify pass accepted after the one that completed the stop string).  Returns whether the
        request finished.

        Raises:
            PagedKVError: an unknown request, no such sample, a request not running, a step in
                flight, or a ``drop`` reaching into the prompt.
        """
        if self._in_flight is not None:
            raise PagedKVError(f"step {self._in_flight.step} is in flight: end a sample between steps")
        req = self._request(request_id)
        seq = next((s for s in req.seqs if s.index == index), None)
        if seq is None or req.status != RUNNING:
            raise PagedKVError(f"request {request_id!r} has no running sample {index} ({req.status})")
        if type(drop) is not int or not 0 <= drop <= seq.num_generated:
            raise PagedKVError(f"drop must be an int from 0 to the sample's {seq.num_generated} generated tokens, "
                               f"got {drop!r}")
        if drop:
            del seq.tokens[len(seq.tokens) - drop:]
            seq.num_computed = min(seq.num_computed, len(seq.tokens))
        if seq.finish_reason is None:
            seq.finish_reason = reason
        if self._free_finished(req):
            self._end(req)
        return req.status == FINISHED

    def _free_finished(self, req: Request) -> bool:
        """Free the blocks of ``req``'s finished samples; returns whether the request has ended."""
        for s in req.seqs:
            if s.finished and s.seq_id in self.manager:
                self.manager.free(s.seq_id)
                self._release_draft(s.seq_id)
        return req.finished and req.status == RUNNING

    def _release_draft(self, seq_id: int) -> None:
        """A sequence is done: a proposer with a cache of its own drops its state for it."""
        if seq_id not in self._drafted:
            return
        self._drafted.discard(seq_id)
        release = getattr(self.proposer, "release", None)
        if callable(release):
            release(seq_id)

    def _end(self, req: Request) -> Request:
        """``req`` has ended: off the running queue (the caller took it off any other), into
        ``finished``, and named to the runner in the next step's ``finished_req_ids``."""
        if req in self.running:
            self.running.remove(req)
        req.status = FINISHED
        self.finished.append(req)
        self._carry.finished_req_ids.append(req.request_id)
        for s in req.seqs:
            self._hashes.pop(s.seq_id, None)
            self._release_draft(s.seq_id)
        return req

    def _request(self, request_id) -> Request:
        try:
            req = self.requests.get(request_id)
        except TypeError:
            raise PagedKVError(f"request ids are hashable, got {request_id!r}") from None
        if req is None:
            raise PagedKVError(f"no request {request_id!r}")
        return req

    def choose_victim(self, candidates: list[Request]) -> Request:
        """The request to preempt among ``candidates``, the running requests not yet scheduled in this
        step (all arrived after the one that needs the blocks).  The shared rule: the latest arrival
        (:func:`~paged_kv.scheduling.rules.preemption_victim`, vLLM paper §4.5).  Override it to try
        another rule (SGLang retracts the request with the fewest generated tokens first)."""
        return preemption_victim(candidates, _arrival)

    def preempt(self, request_id, mode: str | None = None) -> str:
        """Preempt a running request now, between steps (the live panel's button; tests), by
        ``mode`` (default: the configured one); a swap-out is done at the start of the next step.
        Returns the mode used (a swap without room in the CPU pool, or with prefix caching on, falls
        back to recompute).

        Raises:
            PagedKVError: ``request_id`` is not running.
            ConfigError: an unknown mode.
        """
        if mode is not None and mode not in PREEMPTION_MODES:
            raise ConfigError(f"mode must be one of {PREEMPTION_MODES}, got {mode!r}")
        if self._in_flight is not None:
            raise PagedKVError(f"step {self._in_flight.step} is in flight: preempt between steps, after update()")
        req = self._request(request_id)
        if req.status != RUNNING:
            raise PagedKVError(f"request {request_id!r} is not running ({req.status}); only a running one is preempted")
        self.running.remove(req)
        self._preempt(req, self._carry, mode)
        self._carry.preempted.clear()
        return "swap" if req.status == SWAPPED else "recompute"

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def check(self) -> None:
        """Verify the pools (:meth:`BlockSpaceManager.check`) and that block holders match queues:
        running requests hold GPU blocks, swapped ones CPU blocks, waiting and finished none; no
        request has more than ``n`` sequences; a waiting request has nothing computed; a swap-out
        left for the next step copies only into CPU blocks a swapped-out sequence holds.

        Raises:
            PagedKVError: the first breach, named.
        """
        self.manager.check()
        for r in self.requests.values():
            if len(r.seqs) > r.n:
                raise PagedKVError(f"request {r.request_id!r} has {len(r.seqs)} sequences for n = {r.n}")
        for r in self.waiting:
            if any(s.num_computed for s in r.seqs):
                raise PagedKVError(f"waiting request {r.request_id!r} has computed tokens but holds no blocks")
        gpu, cpu = set(self.manager.seq_ids), set(self.manager.swapped_ids)
        want_gpu = {s.seq_id for r in self.running for s in r.holders()}
        want_cpu = {s.seq_id for r in self.swapped for s in r.holders()}
        if gpu != want_gpu or cpu != want_cpu:
            raise PagedKVError(f"block holders do not match the queues: GPU {sorted(gpu)} vs "
                               f"{sorted(want_gpu)}, CPU {sorted(cpu)} vs {sorted(want_cpu)}")
        held = {b for sid in cpu for b in self.manager.swapped_table(sid).block_ids}
        stale = sorted({c for _, c in self._carry.swap_out} - held)
        if stale:
            raise PagedKVError(f"the next step's swap-out copies into CPU blocks {stale} that no "
                               "swapped-out sequence holds")

    # --- helpers ------------------------------------------------------------------------------
    def _new_seq(self, tokens: list[int], prompt_len: int, index: int) -> Sequence:
        seq = Sequence(self._next_seq, tokens, prompt_len, index=index)
        self._next_seq += 1
        return seq

    def _fork(self, req: Request, leader: Sequence, child: Sequence) -> None:
        """``child`` shares the leader's blocks from the prompt's end on (copy-on-write)."""
        child.num_computed = leader.num_computed
        self.manager.fork(leader.seq_id, child.seq_id)
        if child not in req.seqs:
            req.seqs.append(child)

    def _ranked_waiting(self) -> list[Request] | None:
        """With ``policy="lpm"``, the waiting requests in the order admission will walk them this step
        (their hits looked up in the cache as the last step left it); ``None``: arrival order, because
        the policy is FCFS, or nothing is cached without prefix caching (every hit is 0, so LPM's
        order is FCFS's), or nobody can start this step anyway: ``max_num_seqs`` sequences run, or
        no block is free above the watermark (every admission takes at least one, for the token
        after its hit, and this step's running requests only take more)."""
        c = self.config
        if c.policy == "fcfs" or not c.enable_prefix_caching or not self.waiting or \
                sum(r.n for r in self.running) >= c.max_num_seqs or \
                self.manager.num_free_blocks - 1 < c.watermark_blocks:
            return None
        hits = {r.request_id: len(self._cache_hit(r)) * c.block_size for r in self.waiting}
        return admission_order(self.waiting, c.policy, lambda r: hits[r.request_id], _arrival)

    def _cache_hit(self, req: Request) -> list[int]:
        """The blocks the leader's prefill target hits in the prefix cache now."""
        leader = req.leader
        if not self.config.enable_prefix_caching or leader is None:
            return []
        tokens = leader.tokens[:req.prefill_target]
        hashes = self.manager.cache.hashes(tokens, req.extra_key, self._hashes.setdefault(leader.seq_id, []))
        return self.manager.cache_hit(tokens, req.extra_key, hashes)

    def _admit(self, req: Request, hit: tuple[int, ...], out: SchedulerOutput) -> None:
        """Give the leader its blocks; with prefix caching its table starts with the ``hit`` blocks
        (looked up by :meth:`admission`) and it is computed up to them."""
        c = self.config
        tokens = reserved_tokens(req, c)
        self.manager.allocate(req.leader.seq_id, tokens, cached=hit)
        out.prompt_token_ids[req.request_id] = tuple(req.leader.tokens[:req.leader.prompt_len])
        if c.enable_prefix_caching:
            saved = len(hit) * c.block_size
            req.leader.num_computed = saved
            if req.preemptions:                # a re-admission: it may re-find its own blocks
                self.preempted_prefix_queries += tokens
                self.preempted_prefix_hits += saved
            else:
                self.prefix_queries += tokens
                self.prefix_hits += saved
            self._admitted_now[req.request_id] = (bool(req.preemptions), tokens, saved)
            req.cache_hits.append(saved)
            out.cache_hits[req.request_id] = saved
            out.hit_blocks.extend(hit)
            writers = [self._writer_now[b] for b in hit if b in self._writer_now]
            if writers:                        # blocks this step writes: registered at schedule time
                out.same_step_hits[req.request_id] = tuple(dict.fromkeys(writers))
        req.status = RUNNING

    def _blocks_for(self, plan: list[tuple[Sequence, int]]) -> int:
        """Free blocks the plan's new slots take (tokens past what each table holds)."""
        m = self.manager
        grow = [(s.seq_id, s.num_computed + k - m.num_tokens(s.seq_id)) for s, k in plan]
        if len(grow) == 1 and grow[0][1] <= 1:           # the common case: one decode token
            return m.blocks_to_append(grow[0][0]) if grow[0][1] == 1 else 0
        return m.blocks_to_append_all([g[0] for g in grow], [max(0, g[1]) for g in grow])

    def _drafts(self, req: Request, plan: list[tuple[Sequence, int]], budget: int,
                queue: list[Request]) -> dict[int, tuple[int, ...]]:
        """The draft tokens ``req``'s decoding sequences verify in this step (seq id -> drafts), by
        the rule of the module's docstring; ``{}``: no proposer, nothing decoding, or the drafts'
        blocks do not fit beside ``queue``'s (the running requests still to schedule)."""
        if self.proposer is None:
            return {}
        c, drafts = self.config, {}
        left = budget - sum(k for _, k in plan)
        for seq, k in plan:
            if k != 1 or seq.num_pending != 1 or seq.num_generated == 0 or left <= 0:
                continue                                   # a prefill chunk, or no budget for a draft
            limit = min(c.num_lookahead_tokens, req.max_tokens - seq.num_generated - 1, left)
            if c.max_model_len is not None:                # the last draft sits at position len(tokens) - 1 + d
                limit = min(limit, c.max_model_len - len(seq.tokens))
            if limit <= 0:
                continue
            self._drafted.add(seq.seq_id)
            try:
                draft = self.proposer.propose(tuple(seq.tokens), limit, seq_id=seq.seq_id)
            except OutOfBlocksError:                       # a draft model's own pool is full: no draft
                continue
            draft = check_draft(draft, limit, seq.seq_id)
            if draft:
                drafts[seq.seq_id] = tuple(draft)
                left -= len(draft)
        if not drafts:
            return {}
        wider = [(seq, k + len(drafts.get(seq.seq_id, ()))) for seq, k in plan]
        others = sum(self._blocks_for(r.plan(left, c.enable_chunked_prefill)) for r in queue)
        if self._blocks_for(wider) + others > self.manager.num_free_blocks:
            return {}                                      # no room: decode without speculation
        return drafts

    def _commit(self, req: Request, plan: list[tuple[Sequence, int]], out: SchedulerOutput,
                drafts: dict[int, tuple[int, ...]] | None = None) -> int:
        """Take the plan's slots and record its chunks, each complete for the runner; returns the
        tokens used.  The slot mapping is computed here, once.  ``drafts``: per sequence, the draft
        tokens its verify chunk runs after its one pending token (:meth:`_drafts`)."""
        m, used = self.manager, 0
        p = req.sampling_params
        penalty = p is not None and p.frequency_penalty != 0
        for seq, k in plan:
            draft = (drafts or {}).get(seq.seq_id, ())
            start, verified = seq.num_computed, seq.num_computed + k     # verified: tokens the sequence holds
            end = verified + len(draft)
            grow = end - m.num_tokens(seq.seq_id)
            if grow == 1 and k == 1 and not draft:         # a decode token: one slot
                slots = (m.append_slot(seq.seq_id),)
            else:
                if grow > 0:
                    m.append_slots(seq.seq_id, grow)
                slots = tuple(m.slot_mapping(seq.seq_id, start, end))
            sample = verified == len(seq.tokens) and (req.forked or len(req.seqs) == 1)
            num_samples = req.n if sample and not req.forked else 1
            out.chunks.append(Chunk(req.request_id, seq.seq_id, seq.index, start,
                                    tuple(seq.tokens[start:verified]) + draft, slots, m.block_ids(seq.seq_id),
                                    sample, num_samples, p, tuple(seq.output) if sample and penalty else (),
                                    req.adapter_shift, draft))
            if self.config.enable_prefix_caching:          # rule 2: registered when scheduled (vLLM v1);
                added = m.cache_full_blocks(seq.seq_id, seq.tokens, verified, req.extra_key,   # drafts never
                                            self._hashes.setdefault(seq.seq_id, []))
                if added:
                    self._registered_now.setdefault(req.request_id, []).append((seq.seq_id, added))
                    self._writer_now.update(dict.fromkeys(added, req.request_id))
            if k == 1 and sample and start >= seq.prompt_len:
                out.decode_tokens += 1
            else:
                out.prefill_tokens += k
            out.num_draft_tokens += len(draft)
            used += k + len(draft)
        return used

    def _preempt(self, req: Request, out: SchedulerOutput, mode: str | None = None) -> None:
        self.num_preemptions += 1
        req.preemptions += 1
        out.preempted.append(req.request_id)
        # with prefix caching a request's blocks may be other requests' cached blocks too: never swapped
        # (SchedulerConfig refuses preemption_mode='swap' with it; an explicit mode='swap' recomputes)
        if (mode or self.config.preemption_mode) == "swap" and self.manager.cpu_allocator is not None \
                and not self.config.enable_prefix_caching:
            out.copies.extend(self.manager.take_copies())      # a swap moves blocks whose copies are done
            mapping = swap_out(self.manager, req)
            if mapping is not None:
                out.swap_out.extend(mapping)
                self.num_swaps += 1
                self.num_swapped_blocks += len(mapping)
                out.swapped.append(req.request_id)
                req.status = SWAPPED
                self.swapped.append(req)
                self.swapped.sort(key=_arrival)
                return
        recompute(self.manager, req)
        req.status = WAITING
        self.num_recomputes += 1
        out.recomputed.append(req.request_id)
        requeue_preempted(self.waiting, req, _arrival)


def _arrival(req: Request) -> int:
    """FCFS key: the request's arrival rank."""
    return req.order


def _find(req: Request, seq_id: int) -> Sequence:
    for s in req.seqs:
        if s.seq_id == seq_id:
            return s
    raise PagedKVError(f"request {req.request_id!r} has no sequence {seq_id}")
