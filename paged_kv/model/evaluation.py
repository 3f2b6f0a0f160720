"""Held-out loss of a model by token position: is it true to its context length?

A model trained on windows of ``W`` tokens has never been asked to predict past position ``W - 1``;
if its config admits longer sequences, the loss there tells. :func:`loss_by_position` measures the
mean next-token cross-entropy (nats per token; one token = one byte for the tiny model) in bands
of positions over non-overlapping windows of held-out text, the table the model card prints
(``scripts/position_loss.py``). It follows the held-out measure of nanoGPT's char-level example,
split by position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..validate import count

__all__ = ["PositionBand", "loss_by_position"]


@dataclass(frozen=True)
class PositionBand:
    """The mean loss over positions ``start .. end - 1`` (tokens) of every window.

    Attributes:
        start, end: the band's first position and one past its last (tokens, from 0).
        loss: mean cross-entropy of predicting token ``p + 1`` from tokens ``0..p``, nats.
        predictions: how many predictions the mean is over (windows x positions in the band).
    """

    start: int
    end: int
    loss: float
    predictions: int


@torch.no_grad()
def loss_by_position(model, data: torch.Tensor, window: int, band: int = 64,
                     max_windows: int = 400, batch: int = 50) -> list[PositionBand]:
    """Mean next-token loss per band of ``band`` positions over windows of ``window`` tokens.

    Window ``i`` is ``data[i * window : (i + 1) * window]`` and predicts the token after each of
    its positions (so it reads ``window + 1`` tokens); at most ``max_windows`` windows, one
    forward pass over ``batch`` of them at a time, whole sequences from position 0, no cache.

    Args:
        model: a :class:`~paged_kv.model.TinyLlama` (anything ``model(ids [B, T]) -> logits
            [B, T, V]``), in eval mode.
        data: token ids, a 1-D integer tensor on the model's device.
        window: tokens per window; at most ``model.cfg.max_seq_len`` (the forward pass refuses
            positions past it).
        band: positions per band; must divide ``window``.

    Returns:
        One :class:`PositionBand` per band, in order of position.

    Raises:
        ConfigError: ``band`` does not divide ``window``, a count is not a positive int, or
            ``data`` is not 1-D or too short for one window.
        PromptError: from the forward pass, a ``window`` past ``model.cfg.max_seq_len``.
    """
    window, band = count("window (tokens)", window, 1), count("band (tokens)", band, 1)
    max_windows, batch = count("max_windows", max_windows, 1), count("batch", batch, 1)
    if window % band:
        raise ConfigError(f"band {band} must divide window {window}")
    if not isinstance(data, torch.Tensor) or data.dim() != 1:
        raise ConfigError(f"data must be a 1-D tensor of token ids, got {getattr(data, 'shape', data)!r}")
    n = min(max_windows, (len(data) - 1) // window)
    if n < 1:
        raise ConfigError(f"data has {len(data):,} tokens, fewer than one window of {window} + 1")
    starts = torch.arange(n, device=data.device) * window
    offsets = torch.arange(window, device=data.device)
    total = torch.zeros(window, dtype=torch.float64)
    for i in range(0, n, batch):
        idx = starts[i:i + batch, None] + offsets                            # [b, W]
        logits = model(data[idx])                                           # [b, W, V]
        nll = F.cross_entropy(logits.transpose(1, 2).float(), data[idx + 1], reduction="none")  # [b, W]
        total += nll.double().sum(0).cpu()
    per_band = total.view(window // band, band).sum(1)
    return [PositionBand(j * band, (j + 1) * band, float(per_band[j]) / (n * band), n * band)
            for j in range(window // band)]
