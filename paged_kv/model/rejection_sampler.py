"""The speculative-sampling rule over tensors, for the engine: one request's ``k`` draft tokens
verified against the target's probabilities in one pass.

The rule of :func:`paged_kv.spec_decode.sampling_rule.speculative_sample` (Leviathan et al. ICML
2023 §2.3, Algorithm 1, proved exact in their Appendix A.1; Chen et al. 2023 Algorithm 2 and
Theorem 1), as vLLM v1's ``RejectionSampler`` applies it (``vllm/v1/sample/rejection_sampler.py``):
accept ``x_i`` while ``u_i < min(1, p_i(x_i) / q_i(x_i))``, at the first rejection draw from
``norm(max(0, p_i - q_i))``, else draw the bonus token from ``p_{k+1}``.  An n-gram
(prompt-lookup) draft has no distribution: its ``q`` is one-hot on its token, as vLLM treats it
(``draft_probs=None``), so a draft token is accepted with probability ``p_i(x_i)`` and a rejection
draws from ``p_i`` with ``x_i`` removed.

Why uniforms consumed in order, not ``torch.multinomial``: the ``j``-th random number the pure
rule asks for is ``uniforms[j]`` here too (acceptances first, then the one correction or bonus
draw, by the inverse CDF), so a test hands both the same uniforms and compares token for token.
``k + 1`` uniforms always suffice, and a generator draws exactly ``k + 1`` per call.

Legend: k draft tokens, V vocabulary.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError, TensorError
from ..spec_decode.sampling_rule import FLOAT_TOLERANCE

__all__ = ["rejection_sample"]


def _pick(weights: torch.Tensor, u: torch.Tensor) -> int:
    """The inverse CDF of ``weights [V]`` (>= 0, unnormalised) at ``u``: the first index whose
    cumulative weight exceeds ``u * total``; never an index of weight 0."""
    cumulative = torch.cumsum(weights, 0)                          # [V]
    i = int(torch.searchsorted(cumulative, u * cumulative[-1], right=True))
    if i >= len(weights) or weights[i] <= 0:                      # u * total rounded up to the total
        i = int(torch.nonzero(weights > 0).max())
    return i


def rejection_sample(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, draft_token_ids,
                     generator: torch.Generator | None = None, uniforms: torch.Tensor | None = None) -> list[int]:
    """The accepted draft tokens, then the correction or bonus token: a list of 1..k+1 ids.

    Args:
        target_probs: ``[k+1, V]``, the target's distribution at each draft position and one past.
        draft_probs: ``[k, V]``, the draft's; ``None`` for an n-gram draft (one-hot on its tokens).
        draft_token_ids: ``[k]`` ints (a list or a tensor).
        generator: draws the ``k + 1`` uniforms (on CPU), unless ``uniforms`` is given.
        uniforms: ``[k+1]`` in [0, 1), used in order as the pure rule asks for them.

    Raises:
        TensorError: a tensor of the wrong rank or shape.
        ConfigError: a row that is not a distribution (negative, or a sum off 1 by more than
            ``FLOAT_TOLERANCE``), a draft token outside ``[0, V)`` or of draft probability 0, or
            neither ``generator`` nor ``uniforms``.
    """
    if target_probs.dim() != 2:
        raise TensorError(f"target_probs must be [k+1, V], got shape {tuple(target_probs.shape)}")
    k, vocab = target_probs.shape[0] - 1, target_probs.shape[1]
    ids = [int(t) for t in (draft_token_ids.tolist() if torch.is_tensor(draft_token_ids) else draft_token_ids)]
    if len(ids) != k:
        raise TensorError(f"target_probs {tuple(target_probs.shape)} is [k+1, V] for k = {k}, "
                          f"but {len(ids)} draft tokens were given")
    p = target_probs.double()                                      # [k+1, V]
    if draft_probs is None:                                        # n-gram: one-hot q
        q = torch.zeros(k, vocab, dtype=torch.float64)             # [k, V]
        if k:
            q[torch.arange(k), torch.tensor([min(max(t, 0), vocab - 1) for t in ids])] = 1.0
    else:
        if tuple(draft_probs.shape) != (k, vocab):
            raise TensorError(f"draft_probs must be [k, V] = {(k, vocab)}, got {tuple(draft_probs.shape)}")
        q = draft_probs.double()
    for name, rows in (("target_probs", p), ("draft_probs", q)):
        if rows.numel() and (bool((rows < 0).any()) or not bool(torch.isfinite(rows).all())):
            raise ConfigError(f"{name} has an entry that is not a probability (a finite real >= 0)")
        off = (rows.sum(1) - 1).abs()
        if rows.numel() and float(off.max()) > FLOAT_TOLERANCE:
            raise ConfigError(f"{name}[{int(off.argmax())}] sums to {float(rows[int(off.argmax())].sum())}, not 1 "
                              f"(within {FLOAT_TOLERANCE})")
    for i, t in enumerate(ids):
        if not 0 <= t < vocab:
            raise ConfigError(f"draft_token_ids[{i}] = {t} is not a token id in [0, {vocab})")
        if q[i, t] <= 0:
            raise ConfigError(f"draft_token_ids[{i}] = {t} has draft probability 0: the draft could not have proposed it")
    if uniforms is None:
        if generator is None:
            raise ConfigError("rejection_sample needs a generator or the uniforms")
        uniforms = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    u = uniforms.double()
    if tuple(u.shape) != (k + 1,):
        raise TensorError(f"uniforms must be [k+1] = [{k + 1}], got {tuple(u.shape)}")
    if k:
        idx = torch.tensor(ids)
        ratio = p[torch.arange(k), idx] / q[torch.arange(k), idx]  # [k] p_i(x_i) / q_i(x_i)
        rejected = torch.nonzero(u[:k] >= torch.clamp(ratio, max=1.0))   # u_i >= min(1, p/q)
        if len(rejected):
            r = int(rejected[0])
            residual = torch.clamp(p[r] - q[r], min=0.0)           # [V] max(0, p - q)
            return ids[:r] + [_pick(residual if float(residual.sum()) > 0 else p[r], u[r + 1])]
    return ids + [_pick(p[k], u[k])]
