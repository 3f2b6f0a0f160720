"""Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus).

Randomness always comes from an explicit ``torch.Generator``, so a seeded run of the book
prints the same text every time, on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError, TensorError
from ..validate import count, real


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token.

    Attributes:
        temperature: ``0`` means greedy (argmax); otherwise logits are divided by it (> 0).
        top_k: keep only the k most likely tokens (``None``: all).
        top_p: keep the smallest set of tokens whose probability reaches ``top_p``
            (Holtzman et al. 2020), in ``(0, 1]``.

    Raises:
        ConfigError: negative temperature, ``top_k < 1`` or ``top_p`` outside ``(0, 1]``.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        fix = lambda name, value: object.__setattr__(self, name, value)  # frozen dataclass
        fix("temperature", real("temperature (0 = greedy)", self.temperature, 0.0))
        if self.top_k is not None:
            fix("top_k", count("top_k (or None)", self.top_k, 1))
        if self.top_p is not None:
            fix("top_p", real("top_p (or None)", self.top_p, 0.0, 1.0, low_open=True))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick one token per row of ``logits [B, V]``; returns int64 ``[B]``.

    Raises ``TensorError`` if ``logits`` is not 2-D, ``ConfigError`` if sampling needs a
    generator and none was given (so that no run is silently unseeded).
    """
    if logits.dim() != 2:
        raise TensorError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    if params.greedy:
        return logits.argmax(dim=-1)
    if generator is None:
        raise ConfigError("sampling with temperature > 0 needs an explicit torch.Generator")
    scores = logits.float() / params.temperature
    if params.top_k is not None and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p is not None and params.top_p < 1:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly before each token
        drop_sorted = before >= params.top_p  # the first token is always kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)
