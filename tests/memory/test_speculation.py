"""The speed-up model of speculative decoding: eq. 1 against the acceptance process summed exactly,
the limits, monotonicity, and the crossover batch against every batch."""

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv.errors import ConfigError, UnknownPresetError
from paged_kv.memory import GPUSpec, gpu_preset, max_batch_size, step_time
from paged_kv.memory.speculation import (crossover_batch, draft_time, expected_tokens_per_pass, speedup,
                                         verify_step_time)


def brute_force_tokens(alpha, k):
    """Sum over the acceptance process: drafts accepted one by one with probability alpha until the
    first rejection; exactly ``a < k`` accepted has probability alpha^a (1 - alpha), all ``k``
    alpha^k; the pass emits the accepted drafts plus the target's token."""
    total = sum((a + 1) * alpha ** a * (1 - alpha) for a in range(k))
    return total + (k + 1) * alpha ** k


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.fractions(0, 1, max_denominator=50), st.integers(0, 12))
def test_eq_1_equals_the_acceptance_process_exactly(alpha, k):
    got = expected_tokens_per_pass(alpha, k)
    assert isinstance(got, Fraction) and got == brute_force_tokens(alpha, k)


def test_limits_of_eq_1():
    for k in range(6):
        assert expected_tokens_per_pass(Fraction(1), k) == k + 1 == expected_tokens_per_pass(1.0, k)
        assert expected_tokens_per_pass(0, k) == 1 == expected_tokens_per_pass(0.0, k)
    assert expected_tokens_per_pass(0.7, 0) == 1
    assert expected_tokens_per_pass(0.7, 4) == pytest.approx(float(brute_force_tokens(Fraction(7, 10), 4)))
    assert expected_tokens_per_pass(1 - 1e-12, 5) == pytest.approx(6, rel=1e-9)   # continuous at alpha -> 1


MODELS = [("Llama-3-8B", "H100", 1), ("Llama-3-70B", "H100", 4)]


@pytest.mark.parametrize("model, gpu, tp", MODELS)
def test_a_decode_step_and_the_verify_pass(model, gpu, tp):
    # k = 0 is a decode step at context t + 1 plus its own token's write: the decode model's step_time
    # at t + 1 differs by that one token's K/V only
    plain = step_time(model, gpu, 1025, 8, tp=tp)
    v0 = verify_step_time(model, gpu, 1024, 8, 0, tp=tp)
    assert v0.flops == plain.flops and 0 < v0.bytes - plain.bytes < plain.bytes * 1e-3
    # the verify pass computes (1 + k) times the queries; its bytes grow by 2k tokens of K/V per sequence
    for k in (1, 4):
        v = verify_step_time(model, gpu, 1024, 8, k, tp=tp)
        assert v.flops > (1 + k) * v0.flops * 0.999 and v.bytes > v0.bytes
        assert v.memory_s < v0.memory_s * 1.01 and v.limit == "memory"     # about one step at B = 8


@pytest.mark.parametrize("model, gpu, tp", MODELS)
def test_speedup_limits(model, gpu, tp):
    for k in (1, 4, 8):
        for b in (1, 64, 1024):
            assert speedup(0.0, k, b, model, gpu, tp=tp) < 1                  # nothing accepted: pure cost
            assert speedup(0.0, k, b, model, gpu, tp=tp, draft_cost=0.1) < speedup(0.0, k, b, model, gpu, tp=tp)
        # small batch, memory-bound: the verify costs about one step, the paper's formula with c = 0
        for a in (0.5, 0.8, 1.0):
            assert speedup(a, k, 1, model, gpu, tp=tp) == pytest.approx(expected_tokens_per_pass(a, k), rel=2e-3)
            c = 0.05
            paper = expected_tokens_per_pass(a, k) / (k * c + 1)
            assert speedup(a, k, 1, model, gpu, tp=tp, draft_cost=c) == pytest.approx(paper, rel=2e-3)
        # alpha = 1 at a compute-bound batch: k + 1 tokens for about k + 1 steps' FLOPs
        assert speedup(1.0, k, 200_000, model, gpu, tp=tp, context_len=16) == pytest.approx(1, rel=0.05)
    assert speedup(0.8, 0, 7, model, gpu, tp=tp) == 1.0          # no drafts: the same step


