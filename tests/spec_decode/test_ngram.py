"""Prompt lookup against a brute force, the greedy acceptance rule, and the config's checks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv.errors import ConfigError, PagedKVError, PromptError
from paged_kv.spec_decode import NgramProposer, SpeculativeConfig, accept_greedy


def brute_force(tokens, k, lo, hi):
    """Every (n, start) pair with the final n-gram at ``start < T - n``; the longest n wins, then the
    earliest start (vLLM v1's rule)."""
    T = len(tokens)
    matches = [(n, s) for n in range(lo, hi + 1) if n < T for s in range(T - n)
               if tokens[s:s + n] == tokens[T - n:]]
    if not matches:
        return []
    n = max(m[0] for m in matches)
    s = min(m[1] for m in matches if m[0] == n)
    return tokens[s + n:s + n + k]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2), max_size=14), st.integers(1, 5), st.integers(1, 3), st.integers(0, 2))
def test_propose_equals_the_brute_force(tokens, k, lo, extra):
    assert NgramProposer(k, lo, lo + extra).propose(tokens) == brute_force(tokens, k, lo, lo + extra)


def test_the_docstring_example_of_vllm():
    # vLLM's example: [1,2,3,4,2,3], n in 2..3, k = 4: [4,2,3] has no earlier match, [2,3] does at 1
    assert NgramProposer(4, 2, 3).propose([1, 2, 3, 4, 2, 3]) == [4, 2, 3]


def test_longest_n_first_then_earliest_occurrence():
    toks = [7, 1, 2, 8, 5, 2, 9, 1, 2]
    assert NgramProposer(2, 1, 2).propose(toks) == [8, 5]      # "1 2" at 1 beats "2" at 2
    assert NgramProposer(1, 1, 1).propose(toks) == [8]         # "2": earliest at 2, not 5
    assert NgramProposer(3, 3, 3).propose(toks) == []          # "9 1 2" never occurred before


def test_limit_caps_the_draft_and_overlap_is_allowed():
    assert NgramProposer(4, 2).propose([5, 5, 5, 5]) == [5, 5]   # "5 5" at 0, then the rest
    assert NgramProposer(4, 1).propose([1, 2, 1], limit=1) == [2]
    assert NgramProposer(4, 1).propose([1, 2, 1], limit=0) == []
    assert NgramProposer(4, 1).propose([]) == []


def test_propose_checks_its_tokens():
    with pytest.raises(PromptError, match="ints"):
        NgramProposer(2, 1).propose([1, "a"])
    with pytest.raises(PromptError):
        NgramProposer(2, 1).propose([1, True])


@given(st.lists(st.integers(0, 3), max_size=6), st.lists(st.integers(0, 3), max_size=7))
def test_accept_greedy_is_what_greedy_decoding_emits(draft, target):
    target = (target + [0] * 8)[:len(draft) + 1]
    out = accept_greedy(draft, target)
    # brute force: walk like greedy decoding, one target token at a time
    want = []
    for i, t in enumerate(target):
        want.append(t)
        if i == len(draft) or draft[i] != t:
            break
    assert out == want and 1 <= len(out) <= len(draft) + 1


def test_accept_greedy_cases_and_errors():
    assert accept_greedy([4, 5, 6], [4, 5, 6, 7]) == [4, 5, 6, 7]       # all accepted + bonus
    assert accept_greedy([4, 5, 6], [4, 9, 6, 7]) == [4, 9]             # rejected at 1: correction
    assert accept_greedy([], [3]) == [3]                                # no draft: plain decoding
    with pytest.raises(PagedKVError, match="gives 3 target tokens, got 2"):
        accept_greedy([1, 2], [1, 2])


def test_config_defaults_and_mirroring_follow_vllm():
    c = SpeculativeConfig(num_speculative_tokens=3)
    assert (c.method, c.prompt_lookup_min, c.prompt_lookup_max) == ("ngram", 5, 5)
    assert SpeculativeConfig(num_speculative_tokens=2, prompt_lookup_max=3).prompt_lookup_min == 3
    assert SpeculativeConfig(num_speculative_tokens=2, prompt_lookup_min=2).prompt_lookup_max == 2
    d = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 3, "prompt_lookup_max": 3}
    assert SpeculativeConfig.from_dict(d) == SpeculativeConfig(**d)
    p = NgramProposer.from_config(SpeculativeConfig.from_dict(d))
    assert (p.k, p.min_n, p.max_n) == (6, 3, 3)
    assert SpeculativeConfig(method="draft_model").draft_num_layers == 1
    assert SpeculativeConfig(method="draft_model", draft_num_layers=3).draft_num_layers == 3
    assert p.propose([1, 2, 3, 1, 2], seq_id=7) == p.propose([1, 2, 3, 1, 2])    # the protocol's keyword


@pytest.mark.parametrize("bad, match", [
    ({"method": "eagle"}, "must be one of"),
    ({"method": "draft_model", "draft_num_layers": 0}, "draft_num_layers"),
    ({"method": "ngram", "draft_num_layers": 2}, "is for method 'draft_model'"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"num_speculative_tokens": True}, "num_speculative_tokens"),
    ({"prompt_lookup_min": 0}, "prompt_lookup_min"),
    ({"prompt_lookup_min": 4, "prompt_lookup_max": 2}, r"prompt_lookup_min \(4\) must be <= prompt_lookup_max \(2\)"),
    ({"num_tokens": 2}, "unknown keys"),
])
def test_config_refuses_bad_values(bad, match):
    with pytest.raises(ConfigError, match=match):
        SpeculativeConfig.from_dict(bad)


def test_from_dict_refuses_a_non_dict():
    with pytest.raises(ConfigError, match="must be a dict"):
        SpeculativeConfig.from_dict([("method", "ngram")])
    with pytest.raises(ConfigError, match="prompt_lookup_min"):
        NgramProposer(2, 3, 1)
