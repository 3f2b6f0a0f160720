"""probabilities: the distribution sample() draws from, against the rule written out in plain Python
(sort, keep the top k, keep while the mass strictly before a token is below top_p, renormalise)
and against sample()'s own draws (chi-square)."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from paged_kv.errors import TensorError
from paged_kv.model import SamplingParams, probabilities, sample


def rule(logits, temperature, top_k=None, top_p=None):
    """The sampler's documented rule in plain Python floats (no ties in the logits)."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    if top_k is not None:
        order = order[:top_k]
    m = max(logits)
    w = {i: math.exp((logits[i] - m) / temperature) for i in order}
    if top_p is not None and top_p < 1:
        z, before, kept = sum(w.values()), 0.0, []
        for i in order:
            if kept and before >= top_p:
                break
            kept.append(i)
            before += w[i] / z
        w = {i: w[i] for i in kept}
    z = sum(w.values())
    return [w.get(i, 0.0) / z for i in range(len(logits))]


distinct_logits = st.lists(st.integers(-40, 40), min_size=2, max_size=7, unique=True).map(
    lambda xs: [x / 8 for x in xs])


@settings(max_examples=60, derandomize=True, deadline=None)
@given(distinct_logits, st.sampled_from([0.3, 1.0, 2.5]), st.one_of(st.none(), st.integers(1, 7)),
       st.one_of(st.none(), st.sampled_from([0.2, 0.5, 0.9, 1.0])))
def test_equals_the_rule(logits, t, top_k, top_p):
    got = probabilities(torch.tensor(logits), SamplingParams(t, top_k=top_k, top_p=top_p, seed=0))
    assert got.tolist() == pytest.approx(rule(logits, t, top_k, top_p), abs=1e-6)
    assert float(got.sum()) == pytest.approx(1.0, abs=1e-6)


def test_greedy_is_one_hot_of_the_first_argmax():
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0], [3.0, 1.0, 0.0, 3.0]])
    got = probabilities(logits, SamplingParams(0.0))
    assert got.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]
    assert got.argmax(-1).tolist() == sample(logits, SamplingParams(0.0)).tolist()


def test_any_leading_shape():
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    p = probabilities(logits, SamplingParams(0.7, top_k=3, seed=0))
    assert p.shape == (2, 3, 5)
    torch.testing.assert_close(p.reshape(6, 5), probabilities(logits.reshape(6, 5), SamplingParams(0.7, top_k=3, seed=0)))
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 3))


def test_matches_the_samplers_draws():
    """20,000 draws of sample() against probabilities(): a chi-square test at alpha = 0.001 (df <= 4;
    critical value 18.47), over the tokens probabilities() gives mass; no draw outside them."""
    logits = torch.tensor([1.2, 0.3, -0.5, 2.0, 0.9, -2.0])
    params = SamplingParams(0.8, top_k=5, top_p=0.95, seed=0)
    p = probabilities(logits, params)
    N = 20_000
    g = [torch.Generator().manual_seed(7)] * N
    draws = sample(logits.repeat(N, 1), params, g)
    counts = torch.bincount(draws, minlength=6).double()
    support = p > 0
    assert counts[~support].sum() == 0
    expected = N * p[support].double()
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    assert int(support.sum()) - 1 <= 4 and chi2 < 18.47


@pytest.mark.parametrize("bad", [torch.tensor(1.0), torch.zeros(3, 0), torch.tensor([1, 2]), [1.0, 2.0]])
def test_bad_shapes(bad):
    with pytest.raises(TensorError):
        probabilities(bad, SamplingParams(1.0, seed=0))
