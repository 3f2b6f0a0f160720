"""The exact output distribution of speculative decoding on small explicit models, against the
target's alone: the check that the acceptance rule is lossless (Leviathan et al. ICML 2023,
Appendix A.1; Chen et al. 2023, Theorem 1), with nothing sampled.

A model here is a callable ``context -> probabilities``: a tuple of token ids to a list of ``V``
Fractions (the next token's distribution).  What is enumerated, for ``horizon`` output tokens:

* with speculation: rounds until ``horizon`` tokens are out; in each round every draft path
  ``x_1..x_k`` (each ``x_i`` drawn from ``draft(context + x_<i)``), every acceptance event
  (``x_i`` accepted with ``min(1, p_i(x_i) / q_i(x_i))``) and every correction or bonus token, each
  branch with its exact weight; the round's tokens join the context; the output is cut to
  ``horizon`` tokens (a round may overshoot);
* without: the target's own tokens, one at a time.

Both are run by :func:`~paged_kv.spec_decode.sampling_rule.rule_outcomes`, which replays one
process once per branch, so the enumerated rule is :func:`speculative_sample` itself (or the
``rule`` given, for the planted mistakes of the tests).  Branches: at most ``V**k`` draft paths times
``k + 1`` acceptance events times ``V`` last tokens per round; keep ``V``, ``k`` and ``horizon``
small (V <= 4, k <= 3, horizon <= k + 1: at most a second or so each; rounds are composed by
dynamic programming over the output so far, so the cost grows with the outputs, not the runs).

Pure Python: no torch, no numpy.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Callable, Sequence

from ..validate import count
from .sampling_rule import Chooser, rule_outcomes, speculative_sample

__all__ = ["Model", "Rule", "exact_output_distribution", "speculative_distribution", "target_distribution"]

Model = Callable[[tuple], Sequence]
"""``context (tuple of token ids) -> the next token's probabilities (V Fractions)``."""
Rule = Callable[[Sequence[int], Sequence[Sequence], Sequence[Sequence], Chooser], list]
"""The signature of :func:`speculative_sample`."""


def speculative_distribution(target: Model, draft: Model, context: Sequence[int], k: int, horizon: int,
                             rule: Rule = speculative_sample) -> dict[tuple[int, ...], Fraction]:
    """The exact distribution of the first ``horizon`` tokens decoded with ``k`` draft tokens a
    round, verified by ``rule``.

    Raises:
        ConfigError: ``k`` or ``horizon`` not an int >= 1; a model's distribution that is not one
            (from ``rule``).
    """
    k, horizon = count("k", k), count("horizon", horizon)

    def one_round(ctx: tuple) -> dict[tuple[int, ...], Fraction]:
        def run(choose: Chooser) -> list[int]:
            drafts, q = [], []
            for _ in range(k):
                dist = list(draft(ctx + tuple(drafts)))
                q.append(dist)
                drafts.append(choose(dist))
            p = [list(target(ctx + tuple(drafts[:i]))) for i in range(k + 1)]
            return rule(drafts, q, p, choose)
        return rule_outcomes(run)

    # Rounds composed by dynamic programming over the output so far (a round's outcomes depend on
    # the context alone), instead of replaying whole runs: the branches multiply per round.
    result: dict[tuple[int, ...], Fraction] = {}
    frontier: dict[tuple[int, ...], Fraction] = {(): Fraction(1)}
    while frontier:
        nxt: dict[tuple[int, ...], Fraction] = {}
        for out, weight in frontier.items():
            for step, w in one_round(tuple(context) + out).items():
                longer = out + step
                into = result if len(longer) >= horizon else nxt
                key = longer[:horizon]
                into[key] = into.get(key, Fraction(0)) + weight * w
        frontier = nxt
    return result


def target_distribution(target: Model, context: Sequence[int], horizon: int) -> dict[tuple[int, ...], Fraction]:
    """The exact distribution of the target's own first ``horizon`` tokens.

    Raises:
        ConfigError: ``horizon`` not an int >= 1.
    """
    horizon = count("horizon", horizon)

    def run(choose: Chooser) -> list[int]:
        ctx = tuple(context)
        for _ in range(horizon):
            ctx += (choose(list(target(ctx))),)
        return list(ctx[len(context):])

    return rule_outcomes(run)


def exact_output_distribution(target: Model, draft: Model, context: Sequence[int], k: int, horizon: int,
                              rule: Rule = speculative_sample) -> tuple[dict, dict]:
    """``(with speculation, without)``: :func:`speculative_distribution` and
    :func:`target_distribution`, dicts from ``horizon``-token tuples to Fractions (the branches of
    weight 0 absent).  The rule's correctness (Chen et al.'s Theorem 1) says they are
    equal, ``==`` on Fractions."""
    return (speculative_distribution(target, draft, context, k, horizon, rule),
            target_distribution(target, context, horizon))
