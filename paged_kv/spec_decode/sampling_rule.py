"""The speculative-sampling rule over explicit probability lists, exact with ``fractions.Fraction``.

Follows Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative Decoding"
(ICML 2023), §2.3 and Algorithm 1, and Chen et al., "Accelerating Large Language Model Decoding with
Speculative Sampling" (2023), Algorithm 2; vLLM v1's ``RejectionSampler``
(``vllm/v1/sample/rejection_sampler.py``) is the same rule over tensors (ours:
:mod:`paged_kv.model.rejection_sampler`).

Given draft tokens ``x_1..x_k``, the draft's distributions ``q_1..q_k`` they were drawn from and the
target's ``p_1..p_{k+1}`` at the same positions: accept ``x_i`` with probability
``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection draw the correction from
``norm(max(0, p_i - q_i))`` and stop; if all ``k`` are accepted draw the bonus token from ``p_{k+1}``.
The tokens it returns are distributed exactly as the target's: Leviathan et al. prove it in their
Appendix A.1, Chen et al. state it as their Theorem 1 (modified rejection sampling recovers the
target distribution).

Why the randomness is a *chooser* (``weights -> index``), not a uniform: one function is the rule,
and a chooser can be a seeded random draw (:func:`uniform_chooser` over ``random.Random().random``)
or a branch taken by an exact enumerator (:func:`rule_outcomes` replays the rule once per branch and
multiplies the branch weights), so the rule that samples is the rule that is proved exact, not a
second copy of it.  An acceptance is ``choose([a, 1 - a]) == 0``, i.e. ``u < a`` for a uniform ``u``.

Pure Python: no torch, no numpy (the browser build runs it).
"""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Rational, Real
from typing import Callable, Sequence

from ..errors import ConfigError

__all__ = ["FLOAT_TOLERANCE", "Chooser", "check_distribution", "residual", "rule_outcomes",
           "speculative_sample", "uniform_chooser"]

FLOAT_TOLERANCE = 1e-6
"""How far from 1 a distribution with a float in it may sum: float32 softmax rows miss 1 by
~1e-7 times V; Fractions (and ints) must sum to exactly 1."""

Chooser = Callable[[Sequence], int]
"""``choose(weights) -> index``: an index drawn with probability ``weights[i] / sum(weights)``,
never one of weight 0."""


def check_distribution(name: str, dist: Sequence, size: int | None = None) -> list:
    """``dist`` as a list, checked: every entry a finite real >= 0, the sum 1 (exactly for
    Fractions and ints, within :data:`FLOAT_TOLERANCE` when any entry is a float), ``size``
    entries if given.

    Raises:
        ConfigError: naming ``name`` and the bad entry, sum or length.
    """
    values = list(dist)
    if size is not None and len(values) != size:
        raise ConfigError(f"{name} has {len(values)} entries, expected {size} (the vocabulary)")
    if not values:
        raise ConfigError(f"{name} is empty")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"{name}[{i}] = {v!r} is not a probability (a finite real >= 0)")
    total = sum(values)
    exact = all(isinstance(v, Rational) for v in values)
    if (total != 1) if exact else abs(total - 1) > FLOAT_TOLERANCE:
        raise ConfigError(f"{name} sums to {total}, not 1" + ("" if exact else f" (within {FLOAT_TOLERANCE})"))
    return values


def residual(p: Sequence, q: Sequence) -> list:
    """``max(0, p - q)``, unnormalised (the chooser normalises): the correction distribution of
    Leviathan et al. §2.3, ``p'(x) = norm(max(0, p(x) - q(x)))``.  All zero only when ``p == q``,
    where a rejection has probability 0."""
    return [max(pi - qi, 0) for pi, qi in zip(p, q)]


