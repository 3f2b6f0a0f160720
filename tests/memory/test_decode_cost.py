"""Decode arithmetic (paged_kv.memory.decode_cost): bytes, FLOPs, intensity, ridge points, the
roofline; every expected value derived by hand from the public configs and datasheets, or counted
from a real model's and cache's tensors."""

import pytest
import torch

from paged_kv.decoding import forward_flops
from paged_kv.errors import ConfigError
from paged_kv.memory import (plan_memory, arithmetic_intensity, budget_range_for_slots, generation_time, max_decode_throughput, step_bytes,
                             step_flops, step_time, kv_bytes_per_token, model_preset, ridge_point,
                             roofline_tokens_per_s, tokens_to_reach, weights_read_per_step)
from paged_kv.model import ModelConfig, TinyLlama
from paged_kv.storage import ContiguousKVCache
from paged_kv.units import GiB

# Llama-3-8B (meta-llama/Meta-Llama-3-8B config.json), counted by hand: untied 128,256 x 4,096
# embedding and LM head, 32 layers of q/o (4096^2 each), k/v (4096 x 1024 each), SwiGLU 3 x 4096
# x 14336, two norms, and the final norm.
EMB = 128256 * 4096
LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
PARAMS = 2 * EMB + 32 * LAYER + 4096
KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2


def test_weights_read_skip_the_gathered_embedding():
    assert model_preset("Llama-3-8B").num_params == PARAMS
    assert weights_read_per_step("Llama-3-8B") == (PARAMS - EMB) * 2
    # tied: Gemma-2's LM head reads the whole table every step, nothing is skipped
    gemma = model_preset("Gemma-2-9B")
    assert weights_read_per_step(gemma) == gemma.num_params * 2


@pytest.mark.parametrize("batch,expected", [(1, 114_516), (16, 7_157), (64, 1_789)])
def test_kv_outweighs_weights_read_beyond(batch, expected):
    """The issue's values: beyond 114,516 / 7,157 / 1,789 tokens (not 122,532 / 7,658 / 1,915,
    which count the embedding table as read)."""
    w = (PARAMS - EMB) * 2
    assert w // (KV_PER_TOKEN * batch) == expected
    assert tokens_to_reach("Llama-3-8B", weights_read_per_step("Llama-3-8B"), batch) == expected + 1
    assert (PARAMS * 2) // (KV_PER_TOKEN * batch) == {1: 122_532, 16: 7_658, 64: 1_914}[batch]


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("t,batch", [(0, 1), (37, 1), (37, 3), (128, 2)])
def test_step_bytes_of_a_model_are_its_tensors(small_cfg, tied, t, batch):
    """Counted by walking a real fp16 TinyLlama and a real cache: every parameter but an untied
    input table (a step gathers B of its rows; a tied one the LM head reads whole), and the K/V
    tensors of ``batch`` sequences of ``t`` tokens."""
    cfg = ModelConfig(**{**small_cfg.to_dict(), "tie_embeddings": tied})
    model = TinyLlama(cfg).to(torch.float16)
    weights = sum(p.numel() * p.element_size() for name, p in model.named_parameters()
                  if tied or name != "embed_tokens.weight")
    kv = ContiguousKVCache(cfg, batch, t, dtype=torch.float16).nbytes if t else 0
    assert step_bytes(cfg, t, batch, "fp16", "fp16") == {"weights": weights, "kv_cache": kv}


def test_step_bytes_grow_with_t_and_b():
    b = step_bytes("Llama-3-8B", 1000, 4)
    assert b == {"weights": (PARAMS - EMB) * 2, "kv_cache": 4 * 1000 * KV_PER_TOKEN}
    assert step_bytes("Llama-3-8B", 0, 1)["kv_cache"] == 0


@pytest.mark.parametrize("name,ratio", [("Llama-2-7B", 1), ("Llama-3-8B", 4), ("Llama-2-70B", 8)])
@pytest.mark.parametrize("batch", [1, 7, 64])
def test_attention_intensity_is_h_over_hkv_whatever_the_batch(name, ratio, batch):
    ai = arithmetic_intensity(name, 3000, batch)
    assert ai["attention"] == pytest.approx(ratio)
    assert ai["linear"] == pytest.approx(batch)         # 2 B FLOPs per 2-byte weight
    assert min(ai["attention"], ai["linear"]) <= ai["step"] <= max(ai["attention"], ai["linear"])


