"""Every value SamplingParams accepts works, through sample() and through the engine; the ones that
could not work are refused by the constructor, naming the value.

The domain is drawn at its edges (subnormal and huge temperatures, top_p down to the smallest
float, seeds up to 2**64 - n, penalties at +-2) rather than at typical values: a new-user trial
found tiny temperatures, tiny top_p and large seeds accepted and then failing inside a step.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from paged_kv.engine import EngineConfig, LLMEngine
from paged_kv.errors import ConfigError
from paged_kv.model import sample, sample_generator
from paged_kv.sampling_params import SamplingParams

TINY = 5e-324                                   # the smallest positive float

temperatures = st.one_of(st.just(0.0), st.sampled_from([TINY, 1e-300, 1e-38, 1e-5, 1.0, 1e30, 1e308]),
                         st.floats(TINY, 1e308, allow_subnormal=True))
top_ps = st.one_of(st.none(), st.sampled_from([TINY, 1e-300, 0.5, 1.0]), st.floats(TINY, 1.0))
top_ks = st.one_of(st.none(), st.sampled_from([1, 2, 10**9]), st.integers(1, 300))
penalties = st.one_of(st.sampled_from([-2.0, 0.0, 2.0]), st.floats(-2.0, 2.0))


@st.composite
def accepted_params(draw, max_tokens=st.integers(1, 4)):
    n = draw(st.integers(1, 3))
    t = draw(temperatures)
    assume(not (t == 0 and n > 1))             # refused by design: n identical greedy samples
    seed = draw(st.one_of(st.sampled_from([0, 2**64 - n]), st.integers(0, 2**64 - n)))
    return SamplingParams(temperature=t, top_k=draw(top_ks), top_p=draw(top_ps), seed=None if t == 0 else seed,
                          n=n, max_tokens=draw(max_tokens), frequency_penalty=draw(penalties))


@settings(max_examples=300, deadline=None)
@given(p=accepted_params(), logits=st.lists(st.floats(-1e4, 1e4), min_size=2, max_size=40), ties=st.booleans(),
       masked=st.booleans())
def test_sample_draws_a_valid_token_for_every_accepted_params(p, logits, ties, masked):
    x = torch.tensor([logits], dtype=torch.float32)
    if ties:
        x[0, -1] = x.max()                      # two argmaxes
    if masked:
        x[0, 0] = -math.inf                     # a token ruled out already
    gens = None if p.greedy else [sample_generator(p.seed, p.n - 1)]
    tok = int(sample(x, p, gens)[0])
    assert 0 <= tok < x.shape[1] and x[0, tok] > -math.inf
    if p.greedy or p.temperature < 1e-30:       # at T -> 0 the draw is an argmax
        assert x[0, tok] == x.max()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=accepted_params(max_tokens=st.integers(1, 3)))
def test_the_engine_serves_every_accepted_params(small_model, p):
    e = LLMEngine(small_model, EngineConfig(block_size=4, num_gpu_blocks=32, watermark=0.0))
    out = e.generate([[3, 1, 4, 1, 5]], p)[0]
    assert out.finished and all(len(t) == p.max_tokens for t in out.token_ids)
    assert all(0 <= t < small_model.cfg.vocab_size for sample_ids in out.token_ids for t in sample_ids)


@pytest.mark.parametrize("kw,match", [
    ({"temperature": 1.0, "seed": 2**64, "n": 1}, "seed"), ({"temperature": 1.0, "seed": 2**64 - 1, "n": 2}, "seed"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"), ({"frequency_penalty": -3.0}, "frequency_penalty"),
    ({"frequency_penalty": 1e39}, "frequency_penalty"), ({"temperature": math.inf}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_k": 0}, "top_k"), ({"seed": -1, "temperature": 1.0}, "seed"),
])
def test_values_that_could_not_work_are_refused_by_name(kw, match):
    with pytest.raises(ConfigError, match=match):
        SamplingParams(**kw)
