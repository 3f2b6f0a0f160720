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
        preemptions: times it was preempted.
        last_token: clock time (s) of its latest token; max_itl: the longest wait between two of
            its consecutive tokens (s; inter-token latency, ITL, as vLLM's metrics call it), where a
            preemption shows as one long stall.
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
    last_token: float = math.nan
    max_itl: float = 0.0
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
    def latency(self) -> float:
        """End-to-end latency (s): finish minus arrival."""
        return self.finish - self.arrival
