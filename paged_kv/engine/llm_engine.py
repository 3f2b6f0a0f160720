"""A small serving engine: the loop every engine runs, over the tiny model or a timing model.

:class:`LLMEngine` follows the shape of vLLM's ``LLMEngine`` (``add_request``, ``step``,
``generate``), read as a map, not copied.  One :meth:`LLMEngine.step` is three calls, each handed
the value the one before returned (the runner never reads the scheduler):
:meth:`~paged_kv.scheduling.Scheduler.schedule` (continuous batching and preemption, vLLM paper
§4.5) returns a :class:`~paged_kv.scheduling.SchedulerOutput`; a runner's ``execute``
(:mod:`paged_kv.engine.runner`) turns it into a :class:`~paged_kv.engine.runner.ModelRunnerOutput`;
:meth:`~paged_kv.scheduling.Scheduler.update` records its tokens and frees finished sequences'
blocks.

It measures what engines report: :class:`~paged_kv.engine.metrics.EngineStats` over the run, TTFT
and TPOT per request (:class:`~paged_kv.engine.outputs.RequestOutput`); time is the wall clock
with the tiny model, the modelled clock with a timing model.  What changes K/V besides the
tokens is a request's *extra key*, part of every block hash: its adapter
(:meth:`LLMEngine.load_adapter`) and its ``cache_salt``.
"""

from __future__ import annotations

import math
import numbers
from typing import Hashable, Sequence

import lazy_loader as lazy

from ..errors import AdmissionError, ConfigError, PagedKVError, PromptError
from ..memory import kv_bytes_per_token
from ..sampling_params import SamplingParams
from ..scheduling import Request, Scheduler, SchedulerOutput, Verdict
from ..spec_decode import NgramProposer
from ..validate import count, real
from .config import EngineConfig
from .metrics import EngineStats
from .outputs import RequestOutput
from .runner_output import ModelRunnerOutput
from .step_record import StepRecord, describe, seq_name, step_record
from .timing_runner import TimingRunner

__all__ = ["LLMEngine"]

# The tiny model's side (torch) loads on first use, when a model is given: the timing-model engine
# runs where torch is absent (the browser build).  tests/test_architecture.py reads these as imports.
model_runner = lazy.load("paged_kv.engine.runner", suppress_warning=True)
storage = lazy.load("paged_kv.storage", suppress_warning=True)
draft_proposer = lazy.load("paged_kv.engine.draft_proposer", suppress_warning=True)
draft = lazy.load("paged_kv.model.draft", suppress_warning=True)


