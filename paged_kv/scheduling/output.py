"""One step as data: what the scheduler decided, complete enough that the model runner needs
nothing else.

vLLM v1's ``SchedulerOutput`` (``vllm/v1/core/sched/output.py``) is the model: the runner never
calls back into the scheduler or the block manager.  Ours sends every scheduled chunk whole
(token ids, positions, block table, slot mapping, sampling settings) where vLLM sends a new
request once and only what changed afterwards; whole chunks are easier to read and to test,
and cost a tuple per sequence per step.  Pure Python.

Legend: BS block size (tokens per block).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, NamedTuple

from ..errors import PagedKVError
from ..sampling_params import SamplingParams

__all__ = ["Chunk", "SchedulerOutput"]


class Chunk(NamedTuple):
    """One sequence's share of a step: its tokens ``start .. start + query_len - 1`` run now.

    A named tuple: immutable, and built for every sequence of every step (a frozen dataclass
    costs six times as much to build).

    Attributes:
        request_id, seq_id: whose tokens; ``index``: the sample's number in its request (its
            generator is seeded ``seed + index``).
        start: the first position; the ``start`` tokens before it are in the cache (the context).
        token_ids: the tokens run now (one for a decode step).
        slot_mapping: the slot each token's K/V goes to (``block_id * BS + offset``).
        block_table: the sequence's physical blocks in logical order, after this step's are taken.
        sample: whether a token is sampled from the last position (the sequence is then fully
            computed).  ``num_samples``: how many: ``n`` for the leader of a fresh ``n``-sample
            request that has just finished its prompt (the samples fork from it), else 1.
        sampling_params: the request's :class:`~paged_kv.sampling_params.SamplingParams`
            (``None``: greedy).
        output_token_ids: the tokens this sequence generated so far, sent only when a sampled
            chunk's request has a frequency penalty (the penalty counts them); else empty.
        adapter_shift: the request's adapter (a stand-in for a LoRA adapter: the runner feeds
            token ``(t + shift) mod V`` for ``t``); 0 for none.
        spec_token_ids: the draft tokens this chunk verifies (vLLM's ``scheduled_spec_decode_tokens``),
            the last ``d`` of ``token_ids``: a *verify chunk* runs the sequence's last sampled token
            and ``d`` drafts, each with a lookahead slot.  The runner returns the accepted drafts
            and one token more (1 .. d + 1 tokens); ``()`` for any other chunk.
    """

    request_id: Hashable
    seq_id: int
    index: int
    start: int
    token_ids: tuple[int, ...]
    slot_mapping: tuple[int, ...]
    block_table: tuple[int, ...]
    sample: bool
    num_samples: int = 1
    sampling_params: SamplingParams | None = None
    output_token_ids: tuple[int, ...] = ()
    adapter_shift: int = 0
    spec_token_ids: tuple[int, ...] = ()

    @property
    def query_len(self) -> int:
        """Tokens run now (vLLM's ``query_len``)."""
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        """Context plus the new tokens: what attention reads (vLLM's ``seq_len``)."""
        return self.start + len(self.token_ids)

    @property
    def positions(self) -> range:
        return range(self.start, self.start + len(self.token_ids))


@dataclass
class SchedulerOutput:
    """What one step must do, in order: ``swap_out`` (GPU -> CPU block pairs), ``swap_in``
    (CPU -> GPU), ``copies`` (copy-on-write ``(src, dst)`` GPU blocks), then run ``chunks``.

    Also: ``step`` (its number: the scheduler accepts the result of its latest step only, once, and
    a runner runs each step once), ``finished_req_ids`` (requests that finished since the last step:
    the runner drops their state), ``preempted`` (request ids, with ``recomputed`` and ``swapped`` split), ``admitted``
    (started or resumed), ``prefill_tokens`` and ``decode_tokens`` (the token budget used),
    ``cache_hits`` (per request admitted now, the prompt tokens its prefix-cache hit saved) and
    ``hit_blocks`` (the blocks those hits handed out), ``num_draft_tokens`` (draft tokens scheduled
for verification, in verify chunks; a share of the token budget too), ``same_step_hits`` (per request admitted now
    whose hit includes blocks that *this* step writes, registered when an earlier chunk of the step
    was scheduled: the requests whose chunks write them, in step order), ``prompt_token_ids`` (per
request admitted from the waiting queue in this step, first time or after a recompute, its prompt:
vLLM's ``NewRequestData.prompt_token_ids``, sent once; a runner that keeps per-request state learns
the context a prefix-cache hit lets it skip from it).

    The runner must write those blocks before the reader's chunk reads them (it runs the decode
    tokens first, then the prefill chunks, and each layer stores a pass's K/V before it attends),
    and must not run a reader whose writer's part failed (:meth:`readers_of`).
    """

    chunks: list[Chunk] = field(default_factory=list)
    step: int = 0
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    finished_req_ids: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    recomputed: list = field(default_factory=list)
    swapped: list = field(default_factory=list)
    admitted: list = field(default_factory=list)
    prefill_tokens: int = 0
    decode_tokens: int = 0
    num_draft_tokens: int = 0
    cache_hits: dict = field(default_factory=dict)
    hit_blocks: list = field(default_factory=list)
    same_step_hits: dict = field(default_factory=dict)
    prompt_token_ids: dict = field(default_factory=dict)

    def readers_of(self, failed) -> set:
        """The requests whose prefix-cache hits read, directly or through another reader's blocks,
        K/V that the requests in ``failed`` were to write in this step (``failed`` excluded): they
        must not run, since what they would read was never written."""
        failed, readers = set(failed), set()
        grew = True
        while grew:
            grew = False
            for reader, writers in self.same_step_hits.items():
                if reader not in readers and reader not in failed and any(w in failed or w in readers
                                                                          for w in writers):
                    readers.add(reader)
                    grew = True
        return readers

    @property
    def num_tokens(self) -> int:
        """Tokens the step runs (its share of ``max_num_batched_tokens``), draft tokens included."""
        return self.prefill_tokens + self.decode_tokens + self.num_draft_tokens

    @property
    def query_lens(self) -> list[int]:
        """Per chunk, the tokens run now."""
        return [c.query_len for c in self.chunks]

    @property
    def seq_lens(self) -> list[int]:
        """Per chunk, context + new tokens."""
        return [c.seq_len for c in self.chunks]

    @property
    def kv_tokens(self) -> int:
        """Tokens the step's attention reads, all chunks together (for the timing model)."""
        return sum(c.seq_len for c in self.chunks)

    @property
    def empty(self) -> bool:
        return not self.chunks

    def check_sampled(self, sampled, skip=frozenset()) -> None:
        """Check a runner's result against this step before anything records it: a dict from the id
        of every sampling chunk's sequence to ``num_samples`` token ids (ints >= 0), nothing else
        (the chunks of the requests in ``skip``, whose part of the step failed, need none).  A verify
        chunk's sequence gets 1 .. d + 1 tokens, all but the last equal to its first drafts (the
        accepted ones).

        Raises:
            PagedKVError: naming what does not match.
        """
        if not isinstance(sampled, dict) or not all(isinstance(t, (list, tuple)) for t in sampled.values()):
            raise PagedKVError(f"sampled must map sequence ids to lists of token ids (a ModelRunnerOutput's "
                               f"sampled_token_ids), got {sampled!r:.80}")
        bad = [t for toks in sampled.values() for t in toks if type(t) is not int or t < 0]
        if bad:
            raise PagedKVError(f"sampled token ids must be ints >= 0, got {bad[:3]!r}")
        chunks = [c for c in self.chunks if c.request_id not in skip]
        missing = [c.seq_id for c in chunks if c.sample and not c.spec_token_ids
                   and len(sampled.get(c.seq_id, ())) != c.num_samples]
        for c in chunks:
            if c.spec_token_ids and c.seq_id in sampled:
                toks, d = list(sampled[c.seq_id]), list(c.spec_token_ids)
                if not 1 <= len(toks) <= len(d) + 1 or toks[:-1] != d[:len(toks) - 1]:
                    raise PagedKVError(f"sequence {c.seq_id} verified drafts {d} in step {self.step}: the runner must "
                                       f"return the accepted drafts and one token more (1 to {len(d) + 1} tokens), "
                                       f"got {toks}")
            elif c.spec_token_ids:
                missing.append(c.seq_id)
        extra = set(sampled) - {c.seq_id for c in chunks if c.sample}
        if missing or extra:
            raise PagedKVError(f"sampled tokens do not match step {self.step}: missing or a wrong count for "
                               f"sequences {missing}, unexpected for {sorted(extra)}")
