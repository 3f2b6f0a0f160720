"""What a caller gets back for a request: its tokens, text and latencies (vLLM's ``RequestOutput``).

An output follows its request live: it reads the scheduler's :class:`~paged_kv.scheduling.Request`,
so the tokens are never copied and never stale; the engine stamps the clock times as tokens come.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable

from ..scheduling import Request

__all__ = ["RequestOutput"]


@dataclass
class RequestOutput:
    """A request's state (vLLM's ``RequestOutput``, trimmed); it follows the request live.

    Attributes:
        request_id: its id; ``prompt``: its prompt as given (text or token ids).
        finished: (property) whether every sample has its ``max_tokens``, read from the request.
        arrival, first_token, finish: clock times (s) it arrived, produced its first token, finished
            (``nan`` until then; stamped by :meth:`LLMEngine.step`, so a step driven by hand through
            the scheduler and the runner leaves them ``nan``).
        first_scheduled: clock time (s) it was first admitted, when its first step began (vLLM's
            ``scheduled_ts``; ``nan`` until then); :attr:`queue_time` is the wait before it.
        preemptions: times it was preempted; ``preempted_steps``: the step of each preemption.
        arrival_step: steps the engine had run when the request was added.
        token_times, token_steps: the clock time (s) and the number of each step in which it
            produced tokens (one token per running sample; with ``n`` samples a step is counted
            once).  Their gaps are its inter-token latencies (:attr:`itl`); a preemption after the
            first token shows as one long gap, one before it as a longer TTFT.
        token_ids: (property) per sample, the tokens generated so far; ``text``: the same decoded
            (``None`` without a tokenizer), see :attr:`text`.
        finish_reason: (property) per sample, ``None`` while it generates, then ``"length"``,
            ``"stop"``, ``"abort"`` or ``"error"`` (vLLM's reasons); ``error``: the error's text.
        stop_at: per sample index, where its text ends (characters) when a stop string ended it.
        stop_token: sample indices ended by one of ``stop_token_ids`` whose token's text is left
            out of :attr:`text` (the token stays in ``token_ids``), as vLLM's detokenizer does
            unless ``include_stop_str_in_output``.
    """

    request_id: Hashable
    prompt: object
    request: Request = field(repr=False)
    tokenizer: object = field(default=None, repr=False)
    arrival: float = 0.0
    first_token: float = math.nan
    finish: float = math.nan
    first_scheduled: float = math.nan
    preemptions: int = 0
    arrival_step: int = 0
    preempted_steps: list = field(default_factory=list)
    token_times: list = field(default_factory=list)
    token_steps: list = field(default_factory=list)
    stop_at: dict = field(default_factory=dict)
    stop_token: set = field(default_factory=set)

    @property
    def finish_reason(self) -> list[str | None]:
        req = self.request
        reasons = [s.finish_reason for s in sorted(req.seqs, key=lambda s: s.index)]
        return reasons + [req.finish_reason] * (req.n - len(reasons))    # samples never forked

    @property
    def error(self) -> str | None:
        return self.request.error

    @property
    def finished(self) -> bool:
        return self.request.finished

    @property
    def token_ids(self) -> list[list[int]]:
        outs = self.request.outputs
        return outs + [[] for _ in range(self.request.n - len(outs))]   # samples not forked yet

    @property
    def text(self) -> list[str] | None:
        """Per sample, the text of its tokens so far (``None`` without a tokenizer), cut before the
        stop string that ended it (after it, with ``include_stop_str_in_output``).

        While a sample runs, its tokens are decoded incrementally (the tokenizer's
        ``decode(ids, final=False)``): with one token per byte, a sample can stop a step in the
        middle of a character ("é" is 2 tokens, an emoji 4), and those bytes are held back instead
        of showing as "\ufffd" that the next step would take back.  So every running snapshot's
        text is a prefix of the final one.  With stop strings (and without
        ``include_stop_str_in_output``) a running sample also holds back its last
        ``max(len(s) for s in stop) - 1`` characters, which may be the start of a stop string that
        the final text leaves out (vLLM's detokenizer holds back the same).  Once a sample has
        finished (its :attr:`finish_reason`) it decodes with ``final=True``: an unfinished
        character at the very end then shows as "\ufffd", since no byte will complete it.  The
        tokenizer must accept ``final`` (as :class:`~paged_kv.model.ByteTokenizer` does).
        """
        if self.tokenizer is None:
            return None
        p = self.request.sampling_params
        hold = 0
        if p is not None and p.stop and not p.include_stop_str_in_output:
            hold = max(len(s) for s in p.stop) - 1
        texts = []
        for i, (ids, reason) in enumerate(zip(self.token_ids, self.finish_reason)):
            done = self.finished or reason is not None
            text = self.tokenizer.decode(ids[:-1] if i in self.stop_token else ids, final=done)
            if i in self.stop_at:
                text = text[:self.stop_at[i]]
            elif not done and hold:
                text = text[:max(0, len(text) - hold)]
            texts.append(text)
        return texts

    @property
    def cached_tokens(self) -> list[int]:
        """Per admission of the request (the first, then after each recompute preemption), the
        prompt tokens its prefix-cache hit saved (empty with caching off)."""
        return list(self.request.cache_hits)

    @property
    def queue_time(self) -> float:
        """Time waiting before its first admission (s): first admission minus arrival (vLLM's
        ``vllm:request_queue_time_seconds``).  A wait after a preemption is not counted here (it
        shows in :attr:`ttft` or :attr:`max_itl`)."""
        return self.first_scheduled - self.arrival

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
    def last_token(self) -> float:
        """Clock time (s) of its latest token (``nan`` before the first)."""
        return self.token_times[-1] if self.token_times else math.nan

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies (s): every gap between two consecutive steps that gave it tokens,
        ``len(token_times) - 1`` of them (vLLM's ITL is each such gap, its benchmark reports
        their distribution over all requests: :func:`paged_kv.engine.metrics.inter_token_latencies`)."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def itl_steps(self) -> list[int]:
        """The same gaps counted in engine steps (a running request that gets a token every step has
        gaps of 1; a preemption shows as more).  Unlike the clock, steps do not depend on the machine."""
        t = self.token_steps
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def max_itl(self) -> float:
        """The longest of :attr:`itl` (s); 0 with fewer than two token steps."""
        return max(self.itl, default=0.0)

    @property
    def ttft_steps(self) -> int | None:
        """Steps from its arrival to the step of its first token (1: the step after it was added
        produced it); ``None`` before the first token."""
        return self.token_steps[0] - self.arrival_step if self.token_steps else None

    @property
    def latency(self) -> float:
        """End-to-end latency (s): finish minus arrival."""
        return self.finish - self.arrival