class LLMEngine:
    """Serves requests with continuous batching over a paged KV cache.

    Args:
        model: a :class:`~paged_kv.model.TinyLlama` (real K/V), or ``None`` with ``iteration_time``
            (a timing model of a large model: no tokens, only lengths and time) or with ``runner``.
        config: the :class:`EngineConfig` (default: 64 blocks of 16 tokens).
        tokenizer: encodes string prompts and decodes outputs (the tiny model's byte tokenizer).
        record: keep a :class:`StepRecord` per step in :attr:`records` (for figures; small runs).
        iteration_time: with ``model=None``, seconds per step as
            ``iteration_time(kv_tokens, prefill_tokens)`` (:class:`paged_kv.sim.IterationTime`).
        swap_time: with ``model=None``, seconds to swap ``num_blocks`` blocks one way as
            ``swap_time(num_blocks, block_size)`` (:class:`paged_kv.engine.serving.SwapTime`).
        runner: with ``model=None``, a ready runner (anything with ``execute(SchedulerOutput) ->
            ModelRunnerOutput``), e.g. a :class:`~paged_kv.engine.timing_runner.TimingRunner` with
            a token source: its tokens are then real, and outputs are decoded with ``tokenizer``.

    Speculative decoding (``config.speculative_config``, chapter 9): the scheduler drafts for each
    decoding sequence with the proposer built here, the runner verifies the drafts in one pass and
    returns what it accepted.  ``"ngram"`` builds a :class:`~paged_kv.spec_decode.NgramProposer`
    (pure Python, any runner); ``"draft_model"`` a
    :class:`~paged_kv.engine.draft_proposer.DraftModelProposer` (torch) over the target's first
    ``draft_num_layers`` layers, with a pool of its own of twice the target's blocks (its blocks
    are never shared: ``n`` samples hold the prompt ``n`` times).  A draft model needs ``model``.

    Raises:
        ConfigError: neither a model, a timing model nor a runner, or more than one of them; a
            runner without ``execute`` or whose ``block_size`` is not the config's; a bad config;
            a ``max_model_len`` beyond the model's ``max_seq_len``; a draft model without a model
            or with more layers than it.
    """

    def __init__(self, model=None, config: EngineConfig | None = None, tokenizer=None,
                 iteration_time=None, swap_time=None, record: bool = False, runner=None) -> None:
        self.config = config or EngineConfig(num_gpu_blocks=64)
        if not isinstance(self.config, EngineConfig):
            raise ConfigError(f"config must be an EngineConfig, got {self.config!r}")
        if runner is not None and (model is not None or iteration_time is not None or swap_time is not None):
            given = [n for n, v in (("model", model), ("iteration_time", iteration_time), ("swap_time", swap_time))
                     if v is not None]
            raise ConfigError(f"give LLMEngine a ready runner or what builds one, not both: runner and {given}")
        self.model, self.tokenizer = model, tokenizer
        self._real_tokens = model is not None or runner is not None   # a timing model's tokens are 0s
        if model is not None and not (hasattr(model, "cfg") and hasattr(model, "dtype") and callable(model)):
            swapped = hasattr(model, "decode") and not isinstance(model, str)
            got = f"{type(model).__name__} (model and tokenizer swapped?)" if swapped else f"{model!r:.60}"
            raise ConfigError(f"model must be a TinyLlama (e.g. from load_tiny_model()), got {got}")
        is_tokenizer = callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode", None))
        if tokenizer is not None and (isinstance(tokenizer, str) or not is_tokenizer):
            raise ConfigError(f"tokenizer must have encode() and decode() (e.g. from load_tiny_model()), got {tokenizer!r:.60}")
        if model is not None:
            block_size = count("block_size (tokens)", self.config.block_size, 1)
            per_block = block_size * kv_bytes_per_token(model.cfg, storage.KV_DTYPE_NAMES[model.dtype])
            sc = self.config.scheduler_config(per_block)
            limit = model.cfg.max_seq_len
            if sc.max_model_len is not None and sc.max_model_len > limit:
                raise ConfigError(f"max_model_len = {sc.max_model_len:,} tokens is more than the model's "
                                  f"max_seq_len {limit:,} (model.cfg.max_seq_len): it has no positions beyond")
            self.runner = model_runner.ModelRunner(model, sc.num_gpu_blocks, sc.block_size, sc.num_cpu_blocks,
                                                   self.config.backend, self.config.reduction)
        elif iteration_time is not None:
            sc = self.config.scheduler_config()
            self.runner = TimingRunner(iteration_time, swap_time, sc.block_size)
        elif runner is not None:
            sc = self.config.scheduler_config()
            if not callable(getattr(runner, "execute", None)):
                raise ConfigError(f"runner must have execute(SchedulerOutput) (e.g. a TimingRunner), got {runner!r:.60}")
            if getattr(runner, "block_size", sc.block_size) != sc.block_size:
                raise ConfigError(f"the runner's block_size {runner.block_size} is not the config's {sc.block_size}")
            self.runner = runner
        else:
            raise ConfigError("LLMEngine needs a model, or model=None with an iteration_time (timing model) "
                              "or a runner")
        self.scheduler = Scheduler(sc, self._proposer(model, sc))
        self.stats = EngineStats()
        self.clock = 0.0
        self._outputs: dict[Hashable, RequestOutput] = {}
        self._next_id = 0
        self._adapters: dict[str, tuple[int, int]] = {}     # name -> (id, shift)
        self._next_adapter = 1
        self._evicted_seen = 0
        self._preemptions_seen = 0
        self.record = bool(record)
        self.records: list[StepRecord] = []
        if self.record:
            self.records.append(step_record(self.scheduler, 0, self.clock, "start: every block is free"))

    def _proposer(self, model, sc):
        """The drafter ``config.speculative_config`` asks for; ``None`` without speculation."""
        spec = self.config.speculative_config
        if spec is None:
            return None
        if spec.method == "ngram":
            return NgramProposer.from_config(spec)
        if model is None:
            raise ConfigError("speculative method 'draft_model' drafts with the target's first layers: "
                              "give LLMEngine the model (or use method 'ngram')")
        return draft_proposer.DraftModelProposer(draft.truncated_draft(model, spec.draft_num_layers),
                                                 spec.num_speculative_tokens, block_size=sc.block_size,
                                                 num_blocks=2 * sc.num_gpu_blocks, backend=self.config.backend)

    # --- requests -----------------------------------------------------------------------------
    def load_adapter(self, name: str, shift: int) -> int:
        """Load (or reload) an adapter under ``name``; returns its id, a new one at every load, so K/V
        cached under an earlier load of the same name is never hit by the new one (a reload under
        the same name reusing stale K/V is vLLM issue #30931).

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
            ConfigError: a bad argument (the message names it), an ``arrival`` later than the
                clock, or an adapter not loaded.
            AdmissionError: it could never run on this engine's pool (the message says why, e.g.
                its ``P + max_tokens - 1`` stored tokens need more blocks than the pool has), or its
                id is in use.  Nothing is queued and nothing is preempted.
            PromptError: a bad prompt (the message says why), or prompt + ``max_tokens`` longer
                than the model's ``max_seq_len``.
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
        if params.stop and self.tokenizer is None:
            raise ConfigError(f"stop strings {params.stop!r} need text: give the engine a tokenizer "
                              f"(or stop on token ids, stop_token_ids)")
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise ConfigError(f"cache_salt must be a non-empty str (as vLLM requires), got {cache_salt!r}")
        uid, shift = self._adapters[adapter] if adapter is not None else (None, 0)
        extra_key = None if uid is None and cache_salt is None else (uid, cache_salt)
        req = self.scheduler.add(request_id, ids, arrival=arrival, extra_key=extra_key, sampling_params=params,
                                 adapter_shift=shift)
        self._outputs[request_id] = RequestOutput(request_id, prompt, req,
                                                  self.tokenizer if self._real_tokens else None,
                                                  arrival=arrival, arrival_step=self.stats.steps)
        return request_id

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished

    # --- the loop -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step; returns the outputs of the requests that produced tokens in it or finished,
        in arrival order.  An idle engine returns ``[]``."""
        if not self.scheduler.has_unfinished:
            return []
        self._note_hand_preemptions()
        out = self.scheduler.schedule()                         # 1. schedule: the step as data
        for rid in out.admitted:                                # its queue time ends at its first admission
            o = self._output(rid)
            if math.isnan(o.first_scheduled):
                o.first_scheduled = self.clock
        try:
            result = self.runner.execute(out)                   # 2-4. swaps and copies, forward, sample
        except Exception as e:   # outside any one request's part (a swap, a copy): all the step touched
            touched = {c.request_id for c in out.chunks} | set(out.swapped) | set(out.admitted)
            result = ModelRunnerOutput({}, 0.0, failed=dict.fromkeys(touched, f"{type(e).__name__}: {e}"))
        self._account(out, result)                              # the clock; queues and pool as scheduled
        before = {c.seq_id: len(c.token_ids) + c.start - len(c.spec_token_ids) for c in out.chunks if c.sample}
        done = self.scheduler.update(out, result.sampled_token_ids, result.failed)   # 5. record, free the finished
        done += self._check_stop_strings(out, before)
        produced = {c.request_id for c in out.chunks if c.seq_id in result.sampled_token_ids}
        return self._report(out, done, produced)

    def abort_request(self, request_id) -> RequestOutput:
        """End a request now, in any state (waiting, prefilling, running, preempted, swapped out, a
        group of samples sharing blocks), as vLLM's ``abort_request`` does: its blocks are freed
        once each (full cached blocks stay cached), and its output is finished with reason
        ``"abort"``.  Aborting a finished request changes nothing.  Returns its output.

        Raises:
            PagedKVError: an unknown request id.
        """
        o = self.output(request_id)
        if not o.finished:
            self.scheduler.finish_request(request_id, "abort")
            o.finish = self.clock
            if self.record:
                self.records.append(step_record(self.scheduler, self.stats.steps, self.clock, f"aborted {request_id}"))
        return o

    def _check_stop_strings(self, out: SchedulerOutput, before: dict[int, int]) -> list[Request]:
        """End every sample of this step whose text now contains a stop string (vLLM checks them
        in its output processor, which has the detokenizer; the scheduler only sees token ids).
        A sample the scheduler ended on a stop token id instead has that token's text left out
        (unless ``include_stop_str_in_output``) and no stop string checked in it: the token wins,
        as in vLLM's detokenizer.  A sample given several tokens in the step (accepted drafts) is
        checked after each, as plain decoding would have checked them, and the tokens after the
        one that completes a stop string are dropped.  ``before``: per sampling sequence, its
        length before the step.  Returns the requests this ended."""
        done = []
        for rid in dict.fromkeys(c.request_id for c in out.chunks if c.sample):
            req = self.scheduler.requests[rid]
            p = req.sampling_params
            if p is None or req.finish_reason is not None or not (p.stop or p.stop_token_ids):
                continue
            o = self._output(rid)
            for seq in req.seqs:
                if seq.index in o.stop_at or seq.index in o.stop_token:
                    continue
                new = len(seq.tokens) - before.get(seq.seq_id, len(seq.tokens) - 1)
                by_token = seq.finish_reason == "stop"      # a stop token id, this step: its token wins
                if by_token and not p.include_stop_str_in_output:
                    o.stop_token.add(seq.index)
                if not p.stop or seq.finish_reason not in (None, "length", "stop"):
                    continue
                hit = self._first_stop(seq.output, p.stop, new - by_token)
                if hit is None:
                    continue
                drop, at, s = hit
                o.stop_token.discard(seq.index)
                o.stop_at[seq.index] = at + len(s) if p.include_stop_str_in_output else at
                if seq.finish_reason is None:               # still generating: it ends now
                    if self.scheduler.finish_sample(rid, seq.index, "stop", drop=drop):
                        done.append(req)
                else:                                       # it had ended later in the step, or here
                    del seq.tokens[len(seq.tokens) - drop:]
                    seq.finish_reason = "stop"
        return done

    def _first_stop(self, output: list[int], stops, new: int) -> tuple[int, int, str] | None:
        """Among the last ``new`` tokens of ``output``, the first after which the text holds a stop
        string: ``(tokens after it, where the string starts, the string)``; ``None``: none."""
        for drop in range(new - 1, -1, -1):
            text = self.tokenizer.decode(output[:len(output) - drop], final=False)
            hits = [(text.find(s), s) for s in stops if s in text]
            if hits:
                return (drop, *min(hits))
        return None

    def _note_hand_preemptions(self) -> None:
        """Stamp preemptions made between steps (``scheduler.preempt``, the live panel's button)
        with the step they take effect in, the next one."""
        sch = self.scheduler
        if sch.num_preemptions == self._preemptions_seen:
            return
        for req in list(sch.waiting) + list(sch.swapped):
            o = self._output(req.request_id)
            o.preempted_steps += [self.stats.steps + 1] * (req.preemptions - len(o.preempted_steps))
        self._preemptions_seen = sch.num_preemptions

    def _output(self, rid) -> RequestOutput:
        """The output of ``rid``, made for a request added to the scheduler directly."""
        if rid not in self._outputs:
            req = self.scheduler.requests[rid]
            self._outputs[rid] = RequestOutput(rid, req.prompt, req, arrival=req.arrival)
        return self._outputs[rid]

    def _account(self, out: SchedulerOutput, result: ModelRunnerOutput) -> None:
        sch, st = self.scheduler, self.stats
        self.clock += result.seconds
        st.steps += 1
        st.clock_s = self.clock
        st.prompt_tokens += out.prefill_tokens
        st.generated += sum(len(t) for t in result.sampled_token_ids.values())
        st.kv_usage.append(1 - sch.manager.num_free_blocks / sch.config.num_gpu_blocks)
        st.running.append(len(sch.running))
        st.waiting.append(len(sch.waiting))
        st.swapped.append(len(sch.swapped))
        st.admitted.append(len(out.admitted))
        st.preempted_now.append(len(out.preempted))
        st.step_s.append(result.seconds)
        st.prefix_queries, st.prefix_hits = sch.prefix_queries, sch.prefix_hits
        st.preempted_prefix_queries, st.preempted_prefix_hits = sch.preempted_prefix_queries, sch.preempted_prefix_hits

    def _report(self, out: SchedulerOutput, done: list[Request], produced: set) -> list[RequestOutput]:
        sch, st = self.scheduler, self.stats
        st.finished.append(len(done))
        st.preemptions, st.recomputes, st.swaps = sch.num_preemptions, sch.num_recomputes, sch.num_swaps
        st.swapped_blocks = sch.num_swapped_blocks
        st.num_draft_tokens, st.num_accepted_tokens = sch.num_draft_tokens, sch.num_accepted_tokens
        if self.record:
            cache = sch.manager.cache
            evicted = () if cache is None else cache.evictions[self._evicted_seen:]
            self._evicted_seen += len(evicted)
            self.records.append(step_record(sch, st.steps, self.clock, describe(out, done), out.hit_blocks, evicted))
        result = []
        for rid in out.preempted:
            self._output(rid).preempted_steps.append(st.steps)
        self._preemptions_seen = sch.num_preemptions
        for rid in sorted(produced | {r.request_id for r in done}, key=lambda r: sch.requests[r].order):
            req, o = sch.requests[rid], self._output(rid)
            if rid in produced:
                if math.isnan(o.first_token):
                    o.first_token = self.clock
                o.token_times.append(self.clock)
                o.token_steps.append(st.steps)
            o.preemptions = req.preemptions
            if req.finished:
                o.finish = self.clock
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
        if verdict.verdict is Verdict.NEVER:
            raise AdmissionError(f"prompt of {len(ids)} tokens can never run: {verdict.reason}")

    def output(self, request_id) -> RequestOutput:
        """The output of ``request_id`` (live: it follows the request).

        Raises:
            PagedKVError: an unknown request id.
        """
        try:
            known = request_id in self._outputs
        except TypeError:
            raise PagedKVError(f"request ids are hashable, got {request_id!r:.80}") from None
        if not known and request_id in self.scheduler.requests:     # added to the scheduler directly
            return self._output(request_id)
        if not known:
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
                    return seq_name(req, s)
        return str(seq_id)

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



def _check_params(params) -> SamplingParams:
    """``params`` (``None``: the defaults) as a SamplingParams, or ConfigError naming it."""
    params = SamplingParams() if params is None else params
    if not isinstance(params, SamplingParams):
        raise ConfigError(f"params must be a SamplingParams, got {params!r:.80}")
    return params
