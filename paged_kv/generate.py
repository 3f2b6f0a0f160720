"""``generate``: autoregressive decoding of a batch of prompts, with or without a KV cache.

Cache modes (each chapter adds one):

* ``"recompute"`` (chapter 1): every step runs the model over the *whole* prefix again.  Step t
  costs O(t) FLOPs per layer for the projections and O(t^2) for attention.
* ``"contiguous"`` (chapter 2): a :class:`~paged_kv.caches.ContiguousKVCache`; one prefill over
  the prompts, then each step feeds only the newest token and reads the cached K/V.
* ``"paged"`` (chapter 5): the same through block tables.

All modes must produce the same greedy tokens; the tests check it token for token.
Prompts of different lengths are batched right-padded; each sequence generates exactly
``max_new_tokens`` tokens (the byte-level model has no end-of-sequence token).
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .attention import AttentionMetadata, check_backend
from .caches import ContiguousKVCache
from .errors import ConfigError, PromptError
from .model import TinyLlama
from .sampling import SamplingParams, sample

CACHE_MODES = ("recompute", "contiguous", "paged")


@dataclass
class GenerationResult:
    """What :func:`generate` returns.

    Attributes:
        prompts: the prompt token ids.
        tokens: the generated token ids of each sequence (``max_new_tokens`` each).
        step_seconds: wall time of each step (step 0 is the prefill), in seconds.
        logits: ``[steps, B, V]`` fp32 logits that chose each token, if ``keep_logits``.
        cache_bytes: bytes of KV storage the run allocated (0 for recompute).
    """

    prompts: list[list[int]]
    tokens: list[list[int]]
    step_seconds: list[float] = field(default_factory=list)
    logits: torch.Tensor | None = None
    cache_bytes: int = 0

    def texts(self, tokenizer, include_prompt: bool = True) -> list[str]:
        """Decode each sequence (prompt + completion, or completion only) to text."""
        return [tokenizer.decode((p if include_prompt else []) + t) for p, t in zip(self.prompts, self.tokens)]


def _right_pad(seqs: Sequence[Sequence[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T_max]`` int64 ids (padded with 0) and ``[B]`` int32 lengths."""
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    ids = torch.zeros(len(seqs), int(lens.max()), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(list(s), dtype=torch.long)
    return ids.to(device), lens.to(device)


def _last_logits(logits: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Pick ``logits[b, lens[b] - 1]`` -> ``[B, V]``."""
    return logits[torch.arange(logits.shape[0], device=logits.device), lens.long() - 1]


class RecomputeDecoder:
    """Chapter 1: no cache; every step re-runs the model over prompt + generated tokens."""

    cache_bytes = 0

    def __init__(self, model: TinyLlama, backend: str) -> None:
        self.model, self.backend = model, backend
        self.seqs: list[list[int]] = []

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        self.seqs = [list(p) for p in prompts]
        return self._run()

    def decode(self, new_tokens: list[int]) -> torch.Tensor:
        for s, t in zip(self.seqs, new_tokens):
            s.append(t)
        return self._run()

    def _run(self) -> torch.Tensor:
        ids, lens = _right_pad(self.seqs, self.model.device)
        meta = AttentionMetadata.for_prefill(lens, ids.shape[1])
        return _last_logits(self.model(ids, meta, None, self.backend), lens)


class ContiguousDecoder:
    """Chapter 2: one ``ContiguousKVCache`` row of ``max_len`` slots per sequence."""

    def __init__(self, model: TinyLlama, backend: str, batch_size: int, max_len: int) -> None:
        self.model, self.backend = model, backend
        self.cache = ContiguousKVCache(model.cfg, batch_size, max_len, dtype=model.dtype, device=model.device)
        self.cache_bytes = self.cache.nbytes
        self.seq_lens = torch.zeros(batch_size, dtype=torch.int32, device=model.device)

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        ids, lens = _right_pad(prompts, self.model.device)
        meta = AttentionMetadata.for_prefill(lens, ids.shape[1])
        self.seq_lens = lens.clone()
        return _last_logits(self.model(ids, meta, self.cache, self.backend), lens)

    def decode(self, new_tokens: list[int]) -> torch.Tensor:
        self.seq_lens = self.seq_lens + 1
        ids = torch.tensor(new_tokens, dtype=torch.long, device=self.model.device)[:, None]
        meta = AttentionMetadata.for_decode(self.seq_lens)
        return self.model(ids, meta, self.cache, self.backend)[:, 0]


def make_decoder(model: TinyLlama, cache: str, backend: str, prompts: list[list[int]], max_new_tokens: int,
                 block_size: int = 16):
    """The decoder object for a cache mode (a small strategy object with prefill/decode).

    ``block_size`` (tokens per block) is used by ``cache="paged"`` only.
    """
    if cache == "recompute":
        return RecomputeDecoder(model, backend)
    if cache == "contiguous":
        return ContiguousDecoder(model, backend, len(prompts), max(map(len, prompts)) + max_new_tokens)
    if cache == "paged":
        from .paged_decoding import PagedDecoder  # chapter 5

        return PagedDecoder(model, backend, prompts, max_new_tokens, block_size=block_size)
    raise ConfigError(f"cache must be one of {CACHE_MODES}, got {cache!r}")


def _token_id(t) -> int:
    """An integer token id (Python, NumPy or 0-d integer tensor); floats and bools raise TypeError."""
    if isinstance(t, bool):
        raise TypeError("bool is not a token id")
    return operator.index(t)


def _check_prompts(model: TinyLlama, prompts, max_new_tokens: int) -> list[list[int]]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise PromptError(f"prompts must be a non-empty list of token-id lists, got {prompts!r:.80}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            raise PromptError(f"prompt {i} is a str; encode it first (tokenizer.encode), got {p!r:.40}")
        try:
            p = [_token_id(t) for t in p]
        except TypeError:
            raise PromptError(f"prompt {i} must hold integer token ids, got {list(p)[:8]!r}") from None
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


@torch.no_grad()
def generate(model: TinyLlama, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             cache: str = "contiguous", sampling: SamplingParams | None = None,
             generator: torch.Generator | None = None, backend: str = "torch",
             keep_logits: bool = False,
             on_step: Callable[[int, object], None] | None = None,
             block_size: int = 16) -> GenerationResult:
    """Decode ``max_new_tokens`` tokens after each prompt.

    Args:
        model: a :class:`TinyLlama` (eval mode).
        prompts: B lists of token ids (lengths may differ).
        max_new_tokens: tokens generated per sequence, >= 1.
        cache: ``"recompute"``, ``"contiguous"`` or ``"paged"``.
        sampling: default greedy; sampling needs ``generator``.
        backend: ``"torch"`` or ``"triton"`` attention.
        keep_logits: return the ``[steps, B, V]`` logits as well.
        on_step: called as ``on_step(step, decoder)`` after each step (widgets use it).
        block_size: tokens per block for ``cache="paged"`` (vLLM's default, 16); ignored otherwise.

    Raises:
        PromptError: empty prompt list or prompt, bad token ids, too long for ``max_seq_len``.
        ConfigError: unknown cache mode or backend, ``max_new_tokens < 1``.
    """
    prompts = _check_prompts(model, prompts, max_new_tokens)
    check_backend(backend)
    sampling = SamplingParams() if sampling is None else sampling
    if not isinstance(sampling, SamplingParams):
        raise ConfigError(f"sampling must be a SamplingParams, got {type(sampling).__name__}: {sampling!r:.60}")
    if not sampling.greedy and generator is None:  # fail before any work, not at step 0
        raise ConfigError("sampling with temperature > 0 needs an explicit torch.Generator")
    decoder = make_decoder(model, cache, backend, prompts, max_new_tokens, block_size)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    tokens: list[list[int]] = [[] for _ in prompts]
    kept, times = [], []
    for step in range(max_new_tokens):
        t0 = time.perf_counter()
        logits = decoder.prefill(prompts) if step == 0 else decoder.decode([t[-1] for t in tokens])
        nxt = sample(logits, sampling, generator).tolist()
        sync()
        times.append(time.perf_counter() - t0)
        for t, n in zip(tokens, nxt):
            t.append(int(n))
        if keep_logits:
            kept.append(logits.detach().cpu())
        if on_step is not None:
            on_step(step, decoder)
    return GenerationResult(prompts, tokens, times, torch.stack(kept) if keep_logits else None,
                            decoder.cache_bytes)
