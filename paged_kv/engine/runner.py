"""What runs a scheduled step: the tiny model over a paged cache, or a timing model of a large one.

Both (:class:`TimingRunner` is in :mod:`~paged_kv.engine.timing_runner`, which needs no torch)
take a :class:`~paged_kv.scheduling.SchedulerOutput` and nothing else, and return a
:class:`ModelRunnerOutput`: the tokens sampled and how long the step took.  They never read the
scheduler or the block manager (vLLM v1's model runner works from its ``SchedulerOutput`` the
same way), so the same :class:`~paged_kv.engine.LLMEngine` loop serves the tiny model (real K/V,
real text) and a 13B model on a modelled GPU (the paper's Figure 12).

:class:`ModelRunner` does, in order:

1. **swap out**, then **swap in** (the scheduler's block pairs; :func:`kernels.cache_ops.swap_blocks`),
   then the copy-on-write **copies**;
2. **forward**: the step's decode tokens as one batch
   (:func:`kernels.paged_attention.paged_decode_attention`), then its prefill chunks as another
   (each attends to its cached context through the block table and causally to itself,
   :func:`kernels.paged_prefill.paged_prefill_attention`).  Real engines fuse the two into one
   pass (vLLM v1 runs one attention kernel over the mixed batch); two passes keep each kernel the
   one its chapter taught, and give the same tokens.  The order matters with prefix caching: a
   block is registered when its step is scheduled, so a request admitted in the same step may hit
   a block that this step's decode token or prefill chunk completes.  Decode tokens go first; such
   a reader's chunk goes with the prefill chunks even when it is one token
   (:func:`is_decode`); and within a pass each layer stores all its K/V before it attends.  So every
   K/V a chunk reads is written first (a decode token of the first pass reads only what earlier
   steps wrote);
3. **sample** from each sampling chunk's last logits with its request's parameters and its
   sequence's own generator (seed + sample index), so a request's tokens do not depend on who
   else is in the batch.  A *verify chunk* (speculative decoding: the last sampled token and
   ``d`` drafts) runs with the prefill chunks and is read at all its ``d + 1`` positions: greedy,
   the drafts are kept while each equals the argmax after the token before it
   (:func:`~paged_kv.spec_decode.accept_greedy`), then the argmax at the first disagreement (or
   after the last draft) is added; sampling, by the speculative-sampling rule with the draft's
   ``q`` one-hot (both proposers are deterministic;
   :func:`~paged_kv.model.rejection_sampler.rejection_sample`), its ``d + 1`` uniforms from the
   sequence's generator.  A frequency penalty at position ``j`` counts the drafts before it as
   output, as plain decoding would have.

Legend: B sequences, V vocabulary.
"""

from __future__ import annotations

import time

import torch

from ..errors import ConfigError, PagedKVError
from ..model.attention import check_reduction_backend
from ..model.rejection_sampler import rejection_sample
from ..model.sampling import apply_penalties, probabilities, sample, sample_generator
from ..sampling_params import SamplingParams
from ..scheduling import Chunk, SchedulerOutput
from ..spec_decode import accept_greedy
from ..storage import BatchRow, PagedKVCache, prepare_paged_batch, run_paged_batch
from .runner_output import ModelRunnerOutput
from .timing_runner import TimingRunner

# ModelRunnerOutput and TimingRunner live in torch-free modules; imported here too, where they were.
__all__ = ["ModelRunner", "ModelRunnerOutput", "TimingRunner"]

GREEDY = SamplingParams()


def is_decode(chunk: Chunk, readers=frozenset()) -> bool:
    """Whether a chunk goes the decode kernel's way, in the step's first pass: one token, after a
    context, that samples, of a request not in ``readers`` (the step's ``same_step_hits``: its
    context holds blocks this step writes, maybe by a prefill chunk, so it runs in the second pass,
    with the prefill chunks)."""
    return chunk.query_len == 1 and chunk.start > 0 and chunk.sample and chunk.request_id not in readers


