"""Requests and their sequences, as the scheduler sees them: token ids and progress, no tensors.

A **request** is one prompt; it runs ``n`` **sequences** (its samples; ``n = 1`` usually), all
starting from the prompt.  A sequence holds ``tokens`` (prompt + generated) and ``num_computed``,
how many of them have their K/V in the cache.  The difference is what the next forward pass must
run: the rest of the prompt (a prefill, possibly in chunks), or the one token sampled last (a
decode step).  A sequence is sampled from only when everything it holds is computed, so a request
preempted by recompute re-prefills prompt *and* generated tokens before it samples again.

Follows vLLM v0's ``SequenceGroup``/``Sequence`` (a request of ``n`` sequences) and v1's
``num_computed_tokens`` (one number tells prefill from decode).  The rules of a group of samples
live here, on the request: who prefills (the *leader*), who holds blocks, what the next step runs.
Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

from ..blocks.block_table import group_blocks_needed, stored_tokens
from ..errors import ConfigError, PromptError
from ..sampling_params import SamplingParams
from ..validate import count, real

__all__ = ["FINISHED", "RUNNING", "Request", "STATUSES", "SWAPPED", "Sequence", "WAITING"]

WAITING, RUNNING, SWAPPED, FINISHED = "waiting", "running", "swapped", "finished"
STATUSES = (WAITING, RUNNING, SWAPPED, FINISHED)


@dataclass(slots=True)
class Sequence:
    """One sample of a request.

    Attributes:
        seq_id: its id in the block manager.
        tokens: prompt + generated token ids.
        prompt_len: tokens of the prompt.
        num_computed: tokens whose K/V are in the cache (0 after a recompute preemption).
        index: which of the request's ``n`` samples it is (its generator is seed + index).
        finish_reason: ``None`` while it generates; then why it stopped, as vLLM names it:
            ``"length"`` (``max_tokens``), ``"stop"`` (a stop token or string), ``"abort"``,
            ``"error"``.
    """

    seq_id: int
    tokens: list[int]
    prompt_len: int
    num_computed: int = 0
    index: int = 0
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def output(self) -> list[int]:
        """The tokens generated so far."""
        return self.tokens[self.prompt_len:]

    @property
    def num_generated(self) -> int:
        """How many tokens it has generated (``len(output)`` without building the list)."""
        return len(self.tokens) - self.prompt_len

    @property
    def num_pending(self) -> int:
        """Tokens the next forward pass must run for this sequence (1 while decoding)."""
        return len(self.tokens) - self.num_computed


@dataclass
class Request:
    """One prompt and its ``n`` sequences.

    Attributes:
        request_id: the caller's id (any hashable, unique among live requests).
        prompt: the prompt's token ids.
        n: samples; ``max_tokens``: tokens each generates.
        arrival: when it arrived (seconds on the engine's clock); ``order``: its arrival rank, the
            FCFS key (and the preemption rule's: the latest arrival goes first).
        seqs: its sequences; the *leader* (:attr:`leader`, the first one still generating) prefills
            the prompt; the others are made (and fork from it, sharing its blocks) once the prompt
            is computed.
        forked: whether all its sequences hold blocks (``False`` until the leader's prompt is in,
            and again after a preemption by recompute).
        status: waiting, running, swapped or finished.
        preemptions: times it was preempted.
        extra_key: what besides its tokens changes its K/V (an adapter's id, a cache salt); part of
            every block hash (prefix caching).  Sampling settings are not: they leave K/V alone.
        cache_hits: per admission (the first, then each after a recompute preemption), the prompt
            tokens found in the prefix cache.
        sampling_params: how its tokens are picked, carried to the runner in every chunk
            (``None``: greedy; the bookkeeping reads ``n``, ``max_tokens`` and ``stop_token_ids``).
        adapter_shift: its adapter's token shift (0: none), carried to the runner likewise.
        finish_reason, error: set when the whole request ends early (``"abort"``, or ``"error"``
            with the error's text); its samples' own reasons are on the sequences.
    """

    request_id: Hashable
    prompt: list[int]
    n: int = 1
    max_tokens: int = 16
    arrival: float = 0.0
    order: int = 0
    seqs: list[Sequence] = field(default_factory=list)
    status: str = WAITING
    preemptions: int = 0
    forked: bool = False
    extra_key: Hashable = None
    cache_hits: list[int] = field(default_factory=list)
    sampling_params: SamplingParams | None = None
    adapter_shift: int = 0
    finish_reason: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.prompt, (str, bytes)) or not hasattr(self.prompt, "__iter__"):
            raise PromptError(f"a prompt is a list of token ids, got {self.prompt!r:.60}")
        self.prompt = [count("a token id", t, 0, error=PromptError) for t in self.prompt]
        if not self.prompt:
            raise PromptError(f"request {self.request_id!r} has an empty prompt")
        self.arrival = real("arrival (s)", self.arrival)
        if type(self.adapter_shift) is not int:
            raise ConfigError(f"adapter_shift must be an int (token ids), got {self.adapter_shift!r}")
        self.n = count("n", self.n, 1)
        self.max_tokens = count("max_tokens", self.max_tokens, 1)
        p = self.sampling_params
        if p is not None and (not isinstance(p, SamplingParams) or (p.n, p.max_tokens) != (self.n, self.max_tokens)):
            raise ConfigError(f"request {self.request_id!r}: sampling_params must be a SamplingParams with "
                              f"n={self.n} and max_tokens={self.max_tokens}, got {p!r:.120}")

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def finished(self) -> bool:
        """Whether it has ended: every one of its ``n`` samples finished, or the request was ended
        early (aborted, or failed)."""
        return self.finish_reason is not None or (len(self.seqs) == self.n and all(s.finished for s in self.seqs))

    @property
    def leader(self) -> Sequence | None:
        """The sequence that prefills the prompt when the request is (re)admitted: the first sample
        still generating (sample 0 unless it finished before a sibling, as a tight token budget can
        make happen after a recompute); ``None`` before the request has sequences."""
        for s in self.seqs:
            if not s.finished:
                return s
        return self.seqs[0] if self.seqs else None

    @property
    def outputs(self) -> list[list[int]]:
        """The tokens each sample generated so far, in sample order."""
        return [s.output for s in sorted(self.seqs, key=lambda s: s.index)]

    def note_token(self, seq: Sequence) -> None:
        """``seq`` has just been given a sampled token: it finishes on a stop token id (``"stop"``)
        or at ``max_tokens`` (``"length"``), as vLLM's scheduler checks after each step."""
        p = self.sampling_params
        if p is not None and seq.tokens[-1] in p.stop_token_ids:
            seq.finish_reason = "stop"
        elif seq.num_generated >= self.max_tokens:
            seq.finish_reason = "length"

    def stored_tokens(self) -> int:
        """Tokens each sequence holds in the cache at its end: prompt + max_tokens - 1 (the last
        sampled token is returned, never fed back)."""
        return stored_tokens(self.prompt_len, self.max_tokens)

    # --- the rules of a group of samples ----------------------------------------------------
    @property
    def is_group(self) -> bool:
        """Whether it runs several samples (they share the prompt, forked from the leader)."""
        return self.n > 1 or len(self.seqs) > 1

    @property
    def prefill_target(self) -> int:
        """Tokens the leader prefills on admission: the prompt for a group (the samples then fork
        and each re-prefills only its own tokens), everything it holds for a lone sequence."""
        leader = self.leader
        return self.prompt_len if leader is None or self.is_group else len(leader.tokens)

    def holders(self) -> list[Sequence]:
        """The sequences holding blocks: every unfinished sample once forked, else the leader
        alone (finished samples have given theirs back)."""
        if self.forked:
            return [s for s in self.seqs if not s.finished]
        return [self.leader] if self.leader is not None and not self.leader.finished else []

    def lifetime_blocks(self, block_size: int) -> int:
        """Blocks its samples hold at their peak (:func:`~paged_kv.blocks.group_blocks_needed`)."""
        return group_blocks_needed(self.prompt_len, self.stored_tokens(), self.n, block_size)

    def admission_tokens(self) -> int:
        """The most tokens one admission of it allocates: a lone sequence re-prefills all it holds
        after a recompute preemption (up to :meth:`stored_tokens`); a group only its prompt."""
        return self.prompt_len if self.n > 1 else self.stored_tokens()

    def largest_prefill(self) -> int:
        """The longest prefill it can need in one piece (chunked prefill off): the admission's, or a
        resumed sample's own tokens (at most ``max_tokens - 1``)."""
        return max(self.prompt_len, self.max_tokens - 1) if self.n > 1 else self.stored_tokens()

    def plan(self, budget: int, chunked: bool) -> list[tuple[Sequence, int]]:
        """``(sequence, tokens)`` the next step may run for it within ``budget`` tokens: the leader's
        prefill target before the group forks, every unfinished sample's pending tokens after.
        With ``chunked`` off a sequence runs all its pending tokens or none."""
        if self.forked:
            seqs = [s for s in self.seqs if s.finish_reason is None]
        else:
            seqs = [self.leader]
            target = self.prefill_target
        out = []
        for seq in seqs:
            pending = (len(seq.tokens) if self.forked else target) - seq.num_computed
            if pending <= 0 or seq.finish_reason is not None:
                continue
            take = min(pending, budget) if chunked else (pending if pending <= budget else 0)
            if take:
                out.append((seq, take))
                budget -= take
        return out