def test_step_flops_by_hand():
    f = step_flops("Llama-3-8B", 100, 2)
    assert f["linear"] == 2 * 2 * (PARAMS - EMB)
    assert f["attention"] == 4 * 2 * 32 * 32 * 128 * 100
    with pytest.raises(ConfigError, match="MLA"):
        step_flops("DeepSeek-V3", 100, 1)


def test_ridge_points_from_datasheets():
    assert ridge_point("H100-80GB") == pytest.approx(989.4e12 / 3.35e12)
    assert 290 < ridge_point("H100-80GB") < 300
    assert ridge_point("A100-80GB") == pytest.approx(312 / 2.039)


def test_roofline_batch_one_is_bandwidth_over_bytes():
    nbytes = (PARAMS - EMB) * 2 + 4096 * KV_PER_TOKEN
    assert roofline_tokens_per_s("Llama-3-8B", "H100-80GB", 4096, 1) == pytest.approx(3.35e12 / nbytes)
    # a batch never lowers the bound per step, and raises tokens/s while memory-bound
    assert roofline_tokens_per_s("Llama-3-8B", "H100-80GB", 4096, 16) > \
        10 * roofline_tokens_per_s("Llama-3-8B", "H100-80GB", 4096, 1)


def test_opt66b_budget_range_for_the_printed_slots():
    """9.7K slots of 2 x 64 x 9216 x 2 bytes need a budget in [9,650, 9,750) tokens' worth."""
    per = 2 * 64 * 9216 * 2
    lo, hi = budget_range_for_slots("OPT-66B", "9.7K")
    assert (lo, hi) == (9650 * per, 9750 * per)
    assert round(lo / GiB, 2) == 21.20 and round(hi / GiB, 2) == 21.42
    assert budget_range_for_slots("OPT-13B", "512") == (512 * kv_bytes_per_token("OPT-13B"),
                                                         513 * kv_bytes_per_token("OPT-13B"))
    with pytest.raises(ConfigError, match="printed"):
        budget_range_for_slots("OPT-66B", "about ten")


def test_step_flops_and_forward_flops_differ_by_the_norm_weights_exactly(small_cfg):
    """Two counts of a decode step's linear FLOPs, one from the spec (every weight read once per
    token) and one from the model (matmuls only): the gap is the RMSNorm weights, 2 per layer + 1."""
    for t in (1, 37, 100):
        for b in (1, 4):
            spec = step_flops(small_cfg, t, b)
            exact = b * forward_flops(small_cfg, 1, t)
            norms = (2 * small_cfg.num_layers + 1) * small_cfg.hidden_size
            assert spec["linear"] + spec["attention"] - exact == 2 * b * norms


@pytest.mark.parametrize("t", [1, 37, 1024])
def test_recompute_step_time_is_the_chapter_1_count(small_cfg, t):
    """A recompute step's FLOPs from the spec against forward_flops(cfg, t, t), the model's own
    matmul count: they differ by the norm weights only, times the t tokens fed; its bytes are the
    weights alone (no cache is read)."""
    st = step_time(small_cfg, "H100-80GB", t, recompute=True)
    norms = (2 * small_cfg.num_layers + 1) * small_cfg.hidden_size
    assert st.flops - forward_flops(small_cfg, t, t) == 2 * t * norms
    assert st.bytes == weights_read_per_step(small_cfg)
    assert st.compute_s == pytest.approx(st.flops / 989.4e12)
    assert st.memory_s == pytest.approx(st.bytes / 3.35e12)


