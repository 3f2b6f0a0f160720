"""What runs a scheduled step: the tiny model over a paged cache, or a timing model of a large one.

Both take a :class:`~paged_kv.scheduling.SchedulerOutput` and return how long the step took and
the tokens sampled, so the same :class:`~paged_kv.engine.LLMEngine` loop serves the tiny model
(real K/V, real text) and a 13B model on a modelled GPU (the paper's Figure 12, by timing model).

:class:`ModelRunner` does, in order (vLLM's worker and model runner do the same):

1. **swap out**, then **swap in** (the block mappings the scheduler made;
   :func:`kernels.cache_ops.swap_blocks`), then the copy-on-write **copies**;
2. **forward**: the step's prefill chunks as one batch (each chunk attends to its sequence's
   cached context through the block table and causally to itself,
   :func:`kernels.paged_prefill.paged_prefill_attention`), its decode tokens as another
   (:func:`kernels.paged_attention.paged_decode_attention`).  Real engines fuse the two into one
   pass (vLLM v1 runs one attention kernel over the mixed batch); two passes keep each kernel
   the one its chapter taught, and give the same tokens.  With prefix caching a prompt's chunks
   start after its cached blocks, so only the uncached suffix runs, attending to the cached
   blocks as context (a one-token suffix, like any last token, goes the decode way);
3. **sample** from each finished chunk's last logits, with the request's penalties and its
   sequence's own generator (seed + sample index), so a request's tokens do not depend on who
   else is in the batch.

Legend: B sequences, V vocabulary.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ..errors import ConfigError
from ..model.sampling import SamplingParams, apply_penalties, sample, sample_generator
from ..scheduling import Scheduler, SchedulerOutput
from ..storage import PagedKVCache, prepare_paged_batch, run_paged_batch

__all__ = ["ModelRunner", "TimingRunner"]


class ModelRunner:
    """Runs scheduled steps on a :class:`~paged_kv.model.TinyLlama` with a :class:`PagedKVCache`.

    Args:
        model: the model (its dtype and device are the cache's).
        num_gpu_blocks, num_cpu_blocks, block_size: the pools, as the scheduler's.
        backend: ``"torch"`` (the references) or ``"triton"`` (the kernels).

    Raises:
        ConfigError: (from the cache) bad sizes.
    """

    def __init__(self, model, num_gpu_blocks: int, block_size: int, num_cpu_blocks: int = 0,
                 backend: str = "torch") -> None:
        self.model, self.backend = model, backend
        self.cache = PagedKVCache(model.cfg, num_gpu_blocks, block_size, dtype=model.dtype,
                                  device=model.device, num_cpu_blocks=num_cpu_blocks)
        self._gens: dict[tuple, torch.Generator] = {}
        self.shifts: dict[object, int] = {}    # request id -> its adapter's token shift (see LLMEngine.load_adapter)
        self.last_logits: dict[int, torch.Tensor] = {}   # per sequence sampled in the last step: [V]

    def execute(self, scheduler: Scheduler, out: SchedulerOutput,
                params: Callable[[object], SamplingParams]) -> tuple[float, dict[int, list[int]]]:
        """Run ``out``; returns (seconds it took, wall clock; tokens sampled per sequence id).

        ``params(request_id)`` gives each request's :class:`SamplingParams`."""
        t0 = time.perf_counter()
        self.cache.swap_out(out.swap_out)
        self.cache.swap_in(out.swap_in)
        self.cache.copy_blocks(out.copies, self.backend)
        sampled: dict[int, list[int]] = {}
        self.last_logits = {}
        manager = scheduler.manager
        for phase in ("prefill", "decode"):
            chunks = [c for c in out.chunks if (c.length == 1 and c.start > 0 and c.sample) == (phase == "decode")]
            if not chunks:
                continue
            reqs = [scheduler.requests[c.request_id] for c in chunks]
            seqs = [next(s for s in r.seqs if s.seq_id == c.seq_id) for r, c in zip(reqs, chunks)]
            vocab = self.model.cfg.vocab_size
            batch = prepare_paged_batch(manager, [c.seq_id for c in chunks],
                                        [[(t + self.shifts.get(r.request_id, 0)) % vocab
                                          for t in s.tokens[c.start:c.start + c.length]]
                                         for r, s, c in zip(reqs, seqs, chunks)],
                                        phase, device=self.model.device, starts=[c.start for c in chunks])
            logits = run_paged_batch(self.model, self.cache, batch, self.backend)      # (B, V)
            for b, (c, r, s) in enumerate(zip(chunks, reqs, seqs)):
                if c.sample:
                    self.last_logits[c.seq_id] = logits[b]
                    sampled[c.seq_id] = self._sample(logits[b:b + 1], params(r.request_id), r, s, c.num_samples)
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, sampled

    def _sample(self, logits, p: SamplingParams, req, seq, fork: int) -> list[int]:
        """One token for ``seq``, or for a fresh leader one per sample ``seq.index .. + fork - 1``,
        each from its own generator (kept across preemptions: a recompute samples nothing twice)."""
        row = apply_penalties(logits, [seq.output], p)
        toks = []
        for i in range(seq.index, seq.index + fork):
            gen = None if p.greedy else self._generator(req.request_id, i, p.seed)
            toks.append(int(sample(row, p, None if gen is None else [gen])[0]))
        return toks

    def _generator(self, request_id, index: int, seed: int) -> torch.Generator:
        key = (request_id, index)
        if key not in self._gens:
            self._gens[key] = sample_generator(seed, index, device=self.model.device)
        return self._gens[key]

    def forget(self, request_id) -> None:
        """Drop a finished request's generators."""
        for key in [k for k in self._gens if k[0] == request_id]:
            del self._gens[key]
        self.shifts.pop(request_id, None)


class TimingRunner:
    """Runs scheduled steps on no model at all: the step's time comes from a timing model, and
    every sampled token is 0 (a stand-in: only lengths matter for memory and time).

    Args:
        iteration_time: seconds per step from the tokens it reads and prefills,
            :class:`paged_kv.sim.IterationTime` (e.g. ``ServingSetup.iteration_time()``: OPT-13B
            on an A100 by roofline, the paper's set-up), called as
            ``iteration_time(kv_tokens, prefill_tokens)``.  A re-prefill after a recompute
            preemption is charged here, as prefill tokens.
        swap_time: seconds to swap blocks, called as ``swap_time(num_blocks, block_size)`` for the
            blocks moved out and in during the step (:class:`paged_kv.engine.serving.SwapTime`);
            ``None``: swaps are free.
    """

    def __init__(self, iteration_time, swap_time=None) -> None:
        for label, f in (("iteration_time", iteration_time), ("swap_time", swap_time)):
            if f is not None and not callable(f) or (label == "iteration_time" and f is None):
                raise ConfigError(f"{label} must be callable, got {f!r}")
        self.iteration_time, self.swap_time = iteration_time, swap_time

    def execute(self, scheduler: Scheduler, out: SchedulerOutput, params) -> tuple[float, dict[int, list[int]]]:
        sampled = {c.seq_id: [0] * c.num_samples for c in out.chunks if c.sample}
        seconds = float(self.iteration_time(out.kv_tokens, out.prefill_tokens))
        if self.swap_time is not None:
            bs = scheduler.config.block_size
            for mapping in (out.swap_out, out.swap_in):
                if mapping:
                    seconds += float(self.swap_time(len(mapping), bs))
        return seconds, sampled

    def forget(self, request_id) -> None:
        pass
