"""The KV-cache ledger (paged_kv.memory): numbers from the issue and the vLLM paper, the formula
against bytes really allocated by the package's caches, and the errors for impossible inputs.

Expected values are computed here from the models' public config fields (written out, not read
from the presets) or quoted from the cited source, never from the function under test.
"""

import math

import pytest
import torch

from paged_kv.storage import ContiguousKVCache
from paged_kv.model import ModelConfig
from paged_kv.errors import ConfigError, UnknownPresetError
from paged_kv.units import GB, GiB, format_bytes
from paged_kv.memory import (KVDType, PAPER_TABLE1, attention_variant,
                             get_kv_dtype, gpu_preset, kv_bytes_per_token, kv_cache_bytes,
                             kv_heads_per_gpu, kv_slots, max_batch_size, max_tokens, model_preset,
                             plan_memory, tokens_to_reach, weights_bytes)
from paged_kv.memory import MODEL_PRESETS, ModelSpec
from paged_kv import memory


# --- bytes per token ---------------------------------------------------------------------------
def test_llama3_8b_gqa_bytes_per_token():
    # meta-llama/Meta-Llama-3-8B config.json: 32 layers, 8 KV heads, 4096 / 32 = 128 head_dim
    assert kv_bytes_per_token("Llama-3-8B") == 2 * 32 * 8 * 128 * 2 == 131_072
    assert kv_cache_bytes("Llama-3-8B", 8192, 1) == GiB  # 1 GiB per 8,192 tokens
    mha = attention_variant("Llama-3-8B", "MHA")
    assert kv_bytes_per_token(mha) == 4 * 131_072  # without GQA: 32 KV heads, 4x


def test_qwen3_4b_uses_head_dim_from_config():
    # Qwen/Qwen3-4B: 36 layers, 8 KV heads, head_dim 128 although 2560 / 32 = 80
    assert kv_bytes_per_token("Qwen3-4B") == 2 * 36 * 8 * 128 * 2 == 147_456
    assert kv_bytes_per_token(model_preset("Qwen3-4B").replace(head_dim=80)) == 92_160


def test_opt_13b_matches_the_paper():
    # vLLM paper §3: 2 x 5120 x 40 x 2 bytes = "800 KB"; 2,048 tokens = "1.6 GB"
    per_token = kv_bytes_per_token("OPT-13B")
    assert per_token == 2 * 5120 * 40 * 2 == 819_200 == 800 * 1024  # 800 KiB exactly
    request = kv_cache_bytes("OPT-13B", 2048, 1)
    assert request == 1_677_721_600
    assert round(request / GiB, 1) == 1.6 and round(request / GB, 1) == 1.7  # the paper's GB is GiB


@pytest.mark.parametrize("row", PAPER_TABLE1, ids=lambda r: r["model"])
def test_paper_table1_slots(row):
    per_gpu_budget = row["kv_gb"] * GiB // row["tp"]
    slots = kv_slots(row["model"], per_gpu_budget, tp=row["tp"])
    whole = kv_slots(row["model"], row["kv_gb"] * GiB)
    assert slots == whole  # sharding heads over tp GPUs does not change the slot count
    layers, hidden = {"OPT-13B": (40, 5120), "OPT-66B": (64, 9216), "OPT-175B": (96, 12288)}[row["model"]]
    assert whole == row["kv_gb"] * GiB // (2 * layers * hidden * 2)
    printed = float(row["slots_printed"].rstrip("K"))
    if row["model"] == "OPT-66B":  # 21 GiB / 2,359,296 B = 9,557 slots: "9.6K", printed "9.7K"
        assert round(whole / 1000, 1) == 9.6 != printed
        assert round(row["kv_gb"] * GB / (2 * layers * hidden * 2) / 1000, 1) == 8.9  # GB: no better
    else:
        assert round(whole / 1000, 1) == printed


def test_70b_worked_example_and_the_extra_factor_two():
    layers, d_model, tokens, batch, fp16 = 80, 8192, 4096, 16, 2
    mha = kv_cache_bytes(attention_variant("Llama-2-70B", "MHA"), tokens, batch)
    assert mha == 2 * layers * d_model * tokens * batch * fp16 == 171_798_691_840 == 160 * GiB
    assert round(mha / GB) == 172
    assert kv_cache_bytes("Llama-2-70B", tokens, batch) == 20 * GiB  # 8 KV heads: 1/8
    printed_formula = 2 * 2 * layers * d_model * tokens * batch * fp16
    assert printed_formula == 2 * mha == 320 * GiB