def test_step_time_bounds_by_hand_for_llama3_on_an_h100():
    """Recompute at 1K and 8K tokens is compute-bound, the cached step memory-bound (chapter 1),
    each side counted by hand from the config and the datasheet."""
    for t in (1024, 8192):
        rec = step_time("Llama-3-8B", "H100-80GB", t, recompute=True)
        assert rec.flops == 2 * t * (PARAMS - EMB) + 4 * 32 * 32 * 128 * t * t
        assert rec.bytes == (PARAMS - EMB) * 2
        assert rec.limit == "compute" and rec.seconds == rec.compute_s
        cached = step_time("Llama-3-8B", "H100-80GB", t)
        assert cached.bytes == (PARAMS - EMB) * 2 + t * KV_PER_TOKEN
        assert cached.flops == 2 * (PARAMS - EMB) + 4 * 32 * 32 * 128 * t
        assert cached.limit == "memory" and cached.seconds == pytest.approx(cached.bytes / 3.35e12)
    with pytest.raises(ConfigError):
        step_time("Llama-3-8B", "H100-80GB", 0, recompute=True)


def test_roofline_is_one_over_the_step_time():
    st = step_time("Llama-3-8B", "A100-80GB", 3000, 12)
    assert roofline_tokens_per_s("Llama-3-8B", "A100-80GB", 3000, 12) == pytest.approx(12 / st.seconds)


@pytest.mark.parametrize("model,gpu,t", [("Llama-3-8B", "H100-80GB", 2048), ("Llama-3-8B", "H100-80GB", 8192),
                                         ("Llama-3-8B", "H100-80GB", 256), ("Llama-2-7B", "A100-40GB", 4096),
                                         ("Mistral-7B", "A100-80GB", 30000)])
def test_memory_wall_is_the_best_batch_that_fits_by_brute_force(model, gpu, t):
    """Every batch from 1 up, asked of plan_memory whether it fits and of the roofline what it
    gives: the best that fits is the wall's batch and bound, and one more does not fit."""
    wall = max_decode_throughput(model, gpu, t)
    fits, b = [], 1
    while plan_memory(model, gpu, t, b).fits:
        fits.append((roofline_tokens_per_s(model, gpu, t, b), b))
        assert b < 10_000
        b += 1
    assert wall.batch_size == len(fits)
    # no batch that fits does better (compute-bound batches tie, up to rounding)
    assert wall.tokens_per_s == pytest.approx(max(v for v, _ in fits), rel=1e-12)
    assert wall.step == step_time(model, gpu, t, wall.batch_size)


def test_memory_wall_issue_values_and_nothing_fits():
    """The review's 226 / 113 / 56 sequences; at 8K tokens about 2,500 tokens/s, not the 2,958
    of batch 256 (which does not fit)."""
    assert [max_decode_throughput("Llama-3-8B", "H100-80GB", t).batch_size for t in (2048, 4096, 8192)] == [226, 113, 56]
    wall = max_decode_throughput("Llama-3-8B", "H100-80GB", 8192)
    assert 2400 < wall.tokens_per_s < 2600 < roofline_tokens_per_s("Llama-3-8B", "H100-80GB", 8192, 256)
    none = max_decode_throughput("Llama-2-70B", "T4", 1024)            # 140 GB of weights on 15 GiB
    assert (none.batch_size, none.tokens_per_s, none.step) == (0, 0.0, None)


def test_generation_time_closed_forms():
    """Cached Llama-3-8B steps on an H100 are all memory-bound: the sum is n weight reads plus
    the K/V of 1 + 2 + ... + n tokens, over the bandwidth.  Recompute steps from the ridge on are
    compute-bound: summed by hand, step by step, from the config's own counts."""
    n = 3000
    w = (PARAMS - EMB) * 2
    cached = generation_time("Llama-3-8B", "H100-80GB", n)
    assert cached == pytest.approx((n * w + KV_PER_TOKEN * n * (n + 1) // 2) / 3.35e12)
    by_hand = sum(max(w / 3.35e12, (2 * t * (PARAMS - EMB) + 4 * 32 * 32 * 128 * t * t) / 989.4e12)
                  for t in range(1, n + 1))
    assert generation_time("Llama-3-8B", "H100-80GB", n, recompute=True) == pytest.approx(by_hand)
    assert generation_time("Llama-3-8B", "H100-80GB", 1, recompute=True) == pytest.approx(w / 3.35e12)
    with pytest.raises(ConfigError):
        generation_time("Llama-3-8B", "H100-80GB", 0)
