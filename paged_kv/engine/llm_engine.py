"""A small serving engine: the loop every engine runs, over the tiny model or a timing model.

:class:`LLMEngine` follows the shape of vLLM's ``LLMEngine`` (``add_request``, ``step``,
``generate``), read as a map, not copied.  One :meth:`LLMEngine.step` is:

1. **schedule** (:class:`~paged_kv.scheduling.Scheduler`): decode every running sequence, prefill
   chunks within the token budget, admit or resume waiting and swapped requests, preempt the
   latest arrival when blocks run out (continuous batching, vLLM paper §4.5);
2. **run** (a runner, :mod:`paged_kv.engine.runner`): swaps, copy-on-write copies, the forward
   pass through the block tables, sampling;
3. **update**: record the new tokens, free finished sequences' blocks, report outputs.

It measures what engines report: time to first token (TTFT), time per output token (TPOT),
throughput, KV-cache usage, preemptions and swapped blocks (:class:`EngineStats`).  Time is the
wall clock with the tiny model, the modelled clock with :class:`~paged_kv.engine.runner.TimingRunner`.

Automatic prefix caching (chapter 8, vLLM v1) is off by default (``enable_prefix_caching``), so the
engine of chapter 7 is unchanged; on, a request whose leading full blocks are cached prefills only
the rest, and :class:`EngineStats` counts the prompt tokens looked up and found.  What changes K/V
besides the tokens is the request's *extra key*: its adapter (:meth:`LLMEngine.load_adapter`, a
new id at each load) and its ``cache_salt``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields
from typing import Hashable, Sequence

from ..blocks import Event, rename_sequences, snapshot
from ..defaults import BLOCK_SIZE, MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, WATERMARK
from ..errors import AdmissionError, ConfigError, PagedKVError, PromptError
from ..memory import kv_bytes_per_token
from ..model.sampling import SamplingParams
from ..scheduling import Scheduler, SchedulerConfig
from ..scheduling.request import Request
from ..storage.paged_cache import KV_DTYPE_NAMES
from ..validate import count, real
from .runner import ModelRunner, TimingRunner

__all__ = ["EngineConfig", "EngineStats", "LLMEngine", "RequestOutput", "StepRecord"]


@dataclass(frozen=True)
class EngineConfig:
    """The engine's knobs (vLLM's names; see :class:`~paged_kv.scheduling.SchedulerConfig`).

    Give the GPU pool as ``num_gpu_blocks`` *or* as ``gpu_memory_bytes`` (bytes for the KV cache,
    all layers, K and V: ``num_gpu_blocks = gpu_memory_bytes // bytes_per_block``, the way vLLM
    turns ``gpu_memory_utilization`` into blocks); likewise ``num_cpu_blocks`` or
    ``swap_space_bytes`` for the CPU pool.

    Raises:
        ConfigError: neither or both of a pool's two forms, or a bad knob.
    """

    block_size: int = BLOCK_SIZE
    num_gpu_blocks: int | None = None
    gpu_memory_bytes: int | None = None
    num_cpu_blocks: int | None = None
    swap_space_bytes: int | None = None
    max_num_seqs: int = MAX_NUM_SEQS
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    enable_chunked_prefill: bool = True
    watermark: float = WATERMARK
    preemption_mode: str = "recompute"
    max_model_len: int | None = None
    reservation: str = "none"
    backend: str = "torch"
    enable_prefix_caching: bool = False
    prefix_caching_hash_algo: object = "sha256"

    def __post_init__(self) -> None:
        if (self.num_gpu_blocks is None) == (self.gpu_memory_bytes is None):
            raise ConfigError("give the GPU pool as num_gpu_blocks or as gpu_memory_bytes (one of them)")
        if self.num_cpu_blocks is not None and self.swap_space_bytes is not None:
            raise ConfigError("give the CPU pool as num_cpu_blocks or as swap_space_bytes, not both")
        if self.backend not in ("torch", "triton"):
            raise ConfigError(f"backend must be 'torch' or 'triton', got {self.backend!r}")

    def scheduler_config(self, bytes_per_block: int | None = None) -> SchedulerConfig:
        """The :class:`SchedulerConfig`; ``bytes_per_block`` (bytes, all layers, K and V) turns
        the byte budgets into blocks.

        Raises:
            ConfigError: a budget in bytes without ``bytes_per_block``, or one smaller than a block.
        """
        def blocks(n, nbytes, label, minimum):
            if n is not None or nbytes is None:
                return n or 0
            if bytes_per_block is None:
                raise ConfigError(f"{label} is in bytes: the engine needs the model to price a block")
            nbytes = count(label + " (bytes)", nbytes, 0)
            if nbytes // bytes_per_block < minimum:
                raise ConfigError(f"{label} = {nbytes:,} bytes holds no block of {bytes_per_block:,} bytes")
            return nbytes // bytes_per_block
        return SchedulerConfig(
            num_gpu_blocks=blocks(self.num_gpu_blocks, self.gpu_memory_bytes, "gpu_memory_bytes", 1),
            block_size=self.block_size,
            num_cpu_blocks=blocks(self.num_cpu_blocks, self.swap_space_bytes, "swap_space_bytes", 0),
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            enable_chunked_prefill=self.enable_chunked_prefill, watermark=self.watermark,
            preemption_mode=self.preemption_mode, max_model_len=self.max_model_len,
            reservation=self.reservation, enable_prefix_caching=self.enable_prefix_caching,
            prefix_caching_hash_algo=self.prefix_caching_hash_algo)


@dataclass
class RequestOutput:
    """A request's state (vLLM's ``RequestOutput``, trimmed); it follows the request live.

    Attributes:
        request_id: its id; ``prompt``: its prompt as given (text or token ids).
        finished: whether every sample has its ``max_tokens``.
        arrival, first_token, finish: clock times (s) it arrived, produced its first token, finished
            (``nan`` until then).
        preemptions: times it was preempted.
        last_token: clock time (s) of its latest token; max_itl: the longest wait between two of
            its consecutive tokens (s; inter-token latency, ITL, as vLLM's metrics call it), where a
            preemption shows as one long stall.
        token_ids: (property) per sample, the tokens generated so far; ``text``: the same decoded
            (``None`` without a tokenizer).
    """

    request_id: Hashable
    prompt: object
    request: Request = field(repr=False)
    tokenizer: object = field(default=None, repr=False)
    finished: bool = False
    arrival: float = 0.0
    first_token: float = math.nan
    finish: float = math.nan
    preemptions: int = 0
    last_token: float = math.nan
    max_itl: float = 0.0

    @property
    def token_ids(self) -> list[list[int]]:
        outs = self.request.outputs
        return outs + [[] for _ in range(self.request.n - len(outs))]   # samples not forked yet

    @property
    def text(self) -> list[str] | None:
        return None if self.tokenizer is None else [self.tokenizer.decode(t) for t in self.token_ids]

    @property
    def cached_tokens(self) -> list[int]:
        """Per admission of the request (the first, then after each recompute preemption), the
        prompt tokens its prefix-cache hit saved (empty with caching off)."""
        return list(self.request.cache_hits)

    @property
    def ttft(self) -> float:
        """Time to first token (s): first token minus arrival."""
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float:
        """Time per output token (s) after the first: ``(finish - first_token) / (tokens - 1)``
        (``nan`` for a one-token output)."""
        n = len(self.token_ids[0]) if self.token_ids else 0
        return (self.finish - self.first_token) / (n - 1) if n > 1 else math.nan

    @property
    def latency(self) -> float:
        """End-to-end latency (s): finish minus arrival."""
        return self.finish - self.arrival


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
        prefix_queries, prefix_hits: prompt tokens looked up in the prefix cache at admissions, and
            found there (each admission once, re-admissions after a preemption included); the
            found ones are prefill tokens saved.
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
    def prefix_hit_rate(self) -> float:
        """Prompt tokens found in the prefix cache / looked up (``nan`` before any lookup)."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else math.nan

    @property
    def throughput(self) -> float:
        """Output tokens per second of clock."""
        return self.generated / self.clock_s if self.clock_s else math.nan

    @property
    def peak_kv_usage(self) -> float:
        return max(self.kv_usage, default=0.0)


@dataclass(frozen=True)
class StepRecord:
    """One step as plain data, for figures that replay a run (:mod:`paged_kv.viz.serving`).

    Attributes:
        step: its number (0 = before the first step); ``clock_s``: the clock after it (s).
        pool: the GPU pool after it, a :class:`~paged_kv.blocks.Snapshot` whose sequences are
            named ``"<request>"`` (the leader) and ``"<request>.<i>"`` (sample ``i``).
        cpu: per CPU block, the sequence holding it (``None``: free).
        waiting, running, swapped: per queue, ``(request, generated tokens, max_tokens, computed
            prompt tokens, prompt tokens)`` in queue order.
        text: what happened, in words.
        cached: per GPU block, whether it holds a prefix-cache entry (a cached block in use, or a
            cached-free one when the pool shows it free); empty with caching off.
        hits: blocks handed out as prefix-cache hits in this step; evicted: blocks whose entry
            was evicted in this step, in LRU order.
    """

    step: int
    clock_s: float
    pool: object
    cpu: tuple
    waiting: tuple
    running: tuple
    swapped: tuple
    text: str
    cached: tuple = ()
    hits: tuple = ()
    evicted: tuple = ()


class LLMEngine:
    """Serves requests with continuous batching over a paged KV cache.

    Args:
        model: a :class:`~paged_kv.model.TinyLlama` (real K/V), or ``None`` with ``iteration_time``
            (a timing model of a large model: no tokens, only lengths and time).
        config: the :class:`EngineConfig` (default: 64 blocks of 16 tokens).
        tokenizer: encodes string prompts and decodes outputs (the tiny model's byte tokenizer).
        record: keep a :class:`StepRecord` per step in :attr:`records` (for figures; small runs).
        iteration_time: with ``model=None``, seconds per step as
            ``iteration_time(kv_tokens, prefill_tokens)`` (:class:`paged_kv.sim.IterationTime`).
        swap_time: with ``model=None``, seconds to swap ``num_blocks`` blocks one way as
            ``swap_time(num_blocks, block_size)`` (:class:`paged_kv.engine.serving.SwapTime`).

    Raises:
        ConfigError: neither a model nor a timing model, a bad config, or a ``max_model_len`` beyond
            the model's ``max_seq_len``.
    """

    def __init__(self, model=None, config: EngineConfig | None = None, tokenizer=None,
                 iteration_time=None, swap_time=None, record: bool = False) -> None:
        self.config = config or EngineConfig(num_gpu_blocks=64)
        if not isinstance(self.config, EngineConfig):
            raise ConfigError(f"config must be an EngineConfig, got {self.config!r}")
        self.model, self.tokenizer = model, tokenizer
        if model is not None and not (hasattr(model, "cfg") and hasattr(model, "dtype") and callable(model)):
            swapped = hasattr(model, "decode") and not isinstance(model, str)
            got = f"{type(model).__name__} (model and tokenizer swapped?)" if swapped else f"{model!r:.60}"
            raise ConfigError(f"model must be a TinyLlama (e.g. from load_tiny_model()), got {got}")
        is_tokenizer = callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode", None))
        if tokenizer is not None and (isinstance(tokenizer, str) or not is_tokenizer):
            raise ConfigError(f"tokenizer must have encode() and decode() (e.g. from load_tiny_model()), got {tokenizer!r:.60}")
        if model is not None:
            block_size = count("block_size (tokens)", self.config.block_size, 1)
            per_block = block_size * kv_bytes_per_token(model.cfg, KV_DTYPE_NAMES[model.dtype])
            sc = self.config.scheduler_config(per_block)
            limit = model.cfg.max_seq_len
            if sc.max_model_len is not None and sc.max_model_len > limit:
                raise ConfigError(f"max_model_len = {sc.max_model_len:,} tokens is more than the model's "
                                  f"max_seq_len {limit:,} (model.cfg.max_seq_len): it has no positions beyond")
            self.runner = ModelRunner(model, sc.num_gpu_blocks, sc.block_size, sc.num_cpu_blocks,
                                      self.config.backend)
        elif iteration_time is not None:
            sc = self.config.scheduler_config()
            self.runner = TimingRunner(iteration_time, swap_time)
        else:
            raise ConfigError("LLMEngine needs a model, or model=None with an iteration_time (timing model)")
        self.scheduler = Scheduler(sc)
        self.stats = EngineStats()
        self.clock = 0.0
        self._params: dict[Hashable, SamplingParams] = {}
        self._outputs: dict[Hashable, RequestOutput] = {}
        self._next_id = 0
        self._adapters: dict[str, tuple[int, int]] = {}     # name -> (id, shift)
        self._next_adapter = 1
        self._evicted_seen = 0
        self.record = bool(record)
        self.records: list[StepRecord] = []
        if self.record:
            self.records.append(self._step_record("start: every block is free"))

    # --- requests -----------------------------------------------------------------------------
    def load_adapter(self, name: str, shift: int) -> int:
        """Load (or reload) an adapter under ``name``; returns its id, a new one at every load, so K/V
        cached under an earlier load of the same name is never hit by the new one.  (vLLM v1 first put
        each LoRA adapter's int id into the block hash, later its name, so that instances agree on
        hashes; a same-name reload then reused stale K/V: vLLM issues #30931 and #42125.)

        The adapter stands in for a LoRA adapter: it changes what the model computes for the same
        token ids, here by feeding token ``(t + shift) mod V`` for token ``t`` (``V`` the vocabulary),
        which changes every K/V.

        Raises:
            ConfigError: ``name`` not a non-empty str, ``shift`` not an int.
        """
        if not isinstance(name, str) or not name:
            raise ConfigError(f"an adapter's name is a non-empty str, got {name!r}")
        if type(shift) is not int:
            raise ConfigError(f"an adapter's shift is an int (token ids), got {shift!r}")
        self._adapters[name] = (self._next_adapter, shift)
        self._next_adapter += 1
        return self._adapters[name][0]

    def add_request(self, prompt, params: SamplingParams | None = None, request_id: Hashable | None = None,
                    arrival: float | None = None, adapter: str | None = None,
                    cache_salt: str | None = None) -> Hashable:
        """Queue a request; returns its id.  ``prompt``: text (needs the tokenizer) or token ids.
        ``arrival``: its arrival time on the engine's clock (default: now; never later than now, since
        it is queued now).  ``adapter``: the name of a loaded adapter (:meth:`load_adapter`);
        ``cache_salt``: a string that keeps its cached blocks apart from other requests' (vLLM's
        ``cache_salt``, e.g. one per tenant).  Both form the request's extra cache key.

        Raises:
            ConfigError: ``params`` not a SamplingParams; ``arrival`` not a finite number <= the
                clock; ``request_id`` not hashable; an adapter not loaded; a salt not a non-empty str.
            AdmissionError: it could never run on this engine's pool (the reason is in the message:
                e.g. prompt + max_tokens - 1 stored tokens need more blocks than the pool has); or
                its id is in use.  Nothing is queued and nothing is preempted.
            PromptError: an empty prompt, text without a tokenizer, a token id outside the vocabulary,
                or a prompt + max_tokens longer than the model's ``max_seq_len``.
        """
        params = _check_params(params)
        ids = self._encode(prompt)
        self._check_length(ids, params)
        if request_id is None:
            while self._next_id in self._outputs:
                self._next_id += 1
            request_id = self._next_id
        arrival = self.clock if arrival is None else real(
            f"arrival (s on the engine's clock, now {self.clock:g})", arrival, high=self.clock)
        if adapter is not None and adapter not in self._adapters:
            raise ConfigError(f"adapter {adapter!r} is not loaded (loaded: {sorted(self._adapters)})")
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise ConfigError(f"cache_salt must be a non-empty str (as vLLM requires), got {cache_salt!r}")
        uid, shift = self._adapters[adapter] if adapter is not None else (None, 0)
        extra_key = None if uid is None and cache_salt is None else (uid, cache_salt)
        req = self.scheduler.add(request_id, ids, params.n, params.max_tokens, arrival, extra_key)
        if shift and isinstance(self.runner, ModelRunner):
            self.runner.shifts[request_id] = shift
        self._params[request_id] = params
        self._outputs[request_id] = RequestOutput(request_id, prompt, req,
                                                  self.tokenizer if self.model is not None else None,
                                                  arrival=arrival)
        return request_id

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished

    # --- the loop -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step; returns the outputs of the requests that produced tokens in it or finished,
        in arrival order.  An idle engine returns ``[]``."""
        sch = self.scheduler
        if not sch.has_unfinished:
            return []
        out = sch.schedule()                                        # 1. schedule: tokens, blocks
        seconds, sampled = self.runner.execute(sch, out, self._params.__getitem__)   # 2-4. prepare, run, sample
        self._account(out, seconds, sampled)                        # the clock; queues and pool as scheduled
        done = sch.update(out, sampled)                             # 5. record the tokens, free the finished
        return self._report(out, done)

    def _account(self, out, seconds: float, sampled: dict) -> None:
        sch, st = self.scheduler, self.stats
        self.clock += seconds
        st.steps += 1
        st.clock_s = self.clock
        st.prompt_tokens += out.prefill_tokens
        st.generated += sum(len(t) for t in sampled.values())
        st.kv_usage.append(1 - sch.manager.num_free_blocks / sch.config.num_gpu_blocks)
        st.running.append(len(sch.running))
        st.waiting.append(len(sch.waiting))
        st.swapped.append(len(sch.swapped))
        st.admitted.append(len(out.admitted))
        st.preempted_now.append(len(out.preempted))
        st.step_s.append(seconds)
        st.prefix_queries, st.prefix_hits = sch.prefix_queries, sch.prefix_hits

    def _report(self, out, done) -> list[RequestOutput]:
        sch, st = self.scheduler, self.stats
        st.finished.append(len(done))
        st.preemptions, st.recomputes, st.swaps = sch.num_preemptions, sch.num_recomputes, sch.num_swaps
        st.swapped_blocks = sch.num_swapped_blocks
        if self.record:
            self.records.append(self._step_record(_describe(out, done), out))
        result = []
        for rid in sorted({c.request_id for c in out.chunks if c.sample}, key=lambda r: sch.requests[r].order):
            req, o = sch.requests[rid], self._outputs[rid]
            if math.isnan(o.first_token):
                o.first_token = self.clock
            else:
                o.max_itl = max(o.max_itl, self.clock - o.last_token)
            o.last_token = self.clock
            o.preemptions = req.preemptions
            if req.finished:
                o.finished, o.finish = True, self.clock
                self.runner.forget(rid)
            result.append(o)
        return result

    def generate(self, prompts: Sequence | object, params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run ``prompts`` (one or a list; text or token ids) to completion; returns their outputs
        in the order given.  ``params``: one for all or one per prompt.  ``use_tqdm``: a progress
        bar over finished requests (notebook-aware).

        Raises:
            AdmissionError: a prompt that could never run (checked for all before any runs).
            PromptError: ``prompts`` neither text, token ids, nor a list of those.
            ConfigError: ``params`` neither a SamplingParams nor a list of them, one per prompt.
        """
        if hasattr(prompts, "ndim") and getattr(prompts, "ndim") == 1:     # a tensor or array of token ids
            prompts = [int(t) for t in prompts]
        if not isinstance(prompts, (str, list, tuple)):
            raise PromptError(f"prompts must be text, token ids, or a list of those; got {prompts!r:.80}")
        single = isinstance(prompts, str) or (bool(prompts) and isinstance(prompts[0], numbers.Integral))
        prompts = [prompts] if single else list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if not isinstance(params, (list, tuple)):
            raise ConfigError(f"params must be a SamplingParams or a list of them, got {params!r:.80}")
        params = [_check_params(sp) for sp in params]
        if len(params) != len(prompts):
            raise ConfigError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
        for p, sp in zip(prompts, params):                 # refuse before anything is queued
            self.check_admissible(p, sp)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(ids), desc="requests", unit="req")
        while self.has_unfinished_requests():
            for o in self.step():
                if o.finished and bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return [self._outputs[i] for i in ids]

    def check_admissible(self, prompt, params: SamplingParams | None = None) -> None:
        """Raise :class:`AdmissionError` (with the reason) if ``prompt`` could never run here, or
        :class:`PromptError` if it is not a valid prompt for the model (too long for its
        ``max_seq_len`` included): the same checks :meth:`add_request` makes, without queueing."""
        params = _check_params(params)
        ids = self._encode(prompt)
        self._check_length(ids, params)
        verdict = self.scheduler.admission(Request("?", ids, params.n, params.max_tokens))
        if verdict.verdict == "never":
            raise AdmissionError(f"prompt of {len(ids)} tokens can never run: {verdict.reason}")

    def output(self, request_id) -> RequestOutput:
        """The output of ``request_id`` (live: it follows the request).

        Raises:
            PagedKVError: an unknown request id.
        """
        if request_id not in self._outputs:
            raise PagedKVError(f"no request {request_id!r} (known: {list(self._outputs)!r:.80})")
        return self._outputs[request_id]

    def outputs(self) -> list[RequestOutput]:
        """Every request's output, in submission order."""
        return list(self._outputs.values())

    # --- helpers ------------------------------------------------------------------------------
    def _check_length(self, ids: list[int], params: SamplingParams) -> None:
        if self.model is not None and len(ids) + params.max_tokens > self.model.cfg.max_seq_len:
            raise PromptError(f"prompt {len(ids)} + max_tokens {params.max_tokens} tokens exceed the "
                              f"model's max_seq_len {self.model.cfg.max_seq_len}")

    def seq_name(self, seq_id: int) -> str:
        """A sequence's name in figures: ``"<request>"`` for a leader, ``"<request>.<i>"`` for sample i."""
        for req in self.scheduler.requests.values():
            for s in req.seqs:
                if s.seq_id == seq_id:
                    return str(req.request_id) if s.index == 0 else f"{req.request_id}.{s.index}"
        return str(seq_id)

    def _step_record(self, text: str, out=None) -> StepRecord:
        sch = self.scheduler
        cache = sch.manager.cache
        cached, hits, evicted = (), (), ()
        if cache is not None:
            cached = tuple(b in cache for b in range(sch.config.num_gpu_blocks))
            evicted = tuple(cache.evictions[self._evicted_seen:])
            self._evicted_seen = len(cache.evictions)
            hits = tuple(out.hit_blocks) if out is not None else ()
        names = {s.seq_id: (str(r.request_id) if s.index == 0 else f"{r.request_id}.{s.index}")
                 for r in sch.requests.values() for s in r.seqs}
        pool = rename_sequences(snapshot(sch.manager, self.stats.steps, Event("step", text=text)), names)
        cpu = [None] * sch.config.num_cpu_blocks
        for sid in sch.manager.swapped_ids:
            for b in sch.manager.swapped_table(sid).block_ids:
                cpu[b] = names.get(sid, str(sid))

        def rows(queue):
            return tuple((str(r.request_id), max(s.num_generated for s in r.seqs), r.max_tokens,
                          min(r.leader.num_computed, r.prompt_len), r.prompt_len) for r in queue)
        return StepRecord(self.stats.steps, self.clock, pool, tuple(cpu), rows(sch.waiting), rows(sch.running),
                          rows(sch.swapped), text, cached, hits, evicted)

    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise PromptError("a text prompt needs the engine's tokenizer (or pass token ids)")
            ids = self.tokenizer.encode(prompt)
        else:
            try:
                ids = [count("token id", t, 0, error=PromptError) for t in prompt]
            except TypeError:
                raise PromptError(f"a prompt is text or a list of token ids, got {prompt!r:.60}") from None
        if not ids:
            raise PromptError("empty prompt: a request needs at least one token")
        if self.model is not None and max(ids) >= self.model.cfg.vocab_size:
            raise PromptError(f"token id {max(ids)} is outside the vocabulary (size {self.model.cfg.vocab_size})")
        return ids

    def __repr__(self) -> str:
        c = self.scheduler.config
        return (f"LLMEngine({'tiny model' if self.model is not None else 'timing model'}, "
                f"{c.num_gpu_blocks} GPU blocks x {c.block_size} tokens, {c.num_cpu_blocks} CPU blocks, "
                f"preemption={c.preemption_mode}, chunked prefill={'on' if c.enable_chunked_prefill else 'off'})")