def test_mla_caches_latent_and_rope_key_without_factor_two():
    # deepseek-ai/DeepSeek-V3: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64
    assert kv_bytes_per_token("DeepSeek-V3") == 61 * (512 + 64) * 2 == 70_272
    assert kv_bytes_per_token("DeepSeek-V3", tp=8) == 70_272  # the latent is replicated, not split
    as_mha = model_preset("DeepSeek-V3").replace(kv_lora_rank=0, qk_rope_head_dim=0)
    assert kv_bytes_per_token(as_mha) == 2 * 61 * 128 * 128 * 2  # 128 heads x 128 dims, K and V


def test_attention_variants_of_one_model():
    spec = model_preset("Llama-2-70B")
    sizes = {k: kv_bytes_per_token(attention_variant(spec, k)) for k in ("MHA", "GQA", "MQA", "MLA")}
    assert sizes["MHA"] == 2 * 80 * 64 * 128 * 2
    assert sizes["GQA"] == sizes["MHA"] // 8 and sizes["MQA"] == sizes["MHA"] // 64
    assert sizes["MLA"] == 80 * (4 * 128 + 64) * 2  # DeepSeek-V2's 4 d_h + d_h / 2
    assert attention_variant(spec, "mqa").attention_kind == "MQA"
    with pytest.raises(ConfigError, match="XQA"):
        attention_variant(spec, "XQA")


def test_sliding_window_caps_the_sliding_layers():
    # Mistral-7B-v0.1: all 32 layers slide over 4,096 tokens
    assert kv_cache_bytes("Mistral-7B", 32768, 1) == kv_cache_bytes("Mistral-7B", 4096, 1) == 4096 * 131_072
    assert kv_cache_bytes("Mistral-7B", 1000, 3) == 3 * 1000 * 131_072
    # google/gemma-2-9b: 42 layers, 8 KV heads x 256 dims, every other layer slides over 4,096
    per_layer = 2 * 8 * 256 * 2
    assert kv_cache_bytes("Gemma-2-9B", 8192, 1) == (21 * 8192 + 21 * 4096) * per_layer
    assert kv_bytes_per_token("Gemma-2-9B") == 42 * per_layer


# --- KV dtypes ----------------------------------------------------------------------------------
def test_kv_dtypes_and_scale_overhead():
    fp16 = kv_bytes_per_token("Llama-3-8B", "fp16")
    assert kv_bytes_per_token("Llama-3-8B", "fp32") == 2 * fp16
    assert kv_bytes_per_token("Llama-3-8B", "bf16") == fp16
    assert kv_bytes_per_token("Llama-3-8B", "fp8") == fp16 // 2 == kv_bytes_per_token("Llama-3-8B", "FP8_E4M3")
    vectors = 2 * 32 * 8  # K and V, per layer, per KV head
    assert kv_bytes_per_token("Llama-3-8B", "int8") == vectors * (128 + 4)  # + fp16 scale and zero
    assert kv_bytes_per_token("Llama-3-8B", "int4") == vectors * (64 + 4)
    int4_g32 = KVDType("int4-g32", 4, group_size=32, scale_bytes=4)
    assert kv_bytes_per_token("Llama-3-8B", int4_g32) == vectors * (64 + 4 * 4)
    assert kv_bytes_per_token("DeepSeek-V3", "int8") == 61 * (576 + 4)


def test_bad_kv_dtypes():
    with pytest.raises(ConfigError, match="fp12"):
        get_kv_dtype("fp12")
    with pytest.raises(ConfigError, match="whole bytes"):
        KVDType("int3", 3).vector_bytes(7)


# --- tensor parallelism ----------------------------------------------------------------------
def test_tensor_parallel_splits_then_replicates_kv_heads():
    full = kv_bytes_per_token("Llama-3-70B")
    assert kv_bytes_per_token("Llama-3-70B", tp=8) == full // 8
    assert kv_heads_per_gpu(model_preset("Llama-3-70B"), 8) == 1
    # Llama-3.1-405B: 8 KV heads over 16 GPUs: each GPU still keeps one head, every head twice
    spec = model_preset("Llama-3.1-405B")
    assert kv_heads_per_gpu(spec, 16) == 1
    assert kv_bytes_per_token(spec, tp=16) == kv_bytes_per_token(spec, tp=8) == 2 * 126 * 128 * 2
    assert 16 * kv_bytes_per_token(spec, tp=16) == 2 * kv_bytes_per_token(spec)


