"""Profiling (paged_kv.decoding.profiling): counted FLOPs against the formula, the step records,
and the argument checks."""

import pytest
import torch

from kernels.decode_attention import decode_attention_reference
from paged_kv.decoding import (attention_crossover, decode_attention_head_major, forward_flops, profile_decoding,
                               time_decode_attention)
from paged_kv.errors import ConfigError, PromptError
from paged_kv.model import ModelConfig

PROMPT = [3, 1, 4, 1, 5]


def _by_hand(cfg, new, ctx):
    """The formula written out: projections, MLP and LM head at 2 FLOPs per weight per token, plus
    QK^T and PV at 2 * D FLOPs per (query, key) pair per head per layer, each."""
    C, D, H, Hkv, L = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.num_layers
    weights = L * (C * H * D + 2 * C * Hkv * D + H * D * C + 3 * C * cfg.intermediate_size) + cfg.vocab_size * C
    return 2 * new * weights + L * H * 2 * (2 * D) * new * ctx


@pytest.mark.parametrize("tied", [True, False])
def test_forward_flops_is_the_formula(small_cfg, tied):
    """Tied or not, the LM head multiplies once per token and the input table is only indexed."""
    cfg = ModelConfig(**{**small_cfg.to_dict(), "tie_embeddings": tied})
    for new, ctx in [(1, 1), (1, 100), (7, 7), (30, 30)]:
        assert forward_flops(cfg, new, ctx) == _by_hand(cfg, new, ctx)


def test_counted_flops_equal_the_formula_for_recompute_and_the_cache(small_model):
    cfg = small_model.cfg
    rec = profile_decoding(small_model, PROMPT, 4, "recompute", repeats=1)
    con = profile_decoding(small_model, PROMPT, 4, "contiguous", repeats=1)
    assert [s.context_len for s in rec] == [5, 6, 7, 8]
    assert [s.new_tokens for s in rec] == [5, 6, 7, 8] and [s.new_tokens for s in con] == [5, 1, 1, 1]
    # recompute: the fused attention computes the full masked t x t scores, as the formula counts
    assert [s.flops for s in rec] == [forward_flops(cfg, t, t) for t in (5, 6, 7, 8)]
    assert [s.flops for s in con][1:] == [forward_flops(cfg, 1, t) for t in (6, 7, 8)]
    assert all(s.seconds > 0 for s in rec + con)


def test_the_lean_counter_agrees_with_flop_counter_mode(small_model):
    """Our counter drops FlopCounterMode's per-module bookkeeping only: same rules, same total."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from paged_kv.decoding import profiling

    x = torch.tensor([PROMPT * 3])
    mapping = {}
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is not None:
        mapping[op] = profiling._sdpa_flops
    with torch.no_grad():
        with profiling._counter() as ours:
            small_model(x)
        with FlopCounterMode(display=False, custom_mapping=mapping) as theirs:
            small_model(x)
    assert ours.get_total_flops() == theirs.get_total_flops() > 0


def test_without_counting_flops_are_zero(small_model):
    steps = profile_decoding(small_model, PROMPT, 2, "contiguous", count_flops=False, repeats=2)
    assert [s.flops for s in steps] == [0, 0] and len(steps) == 2


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(repeats=0), ConfigError, "repeats must be an int >= 1, got 0"),
    (dict(cache="ring"), ConfigError, "cache must be one of"),
    (dict(prompt=[]), PromptError, "empty"),
])
def test_bad_arguments_raise(small_model, kwargs, err, match):
    args = dict(prompt=PROMPT, max_new_tokens=2, cache="contiguous") | kwargs
    with pytest.raises(err, match=match):
        profile_decoding(small_model, args.pop("prompt"), args.pop("max_new_tokens"), args.pop("cache"), **args)


def test_attention_crossovers_by_hand():
    """Llama-3-8B (meta-llama/Meta-Llama-3-8B): matmul parameters P = 32 layers x (2 x 4096^2 +
    2 x 4096 x 1024 + 3 x 4096 x 14336) + the 128,256 x 4,096 LM head (the embedding is a lookup).
    Per step: t >= P / (2 L H D) = 28,628 exactly; cumulative: n >= 3P / (4 L H D) - 1/2 = 42,941.5."""
    cfg = ModelConfig(vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                      intermediate_size=14336, max_seq_len=8192, tie_embeddings=False)
    P = 32 * (2 * 4096 ** 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 128256 * 4096
    lhd = 32 * 32 * 128
    assert attention_crossover(cfg) == -(-P // (2 * lhd)) == 28_628
    n = attention_crossover(cfg, cumulative=True)
    assert n == 42_942 and round(n / 1000, 1) == 42.9
    attn = lambda n: 4 * lhd * n * (n + 1) * (2 * n + 1) // 6     # sum of 4LHD t^2 over t = 1..n
    lin = lambda n: P * n * (n + 1)                                # sum of 2 P t
    assert attn(n) >= lin(n) and attn(n - 1) < lin(n - 1)
    tiny = ModelConfig(vocab_size=256, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                       head_dim=64, intermediate_size=768, max_seq_len=512)
    P_tiny = 4 * (256 * 256 * 2 + 2 * 256 * 128 + 3 * 256 * 768) + 256 * 256
    assert attention_crossover(tiny) == -(-P_tiny // (2 * 4 * 4 * 64)) == 1_568


@pytest.mark.parametrize("t", [1, 5, 70])
def test_head_major_decode_attention_equals_the_kernel_reference(t):
    """The timed attention is the real one: the same values laid out [1, T, Hkv, D] through
    kernels' decode_attention_reference, on a prefix view of a longer cache (not copied)."""
    g = torch.Generator().manual_seed(t)
    q, k, v = torch.randn(8, 16, generator=g), torch.randn(2, 80, 16, generator=g), torch.randn(2, 80, 16, generator=g)
    ref = decode_attention_reference(q[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                     torch.tensor([t], dtype=torch.int32))
    torch.testing.assert_close(decode_attention_head_major(q, k[:, :t], v[:, :t]), ref[0], rtol=1e-5, atol=1e-6)


def test_time_decode_attention_counts_bytes_and_restores_threads():
    before = torch.get_num_threads()
    rows = time_decode_attention([3, 64], num_heads=4, num_kv_heads=2, head_dim=8, repeats=3, threads=1)
    assert torch.get_num_threads() == before
    assert [r.context_len for r in rows] == [3, 64]
    k = torch.empty(2, 64, 8)                                    # what one call reads: K and V, fp32
    assert [r.bytes_read for r in rows] == [2 * k[:, :3].nbytes, 2 * k.nbytes]
    for r in rows:
        assert len(r.runs) == 3 and r.seconds == sorted(r.runs)[1] and r.seconds > 0
    ticks = iter(range(100))                                     # a clock that counts calls
    rows = time_decode_attention([3, 5], num_heads=2, num_kv_heads=1, head_dim=4, repeats=2,
                                 clock=lambda: next(ticks))
    assert [r.runs for r in rows] == [(1, 1), (1, 1)]             # read twice around each timed call
    for bad in ([], [0]):
        with pytest.raises(ConfigError):
            time_decode_attention(bad)
    with pytest.raises(ConfigError, match="multiple"):
        time_decode_attention([4], num_heads=6, num_kv_heads=4)
