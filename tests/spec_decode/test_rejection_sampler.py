"""The tensor rule: token for token the pure rule given the same uniforms; by many draws the
enumerated distribution (tiny vocabulary); on the tiny model, a chi-square goodness-of-fit test
of the speculative first token against the target's, with its power against a planted wrong rule.

No scipy here: the chi-square critical value is the Wilson-Hilferty approximation
``df * (1 - 2/(9 df) + z sqrt(2/(9 df)))**3`` (within 1% of the exact quantile for df >= 3)."""

import math
import random

import pytest
import torch

from paged_kv.errors import ConfigError, TensorError
from paged_kv.model import load_tiny_model
from paged_kv.spec_decode import rule_outcomes, speculative_sample, uniform_chooser
from paged_kv.model.rejection_sampler import rejection_sample

Z_ALPHA = {0.01: 2.3263, 0.001: 3.0902}          # the standard normal's upper quantiles


def chi2_critical(df: int, alpha: float) -> float:
    z, a = Z_ALPHA[alpha], 2 / (9 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def chi2_stat(counts, expected) -> float:
    return sum((c - e) ** 2 / e for c, e in zip(counts, expected))


def _random_case(rng: random.Random, k: int, vocab: int, zeros: bool):
    def dist():
        w = [rng.choice([0.0, 1.0, 2.0, 3.0]) if zeros else rng.random() + 0.01 for _ in range(vocab)]
        w[rng.randrange(vocab)] += 1.0
        return [x / sum(w) for x in w]
    q = [dist() for _ in range(k)]
    drafts = [rng.choice([i for i in range(vocab) if q[i_][i] > 0]) for i_ in range(k)]
    return drafts, q, [dist() for _ in range(k + 1)]


@pytest.mark.parametrize("zeros", [False, True])
def test_agrees_with_the_pure_rule_given_the_same_uniforms(zeros):
    rng = random.Random(0)
    for _ in range(300):
        k, vocab = rng.randint(0, 4), rng.randint(2, 6)
        drafts, q, p = _random_case(rng, k, vocab, zeros)
        us = [rng.random() for _ in range(k + 1)]
        pure = speculative_sample(drafts, q, p, uniform_chooser(iter(us).__next__))
        tensor = rejection_sample(torch.tensor(p, dtype=torch.float64), torch.tensor(q, dtype=torch.float64).reshape(k, vocab),
                                  drafts, uniforms=torch.tensor(us, dtype=torch.float64))
        assert tensor == pure, (drafts, q, p, us)


def test_an_ngram_draft_is_one_hot():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]], dtype=torch.float64)
    one_hot = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    for u in ([0.1, 0.5], [0.29, 0.9], [0.31, 0.0], [0.31, 0.99]):
        u = torch.tensor(u, dtype=torch.float64)
        assert rejection_sample(p, None, [1], uniforms=u) == rejection_sample(p, one_hot, [1], uniforms=u)
    assert rejection_sample(p, None, [1], uniforms=torch.tensor([0.31, 0.99], dtype=torch.float64)) == [2]   # x removed


def test_the_draws_match_the_enumeration():
    """V = 3, k = 2, one round's whole output (1..3 tokens), float64: 6000 rounds with the draft
    tokens drawn from q by the same generator; chi-square at alpha = 0.001 over the outcomes."""
    p = [[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]]
    q = [[0.2, 0.2, 0.6], [0.0, 0.5, 0.5]]
    def one_round(c):
        drafts = [c(q[0]), c(q[1])]                 # here q does not depend on the context
        return speculative_sample(drafts, q, p, c)
    exact = rule_outcomes(one_round)
    g = torch.Generator().manual_seed(1234)
    P, Q = torch.tensor(p, dtype=torch.float64), torch.tensor(q, dtype=torch.float64)
    n, counts = 6_000, dict.fromkeys(exact, 0)
    for _ in range(n):
        drafts = [int(torch.multinomial(Q[i], 1, generator=g)) for i in range(2)]
        counts[tuple(rejection_sample(P, Q, drafts, g))] += 1
    outcomes = list(exact)
    stat = chi2_stat([counts[o] for o in outcomes], [n * float(exact[o]) for o in outcomes])
    assert len(counts) == len(exact) and stat < chi2_critical(len(outcomes) - 1, 0.001)


