"""A runner without a model: each step's time from a timing model, its tokens 0 or from a token source.

:class:`TimingRunner` takes a :class:`~paged_kv.scheduling.SchedulerOutput` and returns a
:class:`~paged_kv.engine.runner_output.ModelRunnerOutput`, as the tiny model's
:class:`~paged_kv.engine.runner.ModelRunner` does, so the same :class:`~paged_kv.engine.LLMEngine`
loop serves a 13B model on a modelled GPU (the paper's Figure 12).  Its clocks:
:class:`~paged_kv.memory.decode_cost.IterationTime` for a step, :class:`SwapTime` for a swap
(here, re-exported by :mod:`paged_kv.engine.serving`).  It needs neither torch nor numpy: the
browser build's serving panel runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, PagedKVError
from ..scheduling import SchedulerOutput
from ..validate import count, real
from .runner_output import ModelRunnerOutput

__all__ = ["COPY_CALL_S", "PCIE4_X16_BYTES_PER_S", "SwapTime", "TimingRunner"]

PCIE4_X16_BYTES_PER_S = 25e9     # an assumption: PCIe 4.0 x16 is 32 GB/s per direction, ~25 GB/s achieved
COPY_CALL_S = 10e-6              # an assumption: fixed cost of one small cudaMemcpyAsync (launch + DMA set-up)


@dataclass(frozen=True)
class SwapTime:
    """Seconds to move ``num_blocks`` blocks one way between GPU and CPU memory.

    ``copies * per_copy_s + bytes / bytes_per_s``, where ``bytes = num_blocks * block_size *
    kv_bytes_per_token``.  ``per_block_copies=True`` models vLLM v0's ``swap_blocks``, one
    ``cudaMemcpyAsync`` per block, per layer, for K and for V (``copies = 2 * L * num_blocks``): with
    small blocks the fixed cost per copy dominates, which is why the paper (§7.3, Fig. 19) finds
    swapping slow at small block sizes.  ``False`` models this book's
    :func:`kernels.cache_ops.swap_blocks`, which gathers the blocks and copies once per layer and
    tensor (``copies = 2 * L``).

    The two hardware figures are assumptions, not measurements: ``bytes_per_s`` (default 25 GB/s, a
    PCIe 4.0 x16 link, 32 GB/s per direction in theory) and ``per_copy_s`` (default 10 us).
    """

    kv_bytes_per_token: int
    num_layers: int
    bytes_per_s: float = PCIE4_X16_BYTES_PER_S
    per_copy_s: float = COPY_CALL_S
    per_block_copies: bool = True

    def __post_init__(self) -> None:
        count("kv_bytes_per_token", self.kv_bytes_per_token)
        count("num_layers", self.num_layers)
        for label in ("bytes_per_s", "per_copy_s"):
            real(label, getattr(self, label), 0.0, low_open=label == "bytes_per_s")

    def __call__(self, num_blocks: int, block_size: int) -> float:
        copies = 2 * self.num_layers * (num_blocks if self.per_block_copies else 1)
        return copies * self.per_copy_s + num_blocks * block_size * self.kv_bytes_per_token / self.bytes_per_s


class TimingRunner:
    """Runs scheduled steps on no model at all: the step's time comes from a timing model, and
    every sampled token is 0 (a stand-in: only lengths matter for memory and time), or, given a
    token source, the token it picks.

    Args:
        iteration_time: seconds per step from the tokens it reads and prefills,
            :class:`paged_kv.sim.IterationTime` (e.g. ``ServingSetup.iteration_time()``: OPT-13B
            on an A100 by roofline, the paper's set-up), called as
            ``iteration_time(kv_tokens, prefill_tokens)``.  A re-prefill after a recompute
            preemption is charged here, as prefill tokens.
        swap_time: seconds to swap blocks, called as ``swap_time(num_blocks, block_size)`` for the
            blocks moved out and in during the step (:class:`paged_kv.engine.serving.SwapTime`);
            ``None``: swaps are free.
        block_size: tokens per block (what ``swap_time`` is told).
        next_token: a token source (:data:`~paged_kv.engine.token_source.TokenSource`), called as
            ``next_token(seq_id, tokens)`` with the sequence's prompt and generated ids so far (a
            tuple) for each token sampled, whatever the request's sampling parameters (a token
            source is greedy); ``None``: every token is 0.  A fresh ``n``-sample leader asks it
            once and gives its ``n`` samples that token.

    The tokens so far, without reading the scheduler: the runner keeps, per sequence, the tokens
    it was given at each position: a request's prompt when it is admitted
    (``SchedulerOutput.prompt_token_ids``, which also covers what a prefix-cache hit skips), then
    every chunk's ``token_ids`` at its positions (a sampled token comes back as the next chunk).
    A sequence forked from its leader starts from its request's prompt.  The record goes when the
    request is named in ``finished_req_ids``; it is kept only with a token source.

    Speculative decoding: a verify chunk's drafts are accepted while each equals the token the
    source gives after the tokens before it (greedy verification; without a source, while each
    is the stand-in 0), plus that next token; the step is charged its draft tokens as prefill-like
    work (``iteration_time(kv_tokens, prefill_tokens + num_draft_tokens)``): each runs through the
    weights as a prompt token does.

    Raises:
        ConfigError: a timing model or token source that is not callable.
        PagedKVError: (:meth:`execute`) a chunk whose context the runner was never given (a step
            of a request admitted before this runner ran), or a step run twice or out of order.
    """

    def __init__(self, iteration_time, swap_time=None, block_size: int = 16, next_token=None) -> None:
        for label, f in (("iteration_time", iteration_time), ("swap_time", swap_time), ("next_token", next_token)):
            if f is not None and not callable(f) or (label == "iteration_time" and f is None):
                raise ConfigError(f"{label} must be callable, got {f!r}")
        self.iteration_time, self.swap_time, self.block_size = iteration_time, swap_time, block_size
        self.next_token = next_token
        self._prompts: dict = {}                  # request id -> its prompt token ids
        self._tokens: dict[int, list[int]] = {}   # seq id -> the tokens given so far, by position
        self._seqs: dict = {}                     # request id -> its seq ids seen
        self._last_step = 0

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """The step's sampled tokens and its modelled time (s); see the class docstring."""
        if self.next_token is None:
            sampled = {c.seq_id: _verified(c.spec_token_ids, lambda j: 0) if c.spec_token_ids else [0] * c.num_samples
                       for c in out.chunks if c.sample}
        else:
            sampled = self._pick(out)
        seconds = float(self.iteration_time(out.kv_tokens, out.prefill_tokens + out.num_draft_tokens))
        if self.swap_time is not None:
            for mapping in (out.swap_out, out.swap_in):
                if mapping:
                    seconds += float(self.swap_time(len(mapping), self.block_size))
        return ModelRunnerOutput(sampled, seconds)

    def _pick(self, out: SchedulerOutput) -> dict[int, list[int]]:
        """Record the step's tokens, then ask the token source for each sampling chunk's token."""
        if not isinstance(out, SchedulerOutput) or out.step <= self._last_step:
            raise PagedKVError(f"a runner with a token source runs each scheduled step once, in order: step "
                               f"{getattr(out, 'step', out)!r:.40} after step {self._last_step}")
        self._last_step = out.step
        for rid in out.finished_req_ids:
            self._prompts.pop(rid, None)
            for seq in self._seqs.pop(rid, ()):
                self._tokens.pop(seq, None)
        self._prompts.update(out.prompt_token_ids)
        sampled = {}
        for c in out.chunks:
            if c.seq_id not in self._tokens:
                self._tokens[c.seq_id] = list(self._prompts.get(c.request_id, ()))
                self._seqs.setdefault(c.request_id, []).append(c.seq_id)
            toks = self._tokens[c.seq_id]
            if len(toks) < c.start:
                raise PagedKVError(f"sequence {c.seq_id} (request {c.request_id!r}) runs from position {c.start}, "
                                   f"but this runner was given only its first {len(toks)} tokens")
            toks[c.start:c.seq_len] = c.token_ids
            if c.spec_token_ids:               # position start + j: after the fed token and j drafts
                sampled[c.seq_id] = _verified(c.spec_token_ids,
                                              lambda j: self.next_token(c.seq_id, tuple(toks[:c.start + 1 + j])))
            elif c.sample:
                token = self.next_token(c.seq_id, tuple(toks[:c.seq_len]))
                sampled[c.seq_id] = [token] * c.num_samples
        return sampled


def _verified(drafts, target) -> list[int]:
    """Greedy verification, asking ``target(j)`` (the token after ``j`` drafts) only as far as
    needed: the drafts kept while each equals it, then the first token that differs or follows.
    The rule is :func:`~paged_kv.spec_decode.accept_greedy`'s, asked lazily so that the token
    source only ever sees real prefixes of the sequence (never one holding a rejected draft)."""
    out = []
    for j, d in enumerate(drafts):
        out.append(target(j))
        if out[-1] != d:
            return out
    out.append(target(len(drafts)))
    return out
