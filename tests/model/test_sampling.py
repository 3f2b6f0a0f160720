"""SamplingParams and sample: greedy, top-k, top-p, and their argument checks."""

import pytest
import torch
from paged_kv.errors import ConfigError
from paged_kv.model import SamplingParams, sample


def test_top_k_and_top_p_restrict_support():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).repeat(2000, 1)
    g = [torch.Generator().manual_seed(0)] * len(logits)      # one generator drawn 2000 times
    assert set(sample(logits, SamplingParams(1.0, top_k=2, seed=0), g).tolist()) == {0, 1}
    p = torch.softmax(logits[0], -1)  # p0 = 0.64, p0 + p1 = 0.88
    assert set(sample(logits, SamplingParams(1.0, top_p=float(p[0]) + 0.01, seed=0), g).tolist()) == {0, 1}
    assert set(sample(logits, SamplingParams(1.0, top_p=float(p[0]) - 0.01, seed=0), g).tolist()) == {0}


@pytest.mark.parametrize("bad", [dict(temperature="0.5"), dict(temperature=True), dict(top_p="x"), dict(top_k=True)])
def test_sampling_params_reject_wrong_types(bad):
    with pytest.raises(ConfigError):
        SamplingParams(**bad)
