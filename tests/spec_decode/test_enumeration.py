"""Speculative decoding is lossless, exactly: on random small models (vocabulary 2-4, k 1-3,
Fraction distributions with zeros in q where p > 0 and the other way round) the enumerated output
distribution with speculation == the target's alone.  And the check can fail: four planted
mistakes (resample from p; accept with p/q as a weight, no min; accept with q/p; the bonus from
p_k), each making it unequal; forgetting the bonus is shown to cost tokens, not exactness."""

from fractions import Fraction as F

import pytest
from hypothesis import given, settings, strategies as st

from paged_kv.errors import ConfigError
from paged_kv.spec_decode import exact_output_distribution, rule_outcomes, speculative_distribution, speculative_sample
from paged_kv.spec_decode.sampling_rule import residual


def _dist(draw, vocab):
    """A Fraction distribution over ``vocab`` tokens, often with zeros (never all zero)."""
    w = draw(st.lists(st.sampled_from([0, 0, 1, 2, 3, 5]), min_size=vocab, max_size=vocab).filter(any))
    return [F(x, sum(w)) for x in w]


@st.composite
def models(draw):
    vocab, k = draw(st.integers(2, 4)), draw(st.integers(1, 3))
    depth = k + 1                                   # distinct tables up to this many context tokens
    tables = {"target": {}, "draft": {}}

    def model(name):
        table = tables[name]
        rows = [_dist(draw, vocab) for _ in range(3)]   # 3 rows, chosen by the context: zeros vary

        def f(ctx):
            key = (len(ctx) + sum(ctx)) % 3
            return table.setdefault(key, rows[key])
        return f
    return model("target"), model("draft"), vocab, k, depth


def _table_models():
    """The hand model: V = 2, the target (1/3, 2/3), the draft (1, 0) then (1/2, 1/2) by context."""
    target = lambda ctx: [F(1, 3), F(2, 3)]
    draft = lambda ctx: [F(1), F(0)] if len(ctx) % 2 == 0 else [F(1, 2), F(1, 2)]
    return target, draft


@settings(max_examples=30, deadline=None, derandomize=True)
@given(models(), st.sampled_from(["k+1", "2"]))
def test_speculation_leaves_the_target_distribution_unchanged_exactly(m, which):
    target, draft, vocab, k, _ = m
    horizon = k + 1 if which == "k+1" else 2
    spec, plain = exact_output_distribution(target, draft, (0,), k, horizon)
    assert spec == plain
    assert sum(spec.values()) == 1 and all(isinstance(v, F) for v in spec.values())


def test_the_hand_model():
    target, draft = _table_models()
    spec, plain = exact_output_distribution(target, draft, (), 2, 3)
    assert spec == plain == {t: F(2 ** sum(t), 27) for t in spec}
    assert len(plain) == 8


# --- planted mistakes: each breaks the equality ----------------------------------------------------
def resample_from_p(drafts, q, p, choose):
    """Mistake: a rejection resamples from p instead of norm(max(0, p - q))."""
    out = []
    for i, x in enumerate(drafts):
        a = min(F(1), p[i][x] / q[i][x])
        if choose([a, 1 - a]) != 0:
            return out + [choose(p[i])]
        out.append(x)
    return out + [choose(p[len(drafts)])]


def accept_without_min(drafts, q, p, choose):
    """Mistake: accept with weight p/q, no min(1, .).  (Compared with a uniform, ``u < p/q`` is
    ``u < min(1, p/q)``: the min matters where the ratio is used as a probability, as here, where
    a ratio above 1 gives the rejection a negative weight and the branches' mass is no longer 1.)"""
    out = []
    for i, x in enumerate(drafts):
        a = p[i][x] / q[i][x]
        if choose([a, 1 - a]) != 0:
            return out + [choose(residual(p[i], q[i]))]
        out.append(x)
    return out + [choose(p[len(drafts)])]