@pytest.mark.parametrize("model, tp, words", [
    ("Llama-3-8B", 3, "32 query heads"),
    ("Llama-3-8B", 0, "tp must be"),
    (ModelSpec("odd", 2, 96, 12, 6, 8, 10), 4, "6 KV heads cannot be split"),
    (ModelSpec("rep", 2, 96, 12, 4, 8, 10), 6, "replicated evenly"),
])
def test_impossible_tensor_parallel(model, tp, words):
    with pytest.raises(ConfigError, match=words):
        kv_bytes_per_token(model, tp=tp)


# --- errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize("seq_len, batch", [(-1, 1), (8, -2), (1.5, 1), (True, 1)])
def test_negative_or_non_integer_sizes(seq_len, batch):
    with pytest.raises(ConfigError):
        kv_cache_bytes("Llama-3-8B", seq_len, batch)


def test_heads_not_divisible_by_kv_heads():
    with pytest.raises(ConfigError, match="not divisible"):
        ModelSpec("bad", num_layers=2, hidden_size=64, num_heads=6, num_kv_heads=4, head_dim=16, num_params=1)
    with pytest.raises(ConfigError, match="not divisible"):
        kv_bytes_per_token(ModelConfig(num_heads=6, num_kv_heads=4, hidden_size=96))


def test_unknown_presets_list_the_known_ones():
    with pytest.raises(UnknownPresetError) as err:
        model_preset("GPT-5")
    assert "GPT-5" in str(err.value) and "Llama-3-8B" in str(err.value) and "tiny" in str(err.value)
    with pytest.raises(UnknownPresetError, match="H200"):
        gpu_preset("V100")


def test_presets_are_case_insensitive():
    assert model_preset("llama-3-8b") is MODEL_PRESETS["Llama-3-8B"]
    assert model_preset(" OPT-13b ").name == "OPT-13B"
    assert gpu_preset("a100").name == "A100-80GB" and gpu_preset("h200").name == "H200"


def test_tiny_preset_is_read_from_the_package_config():
    from paged_kv.model import weights_dir
    path = weights_dir() / "config.json"
    cfg = ModelConfig.from_json(path) if path.is_file() else ModelConfig()
    spec = model_preset("TINY")
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
    assert spec.num_params == cfg.num_parameters()
    assert kv_bytes_per_token(spec) == kv_bytes_per_token(cfg) == 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2


