"""The reference loop: speculation never changes greedy output, and saves target passes."""

import pytest

from paged_kv.decoding import speculative_greedy
from paged_kv.errors import ConfigError, PromptError
from paged_kv.model.checkpoint import load_tiny_model
from paged_kv.spec_decode import NgramProposer


@pytest.fixture(scope="module")
def tiny():
    return load_tiny_model()


@pytest.mark.parametrize("k, lo, hi", [(1, 1, 1), (3, 2, 3), (6, 3, 3)])
def test_output_equals_plain_greedy(tiny, k, lo, hi):
    model, tok = tiny
    prompt = tok.encode("ROMEO:\n")
    res = speculative_greedy(model, prompt, 120, NgramProposer(k, lo, hi))
    plain = speculative_greedy(model, prompt, 120, NgramProposer(1, 200))   # never matches: one token a pass
    assert plain.draft_tokens == 0 and plain.target_passes == 120
    assert res.token_ids == plain.token_ids and len(res.token_ids) == len(prompt) + 120
    # every pass emits the accepted drafts and one token of its own
    assert res.accepted_tokens + res.target_passes == 120
    assert res.target_passes < 120 and res.rolled_back == res.draft_tokens - res.accepted_tokens >= 0


def test_refusals(tiny):
    model, tok = tiny
    with pytest.raises(PromptError, match="empty"):
        speculative_greedy(model, [], 4, NgramProposer(2, 1))
    with pytest.raises(PromptError, match="max_seq_len"):
        speculative_greedy(model, [1] * 250, 10, NgramProposer(2, 1))
    with pytest.raises(ConfigError):
        speculative_greedy(model, [1], 0, NgramProposer(2, 1))