def speculative_sample(draft_tokens: Sequence[int], draft_probs: Sequence[Sequence], target_probs: Sequence[Sequence],
                       choose: Chooser) -> list[int]:
    """One verification step: the accepted draft tokens, then the correction or bonus token
    (a list of 1..k+1 token ids).

    Args:
        draft_tokens: ``x_1..x_k``, k >= 0.
        draft_probs: ``q_1..q_k``, the draft's distribution each ``x_i`` was drawn from.
        target_probs: ``p_1..p_{k+1}``, the target's at the same positions and one past the last.
        choose: the random source (:data:`Chooser`).

    Raises:
        ConfigError: ``k`` draft distributions or ``k + 1`` target ones missing, a distribution
            that is not one (:func:`check_distribution`), vocabularies of different sizes, a draft
            token outside the vocabulary or with ``q_i(x_i) = 0`` (the draft could not have drawn it).
    """
    k = len(draft_tokens)
    if len(draft_probs) != k or len(target_probs) != k + 1:
        raise ConfigError(f"{k} draft tokens need {k} draft and {k + 1} target distributions, "
                          f"got {len(draft_probs)} and {len(target_probs)}")
    vocab = len(target_probs[0])
    p = [check_distribution(f"target_probs[{i}]", d, vocab) for i, d in enumerate(target_probs)]
    q = [check_distribution(f"draft_probs[{i}]", d, vocab) for i, d in enumerate(draft_probs)]
    out = []
    for i, x in enumerate(draft_tokens):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < vocab:
            raise ConfigError(f"draft_tokens[{i}] = {x!r} is not a token id in [0, {vocab})")
        if q[i][x] == 0:
            raise ConfigError(f"draft_tokens[{i}] = {x} has draft probability 0: the draft could not have proposed it")
    for i, x in enumerate(draft_tokens):
        ratio = p[i][x] / q[i][x]
        accept = ratio if ratio < 1 else 1                         # min(1, p/q)
        if choose([accept, 1 - accept]) != 0:                     # rejected: u >= min(1, p/q)
            r = residual(p[i], q[i])
            out.append(choose(r if sum(r) > 0 else p[i]))         # float round-off only: p == q
            return out
        out.append(x)
    out.append(choose(p[k]))                                       # all accepted: the bonus token
    return out


def uniform_chooser(uniform: Callable[[], float]) -> Chooser:
    """A chooser from a source of uniforms in [0, 1) (``random.Random(seed).random``, or a list's
    ``iter(us).__next__`` to inject them): the inverse CDF, the first index whose cumulative weight
    exceeds ``u * total``, so a weight-0 index is never chosen."""
    def choose(weights: Sequence) -> int:
        total = sum(weights)
        target = uniform() * total
        cumulative, last = 0, None
        for i, w in enumerate(weights):
            if w > 0:
                cumulative += w
                last = i
                if target < cumulative:
                    return i
        if last is None:
            raise ConfigError(f"nothing to choose: every weight is 0 in {list(weights)}")
        return last                                                # u * total rounded up to the total
    return choose


def rule_outcomes(rule: Callable[[Chooser], list[int]]) -> dict[tuple[int, ...], Fraction]:
    """The exact distribution of ``rule(choose)``'s result, by running it once per branch.

    Each call replays a path of earlier choices and, at the first new choice point, takes one
    branch; the path's weight is the product of ``weights[i] / sum(weights)`` along it.  Branches
    of weight 0 are never taken.  ``rule`` must be deterministic given its choices.
    """
    outcomes: dict[tuple[int, ...], Fraction] = {}
    stack: list[tuple[int, ...]] = [()]
    while stack:
        path = stack.pop()
        taken: list[int] = []
        weight = [Fraction(1)]

        def choose(weights: Sequence) -> int:
            total = sum(weights)
            depth = len(taken)
            if depth < len(path):
                i = path[depth]
            else:
                live = [j for j, w in enumerate(weights) if w > 0]
                i = live[0]
                stack.extend(tuple(taken) + (j,) for j in live[1:])
            taken.append(i)
            weight[0] *= Fraction(weights[i]) / Fraction(total)
            return i

        result = tuple(rule(choose))
        outcomes[result] = outcomes.get(result, Fraction(0)) + weight[0]
    return outcomes
