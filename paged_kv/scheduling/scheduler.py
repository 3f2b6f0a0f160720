"""The serving scheduler: who runs in the next step, which tokens, and in which blocks.

Every step of a serving engine begins here (vLLM paper §4.5; vLLM v0's ``Scheduler`` with chunked
prefill, read as a map, not copied).  :meth:`Scheduler.schedule` looks at three queues, in this
order, and fills one step's **token budget** (``max_num_batched_tokens``):

1. **running** requests, oldest first: each decoding sequence costs 1 token; a prompt still being
   prefilled gets a *chunk* of what the budget has left (chunked prefill: a chunk may start and
   end anywhere inside a block).  The blocks a chunk or decode token needs are taken now; when
   the pool is short, the *latest* arrival still unscheduled is preempted (the shared rule
   :func:`~paged_kv.scheduling.rules.preemption_victim`), possibly the request itself;
2. **swapped** requests (preempted by swap), oldest first, if nothing was preempted in this step
   and the GPU pool can take their blocks back above the watermark;
3. **waiting** requests, oldest first, admitted while :meth:`Scheduler.admission` says ``"now"``;
   a preempted request re-enters at the head (:func:`~paged_kv.scheduling.rules.requeue_preempted`).
   While any request is swapped out, nobody new is admitted: the paper (§4.5) stops accepting new
   requests until the swapped ones are back, as vLLM v0 does.

**Admission** answers "now", "later" or "never" with one function, used both when a request is
submitted (:meth:`Scheduler.add`: "never" raises :class:`~paged_kv.errors.AdmissionError`) and in
every step (head-of-line blocking on "later").  "Never" means the request could not finish even
alone: its prompt plus what it must generate (``P + max_tokens - 1`` stored tokens per sample, the
last sampled token is never fed back) needs more blocks than the whole pool.

**Preemption.**  *Recompute* frees the victim's blocks and sets every sequence's ``num_computed``
to 0; re-admitted, it re-prefills prompt *and* generated tokens (``prompt_len`` stays the prompt's,
so penalties still count only generated tokens) and samples nothing until all are back in.  A
group of ``n`` samples re-prefills its prompt once in the leader; the others fork from it at the
prompt's end and re-prefill only their own tokens, so sharing survives the preemption.  *Swap*
moves the group's blocks to the CPU pool (each shared block once) and back later; with too small
a CPU pool the victim is recomputed instead (vLLM v0 aborts the request).  Groups are preempted
whole.

The scheduler is bookkeeping (pure Python, no tensors): its :class:`SchedulerOutput` says which
token ranges to run, where their K/V goes, and which block copies and swaps to do first; the
engine (:mod:`paged_kv.engine`) runs the model, samples, and reports back with
:meth:`Scheduler.update`.

**Prefix caching** (``enable_prefix_caching``, chapter 8; vLLM v1): when a request is admitted or
re-admitted (after a recompute preemption), the scheduler first looks up the longest run of its
full blocks already in the cache (:meth:`~paged_kv.blocks.BlockSpaceManager.cache_hit`); the hit
blocks join its table, ``num_computed`` starts past them, and only the rest is prefilled and
charged to the token budget.  The lookup is made again at every admission attempt (the cache
changes while a request waits), but the hit counters (:attr:`Scheduler.prefix_queries`,
:attr:`Scheduler.prefix_hits`) move only when an admission succeeds, so a failed attempt counts
nothing.  After each step, blocks that filled are registered
(:meth:`~paged_kv.blocks.BlockSpaceManager.cache_full_blocks`).

Legend: BS block size (tokens per block), P prompt tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Hashable, NamedTuple

from ..blocks import BlockSpaceManager
from ..blocks.block_table import blocks_needed, group_blocks_needed
from ..defaults import BLOCK_SIZE, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, WATERMARK
from ..errors import AdmissionError, ConfigError, PagedKVError
from ..validate import count, real
from .request import FINISHED, RUNNING, SWAPPED, WAITING, Request, Sequence
from .rules import may_admit, preemption_victim, requeue_preempted

__all__ = ["Admission", "Chunk", "SchedulerConfig", "SchedulerOutput", "Scheduler", "group_blocks_needed"]

PREEMPTION_MODES = ("recompute", "swap")
RESERVATIONS = ("none", "oracle", "max")


@dataclass(frozen=True)
class SchedulerConfig:
    """The knobs, named as vLLM names them.

    Attributes:
        num_gpu_blocks: blocks in the GPU pool (NB).
        block_size: token slots per block (BS; vLLM ``block_size``, default 16).
        num_cpu_blocks: blocks in the CPU swap pool (vLLM sizes it from ``swap_space`` GiB); 0: none.
        max_num_seqs: most sequences running at once (vLLM ``max_num_seqs``, 256).
        max_num_batched_tokens: the token budget of one step, prefill chunks and decode tokens
            together (vLLM ``max_num_batched_tokens``; 512 was v0's default with chunked prefill).
        enable_chunked_prefill: split prompts over steps by the budget; off, a prompt runs whole
            or waits (and one longer than the budget is refused).
        watermark: fraction of the GPU blocks admission keeps free (vLLM's 0.01), so running
            requests can grow a while before anyone is preempted.
        preemption_mode: ``"recompute"`` (vLLM's default) or ``"swap"`` (needs ``num_cpu_blocks``).
        max_model_len: most tokens a sequence may hold (prompt + output); ``None``: no cap.
        reservation: ``"none"`` (paging: blocks on demand), or a contiguous-style reservation made
            at admission, to compare with Orca as the paper does (§6.1): ``"oracle"`` reserves
            the request's exact ``P + max_tokens - 1`` tokens, ``"max"`` reserves ``max_model_len``.
            Modelled in whole blocks, so it is *kinder* than real contiguous allocation (no external
            fragmentation); ``n = 1`` only.
        enable_prefix_caching: automatic prefix caching (vLLM's ``enable_prefix_caching``; off by
            default here, on by default in vLLM v1): full blocks are found again by their prefix.
        prefix_caching_hash_algo: the block hash, ``"sha256"`` (vLLM's name for the option) or a
            function ``(parent, token_ids, extra_key) -> hashable`` (tests inject collisions).

    Raises:
        ConfigError: a count that is not an int in range, an unknown mode, swap without a CPU pool,
            ``"max"`` without ``max_model_len``; prefix caching with swap or a reservation (vLLM v1,
            which caches prefixes, preempts by recompute only and reserves nothing).
    """

    num_gpu_blocks: int
    block_size: int = BLOCK_SIZE
    num_cpu_blocks: int = 0
    max_num_seqs: int = MAX_NUM_SEQS
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    enable_chunked_prefill: bool = True
    watermark: float = WATERMARK
    preemption_mode: str = "recompute"
    max_model_len: int | None = None
    reservation: str = "none"
    enable_prefix_caching: bool = False
    prefix_caching_hash_algo: str | Callable = "sha256"

    def __post_init__(self) -> None:
        fix = lambda name, value: object.__setattr__(self, name, value)  # frozen dataclass
        fix("num_gpu_blocks", count("num_gpu_blocks", self.num_gpu_blocks))
        fix("block_size", count("block_size (tokens per block)", self.block_size))
        fix("num_cpu_blocks", count("num_cpu_blocks", self.num_cpu_blocks, 0))
        fix("max_num_seqs", count("max_num_seqs", self.max_num_seqs))
        fix("max_num_batched_tokens", count("max_num_batched_tokens", self.max_num_batched_tokens))
        fix("watermark", real("watermark (a fraction of the GPU blocks)", self.watermark, 0.0, 1.0, high_open=True))
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ConfigError(f"enable_chunked_prefill must be True or False, got {self.enable_chunked_prefill!r}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ConfigError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")
        if self.preemption_mode == "swap" and not self.num_cpu_blocks:
            raise ConfigError("preemption_mode='swap' needs a CPU pool: set num_cpu_blocks >= 1")
        if self.max_model_len is not None:
            fix("max_model_len", count("max_model_len (tokens)", self.max_model_len))
        if self.reservation not in RESERVATIONS:
            raise ConfigError(f"reservation must be one of {RESERVATIONS}, got {self.reservation!r}")
        if self.reservation == "max" and self.max_model_len is None:
            raise ConfigError("reservation='max' reserves max_model_len tokens: set max_model_len")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ConfigError(f"enable_prefix_caching must be True or False, got {self.enable_prefix_caching!r}")
        if self.enable_prefix_caching and (self.preemption_mode == "swap" or self.reservation != "none"):
            raise ConfigError(f"prefix caching works with preemption_mode='recompute' and reservation='none' "
                              f"only (got {self.preemption_mode!r}, {self.reservation!r}): a swapped or "
                              f"reserved request would hold cached blocks other requests share")

    @property
    def watermark_blocks(self) -> int:
        """Blocks admission keeps free: ``int(watermark * num_gpu_blocks)`` (as vLLM rounds)."""
        return int(self.watermark * self.num_gpu_blocks)


class Admission(NamedTuple):
    """The answer to "may this request start?": ``verdict`` is ``"now"``, ``"later"`` or
    ``"never"``; ``reason`` says why, in words (empty for ``"now"``)."""

    verdict: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One sequence's share of a step: tokens ``start .. start + length - 1`` of it run now.

    Attributes:
        request_id, seq_id, index: whose tokens (``index``: the sample's number in its request).
        start: the first position (the tokens before it are in the cache: the *context*).
        length: tokens run (1 for a decode token).
        slots: the slots their K/V go to (``slot = block_id * BS + offset``).
        sample: whether the step samples a token from this chunk's last position (the sequence
            is then fully computed).  ``num_samples``: sample ``n`` tokens (one per sample) from it: the
            leader of a fresh ``n``-sample request has just finished the prompt.
    """

    request_id: Hashable
    seq_id: int
    index: int
    start: int
    length: int
    slots: tuple[int, ...]
    sample: bool
    num_samples: int = 1


@dataclass
class SchedulerOutput:
    """What one step must do, in order: ``swap_out`` (GPU → CPU block pairs), ``swap_in``
    (CPU → GPU), ``copies`` (copy-on-write ``(src, dst)`` GPU blocks), then run ``chunks``.

    Also: ``preempted`` (request ids, with ``recomputed`` and ``swapped`` split), ``admitted``
    (request ids that started or resumed), ``prefill_tokens`` and ``decode_tokens`` (the budget
    used), ``kv_tokens`` (tokens in the cache that the step's attention reads, for the timing model),
    ``cache_hits`` (per request admitted in this step, the prompt tokens its prefix-cache hit saved)
    and ``hit_blocks`` (the blocks those hits handed out).
    """

    chunks: list[Chunk] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list = field(default_factory=list)
    recomputed: list = field(default_factory=list)
    swapped: list = field(default_factory=list)
    admitted: list = field(default_factory=list)
    prefill_tokens: int = 0
    decode_tokens: int = 0
    kv_tokens: int = 0
    cache_hits: dict = field(default_factory=dict)
    hit_blocks: list = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens

    @property
    def empty(self) -> bool:
        return not self.chunks


class Scheduler:
    """FCFS continuous batching with chunked prefill and preemption over one block pool.

    Args:
        config: the :class:`SchedulerConfig`.

    Attributes:
        waiting, running, swapped: the queues (:class:`~paged_kv.scheduling.request.Request`\\ s,
            oldest first; ``waiting`` is a deque).
        manager: the :class:`~paged_kv.blocks.BlockSpaceManager` (GPU pool and CPU pool).
        finished: requests done, in finishing order.
        num_preemptions, num_swapped_blocks: counters (blocks moved out, each shared block once).
        prefix_queries, prefix_hits: tokens looked up in the prefix cache at successful admissions,
            and tokens found (vLLM's prefix-cache queries and hits); their ratio is the hit rate.
            Re-admissions after a preemption count here too; vLLM's ``PrefixCacheStats`` counts them
            apart (``preempted_queries``, ``preempted_hits``).
    """

    def __init__(self, config: SchedulerConfig) -> None:
        if not isinstance(config, SchedulerConfig):
            raise ConfigError(f"config must be a SchedulerConfig, got {config!r}")
        self.config = config
        self.manager = BlockSpaceManager(config.num_gpu_blocks, config.block_size,
                                         num_cpu_blocks=config.num_cpu_blocks,
                                         enable_prefix_caching=config.enable_prefix_caching,
                                         hash_fn=config.prefix_caching_hash_algo)
        self.prefix_queries = self.prefix_hits = 0
        self._hashes: dict[int, list] = {}     # per sequence: its full blocks' chained hashes
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.finished: list[Request] = []
        self.requests: dict[Hashable, Request] = {}
        self.num_preemptions = self.num_recomputes = self.num_swaps = self.num_swapped_blocks = 0
        self._next_seq, self._next_order = 0, 0
        self._carry = SchedulerOutput()

    # --- submitting ---------------------------------------------------------------------------
    def add(self, request_id: Hashable, prompt: list[int], n: int = 1, max_tokens: int = 16,
            arrival: float = 0.0, extra_key: Hashable = None) -> Request:
        """Queue a request (FCFS); returns it.  ``extra_key``: what besides the tokens changes its
        K/V (an adapter, a cache salt); it enters every block hash of the request.

        Raises:
            AdmissionError: it could never run here (:meth:`admission` says ``"never"``, with why),
                or ``request_id`` is already live; nothing is queued.
            PromptError / ConfigError: an empty prompt, ``n`` or ``max_tokens`` not an int >= 1.
        """
        try:
            hash(request_id)
        except TypeError:
            raise ConfigError(f"request_id must be hashable (a str or an int, say), got {request_id!r}") from None
        if request_id in self.requests and self.requests[request_id].status != FINISHED:
            raise AdmissionError(f"request id {request_id!r} is already in use")
        req = Request(request_id, list(prompt), n, max_tokens, arrival, self._next_order, extra_key=extra_key)
        verdict = self.admission(req)
        if verdict.verdict == "never":
            raise AdmissionError(f"request {request_id!r} can never run: {verdict.reason}")
        req.seqs.append(self._new_seq(list(req.prompt), req.prompt_len, 0))
        self._next_order += 1
        self.requests[request_id] = req
        self.waiting.append(req)
        return req

    def admission(self, request: Request, preempted_this_step: bool = False,
                  budget_left: int | None = None) -> Admission:
        """May ``request`` start (or resume) now?  One function for the submit check and the step.

        "never": it cannot finish even alone: more samples than ``max_num_seqs``, or
        ``P + max_tokens - 1`` stored tokens per sample
        (:func:`group_blocks_needed`) exceed the pool, or its prefill exceeds the pool less the
        watermark, or ``max_model_len``, or (chunked prefill off) the token budget.
        "later": the rules (:func:`~paged_kv.scheduling.rules.may_admit`: a preemption in this
        step, ``max_num_seqs``), the budget left in this step, or the free blocks say wait.
        """
        c = self.config
        total = request.stored_tokens()
        lifetime = group_blocks_needed(request.prompt_len, total, request.n, c.block_size)
        if c.reservation != "none":
            if request.n > 1:
                return Admission("never", f"reservation={c.reservation!r} models n = 1 requests only "
                                          f"(this one asks n = {request.n})")
            lifetime = blocks_needed(self._reserve_tokens(request), c.block_size)
        if request.n > c.max_num_seqs:
            return Admission("never", f"its n = {request.n} samples run together, but at most "
                                      f"max_num_seqs = {c.max_num_seqs} sequences run at once")
        if c.max_model_len is not None and request.prompt_len + request.max_tokens > c.max_model_len:
            return Admission("never", f"prompt {request.prompt_len} + max_tokens {request.max_tokens} "
                                      f"tokens exceed max_model_len {c.max_model_len}")
        if lifetime > c.num_gpu_blocks:
            return Admission("never", f"it needs {lifetime} blocks of {c.block_size} tokens "
                                      f"({_lifetime_words(request)}) but the pool has {c.num_gpu_blocks}")
        if blocks_needed(total, c.block_size) > c.num_gpu_blocks - c.watermark_blocks:
            return Admission("never", f"its re-prefill after a preemption can reach {total} tokens, "
                                      f"{blocks_needed(total, c.block_size)} blocks, more than the "
                                      f"{c.num_gpu_blocks - c.watermark_blocks} admission may use "
                                      f"(pool {c.num_gpu_blocks} less watermark {c.watermark_blocks})")
        if not c.enable_chunked_prefill and total > c.max_num_batched_tokens:
            return Admission("never", f"with chunked prefill off a prefill runs whole, and its "
                                      f"re-prefill after a preemption can reach {total} tokens > "
                                      f"max_num_batched_tokens {c.max_num_batched_tokens}")
        if self.swapped and request.status != SWAPPED:
            return Admission("later", f"{len(self.swapped)} preempted request(s) are swapped out: they "
                                      f"come back before anyone new starts")
        num_running = self._num_running_seqs()
        if not may_admit(preempted_this_step, num_running + request.n - 1, c.max_num_seqs, 0, 0, 0, None):
            why = "a request was preempted in this step" if preempted_this_step else \
                f"{num_running} sequences run (max_num_seqs {c.max_num_seqs})"
            return Admission("later", why)
        need = self._admission_blocks(request)
        free = self.manager.num_free_blocks
        if free - need < c.watermark_blocks:
            hit = self._cache_hit(request)
            if hit:
                revived = sum(1 for b in hit if self.manager.allocator.ref_count(b) == 0)
                return Admission("later", f"it hits {len(hit)} cached blocks ({revived} of them cached-free) and "
                                          f"needs {need - revived} new blocks; {free - revived} other blocks are "
                                          f"free and {c.watermark_blocks} stay free (watermark)")
            return Admission("later", f"it needs {need} blocks now; {free} are free and "
                                      f"{c.watermark_blocks} stay free (watermark)")
        if budget_left is not None:
            todo = self._prefill_target(request) - self._cached_tokens(request)
            first = min(todo, budget_left) if c.enable_chunked_prefill else todo
            if budget_left < 1 or first > budget_left:
                return Admission("later", f"the step's token budget has {budget_left} tokens left")
        return Admission("now")

    # --- one step -----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Plan the next step (see the module's docstring); the blocks are taken now.

        Raises:
            PagedKVError: requests are queued but nothing can run (cannot happen when every
                request passed :meth:`admission`; raised rather than looping forever).
        """
        out, self._carry = self._carry, SchedulerOutput()    # swaps of a preempt() between steps
        budget = self.config.max_num_batched_tokens
        queue = sorted(self.running, key=lambda r: r.order)
        kept: list[Request] = []
        while queue:
            req = queue.pop(0)
            plan = self._plan(req, budget)
            if not plan:
                kept.append(req)
                continue
            while self._blocks_for(plan) > self.manager.num_free_blocks:
                victim = self.choose_victim(queue) if queue else req
                if victim is not req:
                    queue.remove(victim)
                self._preempt(victim, out)
                if victim is req:
                    break
            else:
                budget -= self._commit(req, plan, out)
                kept.append(req)
        self.running = kept
        preempted = bool(out.preempted)
        while self.swapped and not preempted and budget > 0:
            req = self.swapped[0]
            ids = self._block_holders(req)
            # alone, it only needs its blocks back (its lifetime fits the pool); otherwise keep the
            # watermark and a block for each sequence's next token free as well
            reserve = self.config.watermark_blocks + len(ids) if self.running else 0
            if not self.manager.can_swap_in(ids, reserve) or \
                    self._num_running_seqs() + len(ids) > self.config.max_num_seqs:
                break
            self.swapped.pop(0)
            out.copies.extend(self.manager.take_copies())   # copies go after the swap-in; no overlap
            out.swap_in.extend(self.manager.swap_in(ids))
            req.status = RUNNING
            self.running.append(req)
            out.admitted.append(req.request_id)
            plan = self._plan(req, budget)
            if plan and self._blocks_for(plan) <= self.manager.num_free_blocks:
                budget -= self._commit(req, plan, out)
        while self.waiting:
            req = self.waiting[0]
            if self.admission(req, preempted, budget).verdict != "now":
                break
            self.waiting.popleft()
            self._admit(req, out)
            self.running.append(req)
            out.admitted.append(req.request_id)
            plan = self._plan(req, budget)
            budget -= self._commit(req, plan, out)
        out.copies.extend(self.manager.take_copies())
        out.kv_tokens = sum(c.start + c.length for c in out.chunks)
        if out.empty and (self.waiting or self.swapped) and not self.running:
            head = self.waiting[0] if self.waiting else self.swapped[0]
            raise PagedKVError(f"nothing can run: request {head.request_id!r} cannot start "
                               f"({self.admission(head).reason or 'swap-in does not fit'})")
        return out

    def update(self, out: SchedulerOutput, sampled: dict[int, list[int]]) -> list[Request]:
        """Record that ``out`` ran: chunks' tokens are computed, ``sampled[seq_id]`` holds the token
        sampled for each chunk with ``sample`` (``fork`` tokens for a fresh leader, one per sample).
        Finished sequences give their blocks back.  Returns the requests that finished.

        Raises:
            PagedKVError: a sampled token missing, extra, or for a chunk that does not sample.
        """
        missing = [c.seq_id for c in out.chunks if c.sample and len(sampled.get(c.seq_id, ())) != c.num_samples]
        extra = set(sampled) - {c.seq_id for c in out.chunks if c.sample}
        if missing or extra:
            raise PagedKVError(f"sampled tokens do not match the step: missing/wrong count for sequences "
                               f"{missing}, unexpected for {sorted(extra)}")
        touched: dict = {}
        for c in out.chunks:
            req = self.requests[c.request_id]
            seq = _find(req, c.seq_id)
            seq.num_computed = c.start + c.length
            if self.config.enable_prefix_caching:          # rule 2: register blocks as they fill
                self.manager.cache_full_blocks(seq.seq_id, seq.tokens, seq.num_computed, req.extra_key,
                                               self._hashes.setdefault(seq.seq_id, []))
            touched[req.request_id] = req
            if c.sample:
                toks = sampled[c.seq_id]
                if c.num_samples > 1:
                    for i, tok in enumerate(toks[1:], start=1):
                        child = self._new_seq(list(req.prompt) + [tok], req.prompt_len, i)
                        child.num_computed = seq.num_computed
                        self.manager.fork(seq.seq_id, child.seq_id)
                        req.seqs.append(child)
                    req.forked = True
                seq.tokens.append(toks[0])
            elif not req.forked and len(req.seqs) > 1 and seq is req.leader \
                    and seq.num_computed == req.prompt_len:
                for child in req.seqs:            # resumed group: fork at the prompt's end
                    if child is seq or child.num_generated >= req.max_tokens:
                        continue                  # a finished sample needs no blocks again
                    self.manager.fork(seq.seq_id, child.seq_id)
                    child.num_computed = req.prompt_len
                req.forked = True
        done = []
        for req in touched.values():
            ended = [s for s in req.seqs if s.num_generated >= req.max_tokens and s.seq_id in self.manager]
            for seq in ended:
                self.manager.free(seq.seq_id)
            if ended and req.finished and req.status == RUNNING:
                req.status = FINISHED
                self.running.remove(req)
                self.finished.append(req)
                done.append(req)
                for s in req.seqs:
                    self._hashes.pop(s.seq_id, None)
        return done

    def choose_victim(self, candidates: list[Request]) -> Request:
        """The request to preempt among ``candidates``, the running requests not yet scheduled in this
        step (all arrived after the one that needs the blocks).  The shared rule: the latest arrival
        (:func:`~paged_kv.scheduling.rules.preemption_victim`, vLLM paper §4.5).  Override it to try
        another rule (SGLang retracts the request with the fewest generated tokens first)."""
        return preemption_victim(candidates, key_order)

    def preempt(self, request_id, mode: str | None = None) -> str:
        """Preempt a running request now, between steps (the live panel's button; tests), by
        ``mode`` (default: the configured one); its swap-out, if any, is done at the start of the
        next step.  Returns ``"recompute"`` or ``"swap"``, the mode used (a swap without room in the
        CPU pool falls back to recompute).

        Raises:
            PagedKVError: ``request_id`` is not running.
            ConfigError: an unknown mode.
        """
        if mode is not None and mode not in PREEMPTION_MODES:
            raise ConfigError(f"mode must be one of {PREEMPTION_MODES}, got {mode!r}")
        req = self.requests.get(request_id)
        if req is None or req.status != RUNNING:
            state = "unknown" if req is None else req.status
            raise PagedKVError(f"request {request_id!r} is not running ({state}); only a running one is preempted")
        self.running.remove(req)
        self._preempt(req, self._carry, mode)
        self._carry.preempted.clear()
        return "swap" if req.status == SWAPPED else "recompute"

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def check(self) -> None:
        """Verify the pools (:meth:`BlockSpaceManager.check`) and that block holders match queues:
        running requests hold GPU blocks, swapped ones CPU blocks, waiting and finished none.

        Raises:
            PagedKVError: the first breach, named.
        """
        self.manager.check()
        gpu, cpu = set(self.manager.seq_ids), set(self.manager.swapped_ids)
        want_gpu = {s.seq_id for r in self.running for s in r.seqs if s.num_generated < r.max_tokens
                    and (r.forked or s is r.leader)}
        want_cpu = {s for r in self.swapped for s in self._block_holders(r)}
        if gpu != want_gpu or cpu != want_cpu:
            raise PagedKVError(f"block holders do not match the queues: GPU {sorted(gpu)} vs "
                               f"{sorted(want_gpu)}, CPU {sorted(cpu)} vs {sorted(want_cpu)}")

    # --- helpers ------------------------------------------------------------------------------
    def _new_seq(self, tokens: list[int], prompt_len: int, index: int) -> Sequence:
        seq = Sequence(self._next_seq, tokens, prompt_len, index=index)
        self._next_seq += 1
        return seq

    def _num_running_seqs(self) -> int:
        return sum(r.n for r in self.running)

    def _reserve_tokens(self, req: Request) -> int:
        c = self.config
        return c.max_model_len if c.reservation == "max" else req.stored_tokens()

    def _prefill_target(self, req: Request) -> int:
        """Tokens the leader prefills before the group forks: the prompt for a group of samples
        (fresh or resumed), everything it holds for a lone sequence."""
        leader = req.leader
        if leader is None or len(req.seqs) > 1 or req.n > 1:
            return req.prompt_len
        return len(leader.tokens)

    def _admission_blocks(self, req: Request) -> int:
        if self.config.reservation != "none":
            return blocks_needed(self._reserve_tokens(req), self.config.block_size)
        if self.config.enable_prefix_caching:
            return self.manager.blocks_to_allocate(self._prefill_target(req), self._cache_hit(req))
        return blocks_needed(self._prefill_target(req), self.config.block_size)

    def _cache_hit(self, req: Request) -> list[int]:
        """The blocks the leader's prefill target hits in the prefix cache now (a fresh lookup)."""
        leader = req.leader
        if not self.config.enable_prefix_caching or leader is None:
            return []
        tokens = leader.tokens[:self._prefill_target(req)]
        hashes = self.manager.cache.hashes(tokens, req.extra_key, self._hashes.setdefault(leader.seq_id, []))
        return self.manager.cache_hit(tokens, req.extra_key, hashes)

    def _cached_tokens(self, req: Request) -> int:
        return len(self._cache_hit(req)) * self.config.block_size

    def _admit(self, req: Request, out: SchedulerOutput | None = None) -> None:
        """Give the leader its blocks; with prefix caching its table starts with the hit blocks and
        it is computed up to them (the lookup comes before the tokens to run are planned)."""
        leader = req.leader
        tokens = self._reserve_tokens(req) if self.config.reservation != "none" else self._prefill_target(req)
        hit = self._cache_hit(req)
        self.manager.allocate(leader.seq_id, tokens, cached=hit)
        if self.config.enable_prefix_caching:
            saved = len(hit) * self.config.block_size
            leader.num_computed = saved
            self.prefix_queries += tokens
            self.prefix_hits += saved
            req.cache_hits.append(saved)
            if out is not None:
                out.cache_hits[req.request_id] = saved
                out.hit_blocks.extend(hit)
        req.status = RUNNING

    def _block_holders(self, req: Request) -> list[int]:
        if req.forked:
            return [s.seq_id for s in req.seqs if s.seq_id in self.manager]
        return [req.leader.seq_id]

    def _plan(self, req: Request, budget: int) -> list[tuple[Sequence, int]]:
        """``(sequence, tokens)`` to run for ``req`` within ``budget`` (nothing if none fit)."""
        chunked = self.config.enable_chunked_prefill
        if req.forked:                                   # every unfinished sample (finished ones are freed)
            seqs = [s for s in req.seqs if s.num_generated < req.max_tokens]
        else:
            seqs = [req.leader]
        plan = []
        for seq in seqs:
            end = len(seq.tokens) if req.forked else self._prefill_target(req)
            pending = end - seq.num_computed
            if pending <= 0 or seq.num_generated >= req.max_tokens:
                continue
            take = min(pending, budget) if chunked else (pending if pending <= budget else 0)
            if take:
                plan.append((seq, take))
                budget -= take
        return plan

    def _blocks_for(self, plan) -> int:
        """Free blocks the plan's new slots take (tokens past what each table holds)."""
        m = self.manager
        grow = [(s.seq_id, s.num_computed + k - m.num_tokens(s.seq_id)) for s, k in plan]
        if len(grow) == 1 and grow[0][1] <= 1:           # the common case: one decode token
            return m.blocks_to_append(grow[0][0]) if grow[0][1] == 1 else 0
        return m.blocks_to_append_all([g[0] for g in grow], [max(0, g[1]) for g in grow])

    def _commit(self, req: Request, plan, out: SchedulerOutput) -> int:
        """Take the plan's slots and record its chunks; returns the tokens used."""
        m, used = self.manager, 0
        for seq, k in plan:
            start, end = seq.num_computed, seq.num_computed + k
            grow = end - m.num_tokens(seq.seq_id)
            if grow == 1 and k == 1:                       # a decode token: one slot
                slots = (m.append_slot(seq.seq_id),)
            else:
                if grow > 0:
                    m.append_slots(seq.seq_id, grow)
                slots = tuple(m.slot_mapping(seq.seq_id, start, end))
            sample = end == len(seq.tokens) and (req.forked or len(req.seqs) == 1)
            fork = req.n if sample and not req.forked and req.n > 1 else 1
            out.chunks.append(Chunk(req.request_id, seq.seq_id, seq.index, start, k, slots, sample, fork))
            if k == 1 and sample and start >= seq.prompt_len:
                out.decode_tokens += 1
            else:
                out.prefill_tokens += k
            used += k
        return used

    def _preempt(self, req: Request, out: SchedulerOutput, mode: str | None = None) -> None:
        self.num_preemptions += 1
        req.preemptions += 1
        out.preempted.append(req.request_id)
        ids = self._block_holders(req)
        if (mode or self.config.preemption_mode) == "swap" and self.manager.cpu_allocator is not None:
            out.copies.extend(self.manager.take_copies())
            if self.manager.can_swap_out(ids):
                mapping = self.manager.swap_out(ids)
                out.swap_out.extend(mapping)
                self.num_swaps += 1
                self.num_swapped_blocks += len(mapping)
                out.swapped.append(req.request_id)
                req.status = SWAPPED
                self.swapped.append(req)
                self.swapped.sort(key=key_order)
                return
        for s in ids:
            self.manager.free(s)
        for s in req.seqs:
            s.num_computed = 0
        req.forked = False
        req.status = WAITING
        self.num_recomputes += 1
        out.recomputed.append(req.request_id)
        requeue_preempted(self.waiting, req)


def key_order(req: Request) -> int:
    """FCFS key: the request's arrival rank."""
    return req.order


def _find(req: Request, seq_id: int) -> Sequence:
    for s in req.seqs:
        if s.seq_id == seq_id:
            return s
    raise PagedKVError(f"request {req.request_id!r} has no sequence {seq_id}")


def _lifetime_words(req: Request) -> str:
    per = f"prompt {req.prompt_len} + {req.max_tokens} new - 1 = {req.stored_tokens()} stored tokens"
    return per if req.n == 1 else f"{req.n} samples of {per}, sharing the prompt's full blocks"
