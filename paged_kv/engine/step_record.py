"""One engine step as plain data, for figures that replay a run (:mod:`paged_kv.viz.serving`), and
the step in words.

A record holds no live objects (snapshots, tuples, strings), so a static page can draw a run long
after the engine is gone.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..blocks import Event, rename_sequences, snapshot
from ..scheduling import Request, Scheduler, SchedulerOutput, Sequence

__all__ = ["StepRecord", "describe", "sample_name", "seq_name", "step_record"]


@dataclass(frozen=True)
class StepRecord:
    """One step as plain data, for figures that replay a run (:mod:`paged_kv.viz.serving`).

    Attributes:
        step: its number (0 = before the first step); ``clock_s``: the clock after it (s).
        pool: the GPU pool after it, a :class:`~paged_kv.blocks.Snapshot` whose sequences are
            named ``"<request>"`` (the leader) and ``"<request>.<i>"`` (sample ``i``).
        cpu: per CPU block, the first sequence holding it (``None``: free), as the GPU pool's
            owner is its first holder.
        cpu_holders: per CPU block, ``(sequence, logical index)`` of every swapped-out table that
            holds it (empty: free); its length is the block's reference count, so a prompt block
            shared by a group's samples shows every sample.
        waiting, running, swapped: per queue, ``(request, generated tokens, max_tokens, computed
            prompt tokens, prompt tokens)`` in queue order.
        text: what happened, in words.
        cached: per GPU block, whether it holds a prefix-cache entry (a cached block in use, or a
            cached-free one when the pool shows it free); empty with caching off.
        hits: blocks handed out as prefix-cache hits in this step; evicted: blocks whose entry
            was evicted in this step, in LRU order.
        computed: per sequence in the GPU pool, ``(name, tokens whose K/V is in the cache)``
            (``Sequence.num_computed``): the pool's slots past it are *reserved*, taken for tokens
            the engine has not run yet (a prompt's later chunks under chunked prefill, a
            recomputed request's tokens before its prefill), not holding K/V.  Empty: unknown
            (a record made before the field), every stored token drawn as computed.
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
    cpu_holders: tuple = ()
    computed: tuple = ()

    def computed_tokens(self) -> dict:
        """``{sequence name: tokens with K/V}`` of :attr:`computed`."""
        return dict(self.computed)


def step_record(scheduler: Scheduler, step: int, clock_s: float, text: str, hits=(), evicted=()) -> StepRecord:
    """The scheduler's queues and pools now, as a :class:`StepRecord` (``hits``, ``evicted``: this
    step's prefix-cache hits and evictions, block ids)."""
    sch = scheduler
    cached = ()
    if sch.manager.cache is not None:
        cached = tuple(b in sch.manager.cache for b in range(sch.config.num_gpu_blocks))
    names = {s.seq_id: seq_name(r, s) for r in sch.requests.values() for s in r.seqs}
    pool = rename_sequences(snapshot(sch.manager, step, Event("step", text=text)), names)
    holders: list[list] = [[] for _ in range(sch.config.num_cpu_blocks)]
    for sid in sch.manager.swapped_ids:
        for logical, b in enumerate(sch.manager.swapped_table(sid).block_ids):
            holders[b].append((names.get(sid, str(sid)), logical))
    cpu = [h[0][0] if h else None for h in holders]

    gpu = set(sch.manager.seq_ids)
    computed = tuple((names[s.seq_id], s.num_computed) for r in sch.requests.values() for s in r.seqs
                     if s.seq_id in gpu)

    def rows(queue):
        return tuple((str(r.request_id), max(s.num_generated for s in r.seqs), r.max_tokens,
                      min(r.leader.num_computed, r.prompt_len), r.prompt_len) for r in queue)
    return StepRecord(step, clock_s, pool, tuple(cpu), rows(sch.waiting), rows(sch.running), rows(sch.swapped),
                      text, cached, tuple(hits), tuple(evicted), tuple(tuple(h) for h in holders), computed)


def seq_name(request: Request, seq: Sequence) -> str:
    """A sequence's name in figures: ``"<request>"`` for sample 0, ``"<request>.<i>"`` for sample i."""
    return sample_name(request.request_id, seq.index)


def sample_name(request_id, index: int) -> str:
    """Sample ``index`` of request ``request_id`` by name, as figures and status lines write it:
    ``"B"`` for sample 0 (the leader, which holds the prompt), ``"B.1"``, ``"B.2"``, ... for the
    others, so the lines of an ``n = 2`` request read ``B`` and ``B.1`` as its pool does."""
    return str(request_id) if index == 0 else f"{request_id}.{index}"


def describe(out: SchedulerOutput, done: list[Request]) -> str:
    """One step in words: who was admitted, preempted (how), finished; prefill chunks, verify chunks
    (speculative decoding: each one's drafts, its decode token counted with the decodes) and decodes."""
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
    chunks = [f"{c.request_id}[{c.start}:{c.seq_len}]" for c in out.chunks
              if (c.query_len > 1 or not c.sample) and not c.spec_token_ids]
    if chunks:
        parts.append("prefill " + ", ".join(chunks))
    verify = [f"{c.request_id}: {len(c.spec_token_ids)} draft{'s' * (len(c.spec_token_ids) > 1)}"
              for c in out.chunks if c.spec_token_ids]
    if verify:
        parts.append("verify " + ", ".join(verify))
    if out.decode_tokens:
        parts.append(f"{out.decode_tokens} decode token{'s' if out.decode_tokens > 1 else ''}")
    if out.copies:
        parts.append(f"{len(out.copies)} copy-on-write copies")
    if done:
        parts.append("finished " + ", ".join(str(r.request_id) for r in done))
    return "; ".join(parts) or "nothing to do"
