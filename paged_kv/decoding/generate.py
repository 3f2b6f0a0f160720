"""``generate``: autoregressive decoding of a batch of prompts, with or without a KV cache.

Cache modes (each chapter adds one; the decoders live in :mod:`paged_kv.decoding.decoders`):

* ``"recompute"`` (chapter 1): every step runs the model over the *whole* prefix again.
* ``"contiguous"`` (chapter 2): a :class:`~paged_kv.storage.ContiguousKVCache`; one prefill over
  the prompts, then each step feeds only the newest token and reads the cached K/V.
* ``"paged"`` (chapter 5): the same through block tables.

All modes must produce the same tokens; the tests check it token for token.  Prompts of
different lengths are batched right-padded; each sequence generates exactly ``max_new_tokens``
tokens (the byte-level model has no end-of-sequence token).  A prompt is one *request*; with
``SamplingParams(n=...)`` it yields ``n`` sequences (its samples), each drawing from its own
seeded generator (:func:`paged_kv.model.sample_generator`), so a request's text does not depend
on its batch mates.
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..defaults import BLOCK_SIZE
from ..errors import ConfigError, PromptError
from ..model.attention import check_backend
from ..model.llama import TinyLlama
from ..model.sampling import SamplingParams, apply_penalties, sample, sample_generator
from ..validate import count
from .decoders import make_decoder

__all__ = ["GenerationResult", "check_prompts", "generate"]


@dataclass
class GenerationResult:
    """What :func:`generate` returns.

    One entry per *sequence*: sequence ``b`` is sample ``sample_index[b]`` of request (prompt)
    ``request_index[b]``; with ``n = 1`` sequences and prompts coincide.

    Attributes:
        prompts: the prompt token ids of each sequence.
        tokens: the generated token ids of each sequence (``max_new_tokens`` each).
        step_seconds: wall time of each step (step 0 is the prefill), in seconds.
        logits: ``[steps, B, V]`` fp32 logits that chose each token, if ``keep_logits``.
        cache_bytes: bytes of KV storage the run allocated (0 for recompute).
        request_index, sample_index: which request and which of its samples each sequence is.
    """

    prompts: list[list[int]]
    tokens: list[list[int]]
    step_seconds: list[float] = field(default_factory=list)
    logits: torch.Tensor | None = None
    cache_bytes: int = 0
    request_index: list[int] = field(default_factory=list)
    sample_index: list[int] = field(default_factory=list)

    def texts(self, tokenizer, include_prompt: bool = True) -> list[str]:
        """Decode each sequence (prompt + completion, or completion only) to text."""
        return [tokenizer.decode((p if include_prompt else []) + t) for p, t in zip(self.prompts, self.tokens)]


def _token_id(t) -> int:
    """An integer token id (Python, NumPy or 0-d integer tensor); floats and bools raise TypeError."""
    if isinstance(t, bool):
        raise TypeError("bool is not a token id")
    return operator.index(t)


def check_prompts(model: TinyLlama, prompts, max_new_tokens: int) -> list[list[int]]:
    """``prompts`` as lists of Python ints, checked against ``model``, and ``max_new_tokens``.

    Raises:
        PromptError: a bad prompt list or prompt (the message says why), or a prompt +
            ``max_new_tokens`` longer than ``max_seq_len``.
        ConfigError: a bad ``max_new_tokens``.
    """
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise PromptError(f"prompts must be a non-empty list of token-id lists, got {prompts!r:.80}")
    max_new_tokens = count("max_new_tokens", max_new_tokens, 1)
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            raise PromptError(f"prompt {i} is a str; encode it first (tokenizer.encode), got {p!r:.40}")
        try:
            p = [_token_id(t) for t in p]
        except TypeError:
            hint = " (one prompt? wrap it in a list: [ids])" if isinstance(p, int) else ""
            raise PromptError(f"prompt {i} must be a list of integer token ids, got {p!r:.40}{hint}") from None
        if not p:
            raise PromptError(f"prompt {i} is empty; a prompt needs at least one token")
        bad = [t for t in p if not 0 <= t < model.cfg.vocab_size]
        if bad:
            raise PromptError(f"prompt {i} has token ids outside 0..{model.cfg.vocab_size - 1}: {bad[:5]}")
        if len(p) + max_new_tokens > model.cfg.max_seq_len:
            raise PromptError(
                f"prompt {i} has {len(p)} tokens; with max_new_tokens={max_new_tokens} it needs "
                f"{len(p) + max_new_tokens} positions, more than max_seq_len={model.cfg.max_seq_len}")
        out.append(p)
    return out


def _per_request(sampling, num_requests: int) -> list[SamplingParams]:
    """One SamplingParams per request (a single one applies to all); all with the same ``n``."""
    if sampling is None:
        sampling = SamplingParams()
    params = [sampling] * num_requests if isinstance(sampling, SamplingParams) else list(sampling)
    for i, sp in enumerate(params):
        if not isinstance(sp, SamplingParams):
            raise ConfigError(f"sampling must be a SamplingParams or one per prompt, got {type(sp).__name__} "
                              f"at {i}: {sp!r:.60}")
    if len(params) != num_requests:
        raise ConfigError(f"sampling: {len(params)} SamplingParams for {num_requests} prompts")
    if len({sp.n for sp in params}) > 1:
        raise ConfigError(f"every request of one batch must ask for the same n, got {[sp.n for sp in params]}")
    return params


@torch.no_grad()
def generate(model: TinyLlama, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             cache: str = "contiguous", sampling: SamplingParams | Sequence[SamplingParams] | None = None,
             backend: str = "torch", keep_logits: bool = False,
             on_step: Callable[[int, object], None] | None = None,
             block_size: int = BLOCK_SIZE) -> GenerationResult:
    """Decode ``max_new_tokens`` tokens after each prompt (``n`` samples each, see ``sampling``).

    Args:
        model: a :class:`TinyLlama` (eval mode).
        prompts: R lists of token ids (lengths may differ); each is one request.
        max_new_tokens: tokens generated per sequence, >= 1.
        cache: ``"recompute"``, ``"contiguous"`` or ``"paged"`` (samples share the prompt's blocks).
        sampling: one :class:`SamplingParams` for every request, or one per request (all with the
            same ``n``); default greedy.  Sample ``j`` of a request seeded ``s`` draws from
            ``sample_generator(s, j)``.
        backend: ``"torch"`` or ``"triton"`` attention.
        keep_logits: return the ``[steps, R * n, V]`` logits as well.
        on_step: called as ``on_step(step, decoder)`` after each step (widgets use it).
        block_size: tokens per block for ``cache="paged"`` (default :data:`~paged_kv.defaults.BLOCK_SIZE`,
            vLLM's 16); ignored otherwise.

    Raises:
        PromptError: as :func:`check_prompts`.
        ConfigError: a bad argument (the message names it), or requests that ask for different ``n``.
    """
    prompts = check_prompts(model, prompts, max_new_tokens)
    max_new_tokens = count("max_new_tokens", max_new_tokens, 1)
    check_backend(backend)
    params = _per_request(sampling, len(prompts))
    n = params[0].n
    decoder = make_decoder(model, cache, backend, prompts, max_new_tokens, block_size, n=n)
    rows = [(r, j) for r in range(len(prompts)) for j in range(n)]              # sequence b = r * n + j
    generators = [None if params[r].greedy else sample_generator(params[r].seed, j) for r, j in rows]
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    tokens: list[list[int]] = [[] for _ in rows]
    kept, times = [], []
    for step in range(max_new_tokens):
        t0 = time.perf_counter()
        logits = decoder.prefill(prompts) if step == 0 else decoder.decode([t[-1] for t in tokens])
        nxt = []
        for r, sp in enumerate(params):         # each request's rows with its own parameters
            rs = slice(r * n, (r + 1) * n)
            scores = apply_penalties(logits[rs], tokens[rs], sp)     # the frequency penalty, if any
            nxt += sample(scores, sp, None if sp.greedy else generators[rs]).tolist()
        sync()
        times.append(time.perf_counter() - t0)
        for t, x in zip(tokens, nxt):
            t.append(int(x))
        if keep_logits:
            kept.append(logits.detach().cpu())
        if on_step is not None:
            on_step(step, decoder)
    return GenerationResult([prompts[r] for r, _ in rows], tokens, times,
                            torch.stack(kept) if keep_logits else None, decoder.cache_bytes,
                            [r for r, _ in rows], [j for _, j in rows])