def _describe(out, done) -> str:
    """One step in words: who was admitted, preempted (how), finished; prefill chunks and decodes."""
    parts = []
    if out.admitted:
        parts.append("admitted " + ", ".join(map(str, out.admitted)))
    hits = {r: k for r, k in out.cache_hits.items() if k}
    if hits:
        parts.append("prefix-cache hit " + ", ".join(f"{r}: {k} tokens" for r, k in hits.items()))
    if out.recomputed:
        parts.append("preempted " + ", ".join(map(str, out.recomputed)) + " (recompute)")
    if out.swapped:
        parts.append("swapped out " + ", ".join(map(str, out.swapped)))
    if out.swap_in:
        parts.append(f"{len(out.swap_in)} blocks swapped in")
    chunks = [f"{c.request_id}[{c.start}:{c.start + c.length}]" for c in out.chunks if c.length > 1 or not c.sample]
    if chunks:
        parts.append("prefill " + ", ".join(chunks))
    if out.decode_tokens:
        parts.append(f"{out.decode_tokens} decode token{'s' if out.decode_tokens > 1 else ''}")
    if out.copies:
        parts.append(f"{len(out.copies)} copy-on-write copies")
    if done:
        parts.append("finished " + ", ".join(str(r.request_id) for r in done))
    return "; ".join(parts) or "nothing to do"


def _check_params(params) -> SamplingParams:
    """``params`` (``None``: the defaults) as a SamplingParams, or ConfigError naming it."""
    params = SamplingParams() if params is None else params
    if not isinstance(params, SamplingParams):
        raise ConfigError(f"params must be a SamplingParams, got {params!r:.80}")
    return params