def inverted_ratio(drafts, q, p, choose):
    """Mistake: accept with min(1, q/p) instead of min(1, p/q)."""
    out = []
    for i, x in enumerate(drafts):
        a = min(F(1), q[i][x] / p[i][x]) if p[i][x] else F(1)
        if choose([a, 1 - a]) != 0:
            return out + [choose(residual(p[i], q[i]))]
        out.append(x)
    return out + [choose(p[len(drafts)])]


def forget_the_bonus(drafts, q, p, choose):
    """Not a mistake of exactness: all accepted, no bonus token from p_{k+1} (the next round's
    draft goes on instead)."""
    out = []
    for i, x in enumerate(drafts):
        a = min(F(1), p[i][x] / q[i][x])
        if choose([a, 1 - a]) != 0:
            r = residual(p[i], q[i])
            return out + [choose(r)]
        out.append(x)
    return out


def bonus_from_p_k(drafts, q, p, choose):
    """Mistake: all accepted, the bonus drawn from p_k (an off-by-one) instead of p_{k+1}."""
    out = []
    for i, x in enumerate(drafts):
        a = min(F(1), p[i][x] / q[i][x])
        if choose([a, 1 - a]) != 0:
            return out + [choose(residual(p[i], q[i]))]
        out.append(x)
    return out + [choose(p[len(drafts) - 1])]


@pytest.mark.parametrize("mistake", [resample_from_p, accept_without_min, inverted_ratio], ids=lambda f: f.__name__)
def test_a_planted_mistake_breaks_the_equality(mistake):
    target = lambda ctx: [F(1, 2), F(1, 2)]
    draft = lambda ctx: [F(3, 4), F(1, 4)]
    spec, plain = exact_output_distribution(target, draft, (), 1, 2, rule=mistake)
    assert spec != plain
    right, _ = exact_output_distribution(target, draft, (), 1, 2)
    assert right == plain


# A target whose next-token distribution depends on the context, so p_k != p_{k+1}.
_TARGET = lambda ctx: [F(1, 2), F(1, 2)] if len(ctx) % 2 == 0 else [F(1, 5), F(4, 5)]
_DRAFT = lambda ctx: [F(1, 2), F(1, 2)]


def test_the_bonus_from_the_wrong_position_breaks_the_equality():
    spec, plain = exact_output_distribution(_TARGET, _DRAFT, (), 1, 2, rule=bonus_from_p_k)
    assert spec != plain
    assert exact_output_distribution(_TARGET, _DRAFT, (), 1, 2)[0] == plain


def test_forgetting_the_bonus_costs_tokens_not_exactness():
    """Dropping the bonus leaves an exact sampler (the next round's first draft token is verified
    like any other), so the equality cannot catch it; what it loses is tokens per target pass:
    the expected length of one round falls by P(all accepted)."""
    spec, plain = exact_output_distribution(_TARGET, _DRAFT, (), 1, 2, rule=forget_the_bonus)
    assert spec == plain
    rounds = {rule: speculative_distribution(_TARGET, _DRAFT, (), 1, 1, rule) for rule in (forget_the_bonus,
                                                                                         speculative_sample)}
    assert rounds[forget_the_bonus] == rounds[speculative_sample]        # the first token: both right

    def mean_round(rule):
        out = rule_outcomes(lambda c: rule([c(_DRAFT(()))], [_DRAFT(())], [_TARGET(()), _TARGET((0,))], c))
        return sum(len(t) * w for t, w in out.items())
    assert mean_round(speculative_sample) - mean_round(forget_the_bonus) == 1   # here p1 = q1: always accepted


def test_the_enumeration_checks_its_arguments():
    target, draft = _table_models()
    with pytest.raises(ConfigError, match="k"):
        exact_output_distribution(target, draft, (), 0, 2)
    with pytest.raises(ConfigError, match="horizon"):
        exact_output_distribution(target, draft, (), 1, 0)
    with pytest.raises(ConfigError, match="sums to 1/2"):
        exact_output_distribution(lambda c: [F(1, 4), F(1, 4)], draft, (), 1, 2)