def _wrong_rule_first_token(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The planted mistake's first-token distribution: accept min(p, q), resample from p (not
    norm(p - q)+): min(p, q) + (1 - sum min(p, q)) p."""
    both = torch.minimum(p, q)
    return both + (1 - both.sum()) * p


N, ALPHA, TOP, REPLICATES = 3000, 0.01, 4, 400


def test_the_tiny_model_first_token_fits_the_target():
    """Target p: the tiny model's next byte after ``ROMEO:\\n`` (temperature 1); draft q: the same
    logits at temperature 3 (k = 1; the first token depends on p_1 and q_1 alone, so p_2 is p
    again).  N = 3000 speculative first tokens, seeds 0..; categories: p's top 4 bytes and "other";
    chi-square at alpha = 0.01.  Power against the planted rule (resample from p), by 400 simulated
    replicates of N draws from its exact first-token distribution: >= 0.9 (asserted)."""
    model, tok = load_tiny_model()
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode("ROMEO:\n")]))[0, -1].double()      # [V]
    p, q = torch.softmax(logits, -1), torch.softmax(logits / 3, -1)                 # [V]
    top = torch.topk(p, TOP).indices.tolist()

    def bins(dist):
        b = [float(dist[t]) for t in top]
        return b + [1 - sum(b)]
    critical = chi2_critical(TOP, ALPHA)
    g = torch.Generator().manual_seed(0)
    target = torch.stack([p, p])                                                     # [k+1, V]
    counts = [0] * (TOP + 1)
    for _ in range(N):
        x = int(torch.multinomial(q, 1, generator=g))
        first = rejection_sample(target, q[None], [x], g)[0]
        counts[top.index(first) if first in top else TOP] += 1
    stat = chi2_stat(counts, [N * e for e in bins(p)])
    assert stat < critical, (stat, critical, counts)

    # power: how often the same test rejects the planted rule with the same N
    wrong = torch.tensor(bins(_wrong_rule_first_token(p, q)))
    gp = torch.Generator().manual_seed(1)
    rejected = 0
    for _ in range(REPLICATES):
        c = torch.bincount(torch.multinomial(wrong, N, replacement=True, generator=gp), minlength=TOP + 1)
        rejected += chi2_stat(c.tolist(), [N * e for e in bins(p)]) >= critical
    power = rejected / REPLICATES
    assert power >= 0.9, power


def test_the_tensor_rule_checks_its_arguments():
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    q = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(TensorError, match=r"target_probs must be \[k\+1, V\]"):
        rejection_sample(p[0], q, [0], g)
    with pytest.raises(TensorError, match="but 2 draft tokens were given"):
        rejection_sample(p, q, [0, 1], g)
    with pytest.raises(TensorError, match=r"draft_probs must be \[k, V\] = \(1, 2\)"):
        rejection_sample(p, q[0], [0], g)
    with pytest.raises(ConfigError, match=r"draft_token_ids\[0\] = 1 has draft probability 0"):
        rejection_sample(p, q, [1], g)
    with pytest.raises(ConfigError, match=r"draft_token_ids\[0\] = 5 is not a token id"):
        rejection_sample(p, q, [5], g)
    with pytest.raises(ConfigError, match=r"target_probs\[1\] sums to 1.5"):
        rejection_sample(torch.tensor([[0.5, 0.5], [1.0, 0.5]]), q, [0], g)
    with pytest.raises(ConfigError, match="needs a generator or the uniforms"):
        rejection_sample(p, q, [0])