def test_speedup_is_monotone():
    m, g = "Llama-3-8B", "H100"
    alphas = [i / 10 for i in range(11)]
    for k in (1, 3, 6):
        for b in (1, 128, 512):
            s = [speedup(a, k, b, m, g, context_len=256) for a in alphas]
            assert s == sorted(s)                                          # rises with alpha
        s = [speedup(0.7, k, b, m, g, context_len=256) for b in range(1, 1500, 7)]
        assert all(x >= y * (1 - 1e-12) for x, y in zip(s, s[1:]))          # never rises with the batch (but rounding)
        s = [speedup(0.7, k, 16, m, g, draft_cost=c) for c in (0, 0.01, 0.05, 0.2)]
        assert all(x > y for x, y in zip(s, s[1:]))                        # falls with the draft's cost


@pytest.mark.parametrize("model, gpu, tp, t, alpha, k", [
    ("Llama-3-8B", "H100", 1, 256, 0.5, 4), ("Llama-3-8B", "H100", 1, 128, 0.8, 2),
    ("Llama-3-70B", "H100", 4, 512, 0.7, 4), ("Llama-3-70B", "H100", 4, 128, 0.6, 8)])
def test_crossover_is_the_first_batch_where_speedup_is_at_most_1(model, gpu, tp, t, alpha, k):
    top = 700
    first = next((b for b in range(1, top + 1) if speedup(alpha, k, b, model, gpu, tp=tp, context_len=t) <= 1), None)
    assert first is not None                     # these settings cross within the range
    assert crossover_batch(alpha, k, model, gpu, tp=tp, context_len=t, max_batch=top) == first
    assert crossover_batch(alpha, k, model, gpu, tp=tp, context_len=t, max_batch=first - 1) is None


def test_crossover_defaults_to_the_batches_that_fit():
    # Llama-3-8B at 1024 tokens on an H100: the K/V reads keep the step memory-bound up to the
    # largest batch that fits, so speculation pays at every batch that fits
    fits = max_batch_size("Llama-3-8B", "H100", 1024 + 5)
    assert crossover_batch(0.7, 4, "Llama-3-8B", "H100") is None
    assert speedup(0.7, 4, fits, "Llama-3-8B", "H100") > 1
    assert crossover_batch(0.7, 4, "Llama-3-70B", "H100", tp=4) == crossover_batch(
        0.7, 4, "Llama-3-70B", "H100", tp=4, max_batch=max_batch_size("Llama-3-70B", "H100", 1029, tp=4))
    with pytest.raises(ConfigError, match="fits"):
        crossover_batch(0.7, 4, "Llama-3-70B", "T4")


def test_refusals():
    for bad in (-0.1, 1.5, float("nan"), "0.5", True, Fraction(3, 2)):
        with pytest.raises(ConfigError, match="alpha"):
            expected_tokens_per_pass(bad, 2)
    for bad in (-1, 1.5, None):
        with pytest.raises(ConfigError, match="k"):
            expected_tokens_per_pass(0.5, bad)
    with pytest.raises(ConfigError, match="draft_cost"):
        speedup(0.5, 2, 1, "Llama-3-8B", "H100", draft_cost=-0.1)
    with pytest.raises(ConfigError, match="batch_size"):
        speedup(0.5, 2, 0, "Llama-3-8B", "H100")
    with pytest.raises(ConfigError, match="max_batch"):
        crossover_batch(0.5, 2, "Llama-3-8B", "H100", max_batch=0)
    with pytest.raises(UnknownPresetError):
        speedup(0.5, 2, 1, "Llama-9", "H100")
    g = gpu_preset("H100")
    blank = GPUSpec("blank", g.marketed, g.memory_bytes)
    with pytest.raises(ConfigError, match="bandwidth"):
        verify_step_time("Llama-3-8B", blank, 16, 1, 2)
    assert draft_time(4, 0.25, 2.0) == 2.0