class ModelRunner:
    """Runs scheduled steps on a :class:`~paged_kv.model.TinyLlama` with a :class:`PagedKVCache`.

    Args:
        model: the model (its dtype and device are the cache's).
        num_gpu_blocks, num_cpu_blocks, block_size: the pools, as the scheduler's.
        backend: ``"torch"`` (the references) or ``"triton"`` (the kernels).
        reduction: the order of every pass's sums, a :class:`~paged_kv.model.reduction.ReductionOrder`
            (torch backend), or ``None``: the references' own.

    Raises:
        ConfigError: (from the cache) bad sizes; a reduction the backend cannot run.
    """

    def __init__(self, model, num_gpu_blocks: int, block_size: int, num_cpu_blocks: int = 0,
                 backend: str = "torch", reduction=None) -> None:
        self.model, self.backend = model, backend
        self.reduction = check_reduction_backend(reduction, backend)
        self.cache = PagedKVCache(model.cfg, num_gpu_blocks, block_size, dtype=model.dtype,
                                  device=model.device, num_cpu_blocks=num_cpu_blocks)
        self._gens: dict[tuple, torch.Generator] = {}    # (request id, sample index) -> its generator
        self._last_step = 0

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Run the step ``out`` describes; see the module's docstring for the order.

        The runner keeps one thing between steps: each sample's random generator, whose draws
        continue from step to step (vLLM's runner keeps per-request state too).  So a step runs
        once: running it again would draw different tokens, and writes its K/V twice.

        Raises:
            PagedKVError: ``out`` is not a scheduled step after the last one run here.
        """
        if not isinstance(out, SchedulerOutput) or out.step <= self._last_step:
            raise PagedKVError(f"a runner runs each scheduled step once, in order: step "
                               f"{getattr(out, 'step', out)!r:.40} after step {self._last_step}")
        self._last_step = out.step
        t0 = time.perf_counter()
        for rid in out.finished_req_ids:
            self._gens = {k: g for k, g in self._gens.items() if k[0] != rid}
        self.cache.swap_out(out.swap_out)
        self.cache.swap_in(out.swap_in)
        self.cache.copy_blocks(out.copies, self.backend)
        result = ModelRunnerOutput({}, 0.0)
        saved = {k: g.get_state() for k, g in self._gens.items()}
        try:
            self._forward_and_sample(out.chunks, result, set(out.same_step_hits))
        except Exception:
            # Find whose part failed: put the generators back as they were before the step (so a
            # retry draws from the same states), then run each request's chunks alone, in step
            # order (a block's writer before its readers).  Rewriting a slot writes the same K/V; a
            # failed request's slots are freed with it.  A request whose prefix-cache hit reads
            # blocks that a failed part was to write is not run at all: the scheduler puts it back.
            result = ModelRunnerOutput({}, 0.0)
            self._restore(saved)
            for rid in dict.fromkeys(c.request_id for c in out.chunks):
                if rid in out.readers_of(result.failed):
                    continue
                part = ModelRunnerOutput({}, 0.0)
                before = {k: g.get_state() for k, g in self._gens.items()}
                try:
                    self._forward_and_sample([c for c in out.chunks if c.request_id == rid], part,
                                             set(out.same_step_hits))
                except Exception as e:
                    self._restore(before)
                    result.failed[rid] = f"{type(e).__name__}: {e}"
                else:
                    result.sampled_token_ids.update(part.sampled_token_ids)
                    result.logits.update(part.logits)
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        result.seconds = time.perf_counter() - t0
        return result

    def _forward_and_sample(self, chunks: list[Chunk], result: ModelRunnerOutput, readers=frozenset()) -> None:
        """The forward passes (decode tokens, then prefill chunks; ``readers``: the requests whose
        hits read blocks the step writes, see :func:`is_decode`) and the sampling of ``chunks``."""
        vocab = self.model.cfg.vocab_size
        for phase in ("decode", "prefill"):     # decode first: a prefill may read what a decode writes
            part = [c for c in chunks if is_decode(c, readers) == (phase == "decode")]
            if not part:
                continue
            rows = [BatchRow([(t + c.adapter_shift) % vocab for t in c.token_ids], c.start, c.slot_mapping,
                             c.block_table) for c in part]
            batch = prepare_paged_batch(rows, phase, self.model.device)
            every = any(c.spec_token_ids for c in part)     # a verify chunk reads all its positions
            args = (self.model, self.cache, batch, self.backend, self.reduction)
            # (B, T, V) with a verify chunk, else (B, V)
            logits = run_paged_batch(*args, all_positions=True) if every else run_paged_batch(*args)
            for b, c in enumerate(part):
                if c.spec_token_ids:
                    toks, used = self._verify(logits[b, :c.query_len], c)
                    result.logits[c.seq_id] = logits[b, used]
                    result.sampled_token_ids[c.seq_id] = toks
                elif c.sample:
                    last = logits[b, c.query_len - 1] if every else logits[b]
                    result.logits[c.seq_id] = last
                    result.sampled_token_ids[c.seq_id] = self._sample(last[None], c)

    def _restore(self, states: dict) -> None:
        """Put the generators back as they were (and drop the ones made since)."""
        self._gens = {k: g for k, g in self._gens.items() if k in states}
        for k, state in states.items():
            self._gens[k].set_state(state)

    def _sample(self, logits: torch.Tensor, c: Chunk) -> list[int]:
        """One token for the chunk's sequence, or for a fresh leader one per sample
        ``index .. index + num_samples - 1``, each from its own generator (kept across preemptions:
        a recompute samples nothing twice)."""
        p = c.sampling_params or GREEDY
        row = apply_penalties(logits, [c.output_token_ids], p)          # (1, V)
        toks = []
        for i in range(c.index, c.index + c.num_samples):
            gen = None if p.greedy else self._generator(c.request_id, i, p.seed)
            toks.append(int(sample(row, p, None if gen is None else [gen])[0]))
        return toks

    def _verify(self, logits: torch.Tensor, c: Chunk) -> tuple[list[int], int]:
        """A verify chunk's tokens from its logits ``[d + 1, V]`` (row ``j``: after the fed token and
        ``j`` drafts): the accepted drafts and one token more, and the row the last was drawn from."""
        p = c.sampling_params or GREEDY
        drafts = list(c.spec_token_ids)
        rows = torch.cat([apply_penalties(logits[j:j + 1], [list(c.output_token_ids) + drafts[:j]], p)
                          for j in range(len(drafts) + 1)])                       # (d + 1, V)
        if p.greedy:
            toks = accept_greedy(drafts, rows.argmax(-1).tolist())
        else:
            gen = self._generator(c.request_id, c.index, p.seed)
            uniforms = torch.rand(len(drafts) + 1, generator=gen, device=gen.device).cpu()
            toks = rejection_sample(probabilities(rows, p).cpu(), None, drafts, uniforms=uniforms)
        return toks, len(toks) - 1

    def _generator(self, request_id, index: int, seed: int) -> torch.Generator:
        key = (request_id, index)
        if key not in self._gens:
            self._gens[key] = sample_generator(seed, index, device=self.model.device)
        return self._gens[key]