# --- the formula against real tensors --------------------------------------------------------
@pytest.mark.parametrize("dtype, name", [(torch.float16, "fp16"), (torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_formula_equals_contiguous_cache_allocation_tiny(dtype, name):
    cfg = ModelConfig()  # the tiny model's shape
    cache = ContiguousKVCache(cfg, batch_size=3, max_seq_len=40, dtype=dtype)
    allocated = sum(t.untyped_storage().nbytes() for t in cache.k + cache.v)
    assert cache.nbytes == allocated == kv_cache_bytes(cfg, 40, 3, name)


def test_formula_equals_allocation_realistic_small_scale():
    # Qwen3-4B's attention shape (8 KV heads x 128, head_dim != hidden / heads) with 2 layers
    cfg = ModelConfig(hidden_size=2560, num_layers=2, num_heads=32, num_kv_heads=8, head_dim=128,
                      intermediate_size=64, max_seq_len=64)
    cache = ContiguousKVCache(cfg, batch_size=2, max_seq_len=64, dtype=torch.float16)
    assert cache.nbytes == sum(t.untyped_storage().nbytes() for t in cache.k + cache.v)
    assert cache.nbytes == kv_cache_bytes(cfg, 64, 2)


def test_formula_equals_allocation_full_scale_on_meta():
    # Llama-3-8B at full size, 16 x 8,192 tokens: 16 GiB, "allocated" on the meta device
    cfg = ModelConfig(vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                      intermediate_size=14336, max_seq_len=8192)
    cache = ContiguousKVCache(cfg, batch_size=16, max_seq_len=8192, dtype=torch.float16, device="meta")
    assert cache.nbytes == kv_cache_bytes(cfg, 8192, 16) == kv_cache_bytes("Llama-3-8B", 8192, 16) == 16 * GiB


def test_formula_equals_paged_cache_allocation():
    from paged_kv.storage import PagedKVCache

    cfg = ModelConfig()  # the tiny model's shape: 10 blocks of 16 token slots
    cache = PagedKVCache(cfg, num_blocks=10, block_size=16, dtype=torch.float16)
    # count each allocation once (k_cache and v_cache are single [L, NB, BS, Hkv, D] tensors)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in (cache.k_cache, cache.v_cache)}
    allocated = sum(storages.values())
    assert cache.nbytes == allocated == 10 * 16 * kv_bytes_per_token(cfg) == kv_cache_bytes(cfg, 16, 10)
    # Llama-3-8B at full size on the meta device: 4,096 blocks of 16 tokens = 8 GiB in fp16
    big = ModelConfig(vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                      intermediate_size=14336, max_seq_len=8192)
    cache = PagedKVCache(big, num_blocks=4096, block_size=16, dtype=torch.float16, device="meta")
    assert cache.nbytes == kv_cache_bytes("Llama-3-8B", 4096 * 16, 1) == 8 * GiB


# --- weights and GPUs --------------------------------------------------------------------------
def test_gpu_presets_in_bytes():
    assert gpu_preset("A100-80GB").memory_bytes == 80 * GiB == 85_899_345_920
    assert gpu_preset("A100-40GB").memory_bytes == 40 * GiB
    assert gpu_preset("T4").memory_bytes == 15 * GiB  # 15,360 MiB with ECC on
    assert gpu_preset("H100").memory_bytes == 81559 * 2**20
    assert gpu_preset("H200").memory_bytes == 143771 * 2**20


def test_weights_bytes():
    assert weights_bytes("Llama-2-7B") == 6_738_415_616 * 2  # fp16
    assert weights_bytes("Llama-2-7B", "int4") == 6_738_415_616 // 2
    assert weights_bytes("Llama-3-70B", tp=8) == math.ceil(70_553_706_496 * 2 / 8)
    with pytest.raises(ConfigError, match="fp6"):
        weights_bytes("Llama-2-7B", "fp6")


def test_plan_memory_budget_arithmetic():
    p = plan_memory("Llama-3-8B", "A100-80GB", seq_len=8192, batch_size=16)
    gpu = 80 * GiB
    assert p.weights_bytes == 8_030_261_248 * 2 and p.reserve_bytes == int(gpu * 0.1)
    assert p.kv_budget_bytes == gpu - p.reserve_bytes - p.weights_bytes
    assert p.max_batch_size == p.kv_budget_bytes // GiB  # 1 GiB per 8,192-token sequence
    assert p.max_tokens == p.kv_budget_bytes // 131_072
    assert p.kv_bytes == 16 * GiB and p.fits and p.kv_fraction == pytest.approx(0.2)
    assert "GiB" in p.summary() and "GB)" in p.summary()
    assert max_batch_size("Llama-3-8B", "A100-80GB", 8192) == p.max_batch_size
    assert max_tokens("Llama-3-8B", "A100-80GB") == p.max_tokens


def test_plan_memory_block_rounding_and_weights_that_do_not_fit():
    p = plan_memory("Llama-3-8B", "H100", seq_len=100, block_size=16)
    assert p.kv_bytes_per_sequence == 112 * 131_072  # 7 blocks of 16 tokens
    assert p.max_tokens % 16 == 0 and p.max_batch_size == p.max_tokens // 112
    big = plan_memory("Llama-3-70B", "A100-80GB", seq_len=4096)  # 141 GB of bf16 weights
    assert not big.weights_fit and big.max_batch_size == 0 and big.max_tokens == 0 and not big.fits
    assert plan_memory("Llama-3-70B", "A100-80GB", seq_len=4096, tp=4).max_batch_size > 0


@pytest.mark.parametrize("kwargs", [dict(seq_len=0), dict(seq_len=8, reserve_fraction=1.0),
                                    dict(seq_len=8, block_size=0), dict(seq_len=8, tp=5)])
def test_plan_memory_rejects_impossible_inputs(kwargs):
    with pytest.raises(ConfigError):
        plan_memory("Llama-3-8B", "T4", **kwargs)


def test_format_bytes_keeps_gib_and_gb_apart():
    assert format_bytes(160 * GiB) == "160.00 GiB (171.80 GB)"
    assert format_bytes(819_200, "KiB") == "800.00 KiB" and format_bytes(819_200, "KB") == "819.20 KB"
    with pytest.raises(ConfigError):
        format_bytes(1, "gigs")


@pytest.mark.parametrize("bad", ["x", None, True, float("nan"), float("inf"), [1]])
def test_format_bytes_refuses_what_is_not_a_byte_count(bad):
    with pytest.raises(ConfigError, match="finite number of bytes"):
        format_bytes(bad)


def test_format_bytes_signs_a_difference_but_never_prints_minus_zero():
    import numpy as np
    assert format_bytes(-5) == "0.00 GiB (0.00 GB)" and format_bytes(-5, "KiB") == "0.00 KiB"
    assert format_bytes(-3 * GiB) == "-3.00 GiB (-3.22 GB)"
    assert format_bytes(-2048, "auto") == "-2.00 KiB (-2.05 KB)"
    assert format_bytes(np.int64(2048), "auto") == format_bytes(2048, "auto") == "2.00 KiB (2.05 KB)"


# --- properties over random shapes ------------------------------------------------------------
from hypothesis import given, settings, strategies as st


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 128), kv_heads=st.sampled_from([1, 2, 4, 8, 16]), group=st.integers(1, 8),
       head_dim=st.sampled_from([32, 64, 80, 96, 128, 256]), seq=st.integers(0, 10**6),
       batch=st.integers(0, 64), tp=st.sampled_from([1, 2, 4, 8, 16]),
       window=st.one_of(st.none(), st.integers(1, 10**5)), dt=st.sampled_from(["fp32", "fp16", "fp8", "int8", "int4"]))
def test_ledger_properties(layers, kv_heads, group, head_dim, seq, batch, tp, window, dt):
    spec = ModelSpec("p", num_layers=layers, hidden_size=kv_heads * group * head_dim, num_heads=kv_heads * group,
                     num_kv_heads=kv_heads, head_dim=head_dim, num_params=1, sliding_window=window,
                     sliding_layers=layers if window else 0)
    per_token = kv_bytes_per_token(spec, dt)
    stored = seq if window is None else min(seq, window)
    assert kv_cache_bytes(spec, seq, batch, dt) == batch * stored * per_token
    if dt in ("fp32", "fp16", "fp8"):
        assert per_token == 2 * layers * kv_heads * head_dim * {"fp32": 4, "fp16": 2, "fp8": 1}[dt]
    if spec.num_heads % tp == 0:
        per_gpu = kv_bytes_per_token(spec, dt, tp=tp)
        copies = max(1, tp // kv_heads)  # each KV head lives on this many GPUs
        assert tp * per_gpu == copies * per_token


# --- input validation (review findings) --------------------------------------------------------
@pytest.mark.parametrize("kwargs, words", [
    (dict(bits=0), "bits must be an int >= 1, got 0"),
    (dict(bits=-8), "got -8"),
    (dict(bits=8.0), "got 8.0"),
    (dict(bits=True), "got True"),
    (dict(bits=4, group_size=-32, scale_bytes=4), "group_size must be an int >= 1, got -32"),
    (dict(bits=4, group_size=0, scale_bytes=4), "group_size"),
    (dict(bits=8, scale_bytes=-4), "scale_bytes must be an int >= 0, got -4"),
])
def test_kv_dtype_rejects_impossible_sizes(kwargs, words):
    with pytest.raises(ConfigError, match=words) as err:
        KVDType("x", **kwargs)
    assert "'x'" in str(err.value)  # names the dtype too


def test_kv_dtype_accepts_numpy_integers():
    np = pytest.importorskip("numpy")
    dt = KVDType("int4-g32", np.int64(4), group_size=np.int32(32), scale_bytes=np.uint8(4))
    assert type(dt.bits) is int and type(dt.group_size) is int and type(dt.scale_bytes) is int
    vectors = 2 * 32 * 8  # Llama-3-8B: K and V, 32 layers, 8 KV heads, 128 elements each
    assert kv_bytes_per_token("Llama-3-8B", dt) == vectors * (128 // 2 + 4 * 128 // 32)


def test_dtype_names_are_case_insensitive_for_weights_and_kv():
    assert weights_bytes("Llama-2-7B", "FP16") == weights_bytes("Llama-2-7B", "fp16") == 6_738_415_616 * 2
    assert weights_bytes("Llama-2-7B", " Int4 ") == 6_738_415_616 // 2
    assert kv_bytes_per_token("Llama-3-8B", "FP16") == kv_bytes_per_token("Llama-3-8B", "fp16")
    p = plan_memory("Llama-3-8B", "H100", 1024, weights_dtype="BF16", kv_dtype="FP8")
    assert (p.weights_dtype, p.kv_dtype) == ("bf16", "fp8")
    assert model_preset("Llama-3-8B").replace(weights_dtype="BF16").weights_dtype == "bf16"
    with pytest.raises(ConfigError, match="'fp6'"):
        model_preset("Llama-3-8B").replace(weights_dtype="fp6")


@pytest.mark.parametrize("model, tp", [("Llama-3-8B", 3), ("Llama-3-8B", 64),
                                       (ModelSpec("odd", 2, 96, 12, 6, 8, 10), 4)])
def test_weights_and_kv_apply_the_same_tp_rule(model, tp):
    with pytest.raises(ConfigError, match=f"tp={tp}"):
        kv_bytes_per_token(model, tp=tp)
    with pytest.raises(ConfigError, match=f"tp={tp}"):
        weights_bytes(model, tp=tp)


def test_weights_bytes_valid_tp_including_replicated_kv_heads():
    # Llama-3.1-405B: 8 KV heads over 16 GPUs is valid for the cache, so for the weights too
    n = model_preset("Llama-3.1-405B").num_params
    assert weights_bytes("Llama-3.1-405B", tp=16) == -(-n * 2 // 16)


def test_counts_accept_numpy_integers_and_give_python_ints():
    np = pytest.importorskip("numpy")
    assert kv_cache_bytes("Llama-3-8B", np.int64(8192), np.int32(2)) == 2 * GiB
    assert kv_bytes_per_token("Llama-3-70B", tp=np.int64(8)) == 2 * 80 * 1 * 128 * 2
    assert weights_bytes("Llama-3-70B", tp=np.int16(8)) == math.ceil(70_553_706_496 * 2 / 8)
    assert kv_slots("OPT-13B", np.int64(12 * GiB)) == 12 * GiB // 819_200
    p = plan_memory("Llama-3-8B", "A100-80GB", np.int64(8192), np.int64(16), tp=np.int64(1),
                    block_size=np.int64(16), reserve_fraction=np.float64(0.1))
    assert p == plan_memory("Llama-3-8B", "A100-80GB", 8192, 16, block_size=16)
    assert all(type(v) is int for v in (p.seq_len, p.batch_size, p.tp, p.reserve_bytes))
    spec = ModelSpec("np", np.int64(2), np.int64(64), np.int64(4), np.int64(2), np.int64(16),
                     np.int64(100), max_position=np.int64(512))
    assert type(spec.num_layers) is int and spec.max_position == 512
    assert kv_bytes_per_token(spec) == 2 * 2 * 2 * 16 * 2


@pytest.mark.parametrize("call", [
    lambda np: kv_cache_bytes("Llama-3-8B", np.bool_(True), 1),
    lambda np: kv_cache_bytes("Llama-3-8B", np.float64(8.0), 1),
    lambda np: kv_cache_bytes("Llama-3-8B", 8, False),
    lambda np: kv_bytes_per_token("Llama-3-8B", tp=True),
    lambda np: kv_bytes_per_token("Llama-3-8B", tp=2.0),
    lambda np: weights_bytes("Llama-3-8B", tp=np.float32(2)),
    lambda np: kv_slots("OPT-13B", 1.5e9),
    lambda np: plan_memory("Llama-3-8B", "T4", "8192"),
    lambda np: plan_memory("Llama-3-8B", "T4", 8, block_size=16.0),
    lambda np: ModelSpec("f", 2.0, 64, 4, 2, 16, 100),
    lambda np: ModelSpec("f", 2, 64, 4, 2, 16, 100, max_position=0),
    lambda np: ModelSpec("f", 2, 64, 4, 2, 16, 100, sliding_window=1.5, sliding_layers=2),
])
def test_bools_floats_and_strings_are_not_counts(call):
    np = pytest.importorskip("numpy")
    with pytest.raises(ConfigError, match="must be an int"):
        call(np)


@pytest.mark.parametrize("reserve", ["0.1", None, True, float("nan"), -0.1, 1])
def test_reserve_fraction_must_be_a_number_in_range(reserve):
    with pytest.raises(ConfigError, match="reserve_fraction") as err:
        plan_memory("Llama-3-8B", "T4", 8, reserve_fraction=reserve)
    assert repr(reserve) in str(err.value)


def test_plan_says_when_the_context_is_beyond_the_model():
    inside = plan_memory("Llama-2-7B", "A100-80GB", 4096)
    beyond = plan_memory("Llama-2-7B", "A100-80GB", 4097)
    assert inside.max_position == beyond.max_position == 4096  # meta-llama/Llama-2-7b-hf
    assert inside.within_max_context and not beyond.within_max_context
    assert "beyond" not in inside.summary() and "maximum context (4,096)" in beyond.summary()
    assert model_preset("OPT-13B").within_max_context(2048)
    assert not model_preset("OPT-13B").within_max_context(2049)


def test_format_bytes_auto_picks_a_readable_unit():
    assert format_bytes(512, "auto") == "512 B"
    assert format_bytes(6 * 2**20, "auto") == f"6.00 MiB ({6 * 2**20 / 10**6:.2f} MB)"
    assert format_bytes(3 * 2**10, "auto") == "3.00 KiB (3.07 KB)"
    assert format_bytes(160 * GiB, "auto") == format_bytes(160 * GiB) == "160.00 GiB (171.80 GB)"


def test_tokens_to_reach_a_size():
    # Llama-2-7B (MHA, no window): 2 x 32 layers x 32 heads x 128 x 2 B = 524,288 B per token
    w = weights_bytes("Llama-2-7B")
    assert tokens_to_reach("Llama-2-7B", w) == math.ceil(w / 524_288)
    assert tokens_to_reach("Llama-2-7B", w, batch_size=8) == math.ceil(w / (8 * 524_288))
    assert tokens_to_reach("Llama-2-7B", 0) == 0 and tokens_to_reach("Llama-2-7B", 1) == 1
    # Mistral-7B: every layer slides over 4,096 tokens, 131,072 B per token: capped at 512 MiB
    assert tokens_to_reach("Mistral-7B", 1000 * 131_072) == 1000
    assert tokens_to_reach("Mistral-7B", 4096 * 131_072) == 4096
    assert tokens_to_reach("Mistral-7B", 4096 * 131_072 + 1) is None
    # Gemma-2-9B: 21 global + 21 sliding layers (4,096) of 2 x 8 x 256 x 2 B per token
    per_layer, g = 8192, weights_bytes("Gemma-2-9B")
    assert tokens_to_reach("Gemma-2-9B", g) == math.ceil(g / (21 * per_layer)) - 4096
    with pytest.raises(ConfigError, match="batch_size"):
        tokens_to_reach("Llama-2-7B", w, batch_size=0)


def test_pipeline_parallel_splits_layers_without_replication():
    """Llama-3.1-405B: 126 layers, 8 KV heads of 128.  TP=16 replicates each head twice
    (126 x 2 x 1 x 128 x 2 B per GPU); TP=8 x PP=2 gives each GPU 63 layers of one head."""
    assert kv_bytes_per_token("Llama-3.1-405B", tp=16) == 126 * 2 * 1 * 128 * 2 == 64_512
    assert kv_bytes_per_token("Llama-3.1-405B", tp=8, pp=2) == 63 * 2 * 1 * 128 * 2 == 32_256
    # summed over the 16 GPUs: PP keeps the model's own bytes, TP=16 doubles them
    assert 16 * 32_256 == kv_bytes_per_token("Llama-3.1-405B")
    p = memory.plan_memory("Llama-3.1-405B", "H100-80GB", 8192, 1, tp=8, pp=2)
    assert p.pp == 2 and p.weights_bytes == memory.weights_bytes("Llama-3.1-405B", tp=16)
    # an odd layer count: the busiest stage holds ceil(61 / 2) = 31 layers
    assert memory.layers_per_stage(memory.model_preset("DeepSeek-V3"), 2) == (31, 0)
    with pytest.raises(ConfigError, match="pp=64"):
        kv_bytes_per_token("Llama-3-8B", pp=64)
