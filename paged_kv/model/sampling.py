"""Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus), with seeds
the way serving engines define them.

A request's randomness is its own: each sequence draws from a ``torch.Generator`` seeded from
its request's ``seed`` and its index among the request's ``n`` samples (:func:`sample_generator`,
vLLM v1's rule: child ``i`` of a request with seed ``s`` samples with seed ``s + i``).  So a
request prints the same text alone or in any batch, on every backend and cache mode, and its
``n`` samples differ from each other and are reproducible.

Legend: B sequences, V vocabulary.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..errors import ConfigError, TensorError
from ..sampling_params import SamplingParams
from ..validate import count

__all__ = ["apply_penalties", "probabilities", "sample", "sample_generator"]


def sample_generator(seed: int, index: int = 0, device="cpu") -> torch.Generator:
    """The generator of sample ``index`` of a request seeded ``seed``: ``seed + index``, vLLM v1's
    rule for parallel sampling (``vllm/v1/engine/parallel_sampling.py``).

    Raises:
        ConfigError: a seed or index that is not an int >= 0.
    """
    seed, index = count("seed", seed, 0), count("index", index, 0)
    return torch.Generator(device=device).manual_seed(seed + index)


def apply_penalties(logits: torch.Tensor, outputs: Sequence[Sequence[int]], params: SamplingParams) -> torch.Tensor:
    """``logits [B, V]`` with the frequency penalty applied: row ``b``'s logit of token ``t`` minus
    ``params.frequency_penalty`` times the number of times ``t`` occurs in ``outputs[b]`` (the
    tokens that sequence generated so far).  Returns a new tensor; no penalty returns ``logits``."""
    if params.frequency_penalty == 0:
        return logits
    counts = torch.zeros_like(logits, dtype=torch.float32)
    for b, out in enumerate(outputs):
        if out:
            ids = torch.tensor(list(out), dtype=torch.long, device=logits.device)
            counts[b].index_add_(0, ids, torch.ones(len(ids), device=logits.device))
    return logits.float() - params.frequency_penalty * counts


def sample(logits: torch.Tensor, params: SamplingParams,
           generators: Sequence[torch.Generator] | None = None) -> torch.Tensor:
    """Pick one token per row of ``logits [B, V]``; returns int64 ``[B]``.

    Greedy: argmax (no generator needed).  Otherwise row ``b`` draws from ``generators[b]`` alone,
    so a sequence's draw never depends on which other rows share the batch.

    Raises:
        TensorError: ``logits`` is not 2-D.
        ConfigError: sampling without one generator per row.
    """
    if logits.dim() != 2:
        raise TensorError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    if params.greedy:
        return logits.argmax(dim=-1)
    if generators is None or len(generators) != logits.shape[0]:
        got = "none" if generators is None else len(generators)
        raise ConfigError(f"sampling needs one torch.Generator per row: {logits.shape[0]} rows, {got} given")
    scores = _scores(logits, params)
    probs = torch.softmax(scores, dim=-1).float().cpu()
    picks = [torch.multinomial(probs[b], 1, generator=g) for b, g in enumerate(generators)]
    return torch.cat(picks).to(logits.device)


def _scores(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[B, V]`` float64 scores whose softmax is the sampled distribution: temperature, then
    top-k, then top-p (``-inf`` for a token that cannot be drawn).  The one home of the rule, read
    by :func:`sample` and :func:`probabilities` alike, so the two cannot drift apart."""
    # (logits - max) / T in float64: the best score is 0 and the rest <= 0, so nothing overflows however
    # small T is; as T -> 0 every token but the argmax(es) goes to -inf: the greedy limit, reached
    # smoothly (a plain logits / T overflows float32 below T ~ 1e-37 and gives NaN).
    x = logits.double()
    scores = (x - x.max(dim=-1, keepdim=True).values) / params.temperature
    if params.top_k is not None and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p is not None and params.top_p < 1:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly before each token
        drop_sorted = before >= params.top_p
        drop_sorted[:, 0] = False             # the most likely token is always kept, whatever top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution :func:`sample` draws from: ``logits [..., V] -> [..., V]`` fp32, each row
    summing to 1 (fp32 rounding aside).

    Speculative sampling needs it explicitly: the rejection rule (Leviathan et al. 2023, Alg. 1;
    :func:`~paged_kv.model.rejection_sampler.rejection_sample`) compares the target's ``p`` with
    the draft's ``q`` token by token, and both must be the distributions the sampler really uses
    (after temperature, top-k, top-p), as vLLM v1 computes them before its ``RejectionSampler``.
    Greedy (``temperature == 0``) is the one-hot of the argmax (the first maximum, as
    ``torch.argmax`` breaks ties and so :func:`sample` does).  Penalties are not applied here, as
    :func:`sample` does not apply them: pass logits through :func:`apply_penalties` first.

    Raises:
        TensorError: ``logits`` not a floating tensor of at least one dimension, or with an empty
            vocabulary axis.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() < 1 or not logits.is_floating_point():
        raise TensorError(f"logits must be a float tensor [..., V], got {getattr(logits, 'shape', logits)!r}")
    V = logits.shape[-1]
    if V == 0:
        raise TensorError(f"logits have an empty vocabulary axis: shape {tuple(logits.shape)}")
    rows = logits.reshape(-1, V)                                                   # (B, V)
    if params.greedy:
        probs = torch.nn.functional.one_hot(rows.argmax(dim=-1), V).float()       # (B, V)
    else:
        probs = torch.softmax(_scores(rows, params), dim=-1).float()              # (B, V)
    return probs.reshape(logits.shape)
