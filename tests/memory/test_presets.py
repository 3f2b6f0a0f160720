"""Presets (paged_kv.presets): parameter counts against Hugging Face's own model classes built on
the ``meta`` device (no memory), the KV formula against transformers' real cache tensors, and
published totals.
"""

import pytest
import torch

from paged_kv.memory import kv_bytes_per_token, weights_bytes
from paged_kv.memory import MODEL_PRESETS, ModelSpec, model_preset
from paged_kv.memory.spec import deepseek_v3_num_parameters, gpt_oss_num_parameters, qwen3_moe_num_parameters

transformers = pytest.importorskip("transformers")


def _meta_count(config) -> int:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    extra = sum(b.numel() for n, b in model.named_buffers() if "e_score_correction_bias" in n)
    return sum(p.numel() for p in model.parameters()) + extra  # the router bias ships in the checkpoint


# Each preset's shape, re-typed from its config.json, built with transformers' own class.
HF_CONFIGS = {
    "Llama-2-7B": lambda: transformers.LlamaConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32),
    "Llama-2-70B": lambda: transformers.LlamaConfig(
        vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8),
    "Llama-3-8B": lambda: transformers.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8),
    "Mistral-7B": lambda: transformers.MistralConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, sliding_window=4096),
    "Gemma-2-9B": lambda: transformers.Gemma2Config(
        vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256),
    "Qwen2.5-72B": lambda: transformers.Qwen2Config(
        vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False),
    "Qwen3-4B": lambda: transformers.Qwen3Config(
        vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "Qwen3-0.6B": lambda: transformers.Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "OPT-13B": lambda: transformers.OPTConfig(
        vocab_size=50272, hidden_size=5120, ffn_dim=20480, num_hidden_layers=40,
        num_attention_heads=40, max_position_embeddings=2048, word_embed_proj_dim=5120),
}


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_parameter_count_equals_transformers(name):
    assert MODEL_PRESETS[name].num_params == _meta_count(HF_CONFIGS[name]())


def test_deepseek_v3_formula_equals_transformers_at_small_scale():
    sizes = dict(vocab=1000, hidden=256, layers=4, heads=4, q_lora_rank=64, kv_lora_rank=32,
                 qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, intermediate=512,
                 moe_intermediate=64, n_routed_experts=8, n_shared_experts=1, first_k_dense=1)
    cfg = transformers.DeepseekV3Config(
        vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, intermediate_size=512, moe_intermediate_size=64,
        n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1, num_experts_per_tok=2,
        n_group=1, topk_group=1, tie_word_embeddings=False)
    assert deepseek_v3_num_parameters(**sizes) == _meta_count(cfg)


def test_qwen3_moe_formula_equals_transformers_at_small_scale():
    sizes = dict(vocab=1000, hidden=64, layers=3, heads=4, kv_heads=2, head_dim=32, moe_intermediate=48,
                 n_experts=8)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, moe_intermediate_size=48, num_experts=8, num_experts_per_tok=2, intermediate_size=96,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)
    assert qwen3_moe_num_parameters(**sizes) == _meta_count(cfg)


def test_gpt_oss_formula_equals_transformers_at_small_scale():
    sizes = dict(vocab=1000, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=48, n_experts=4)
    cfg = transformers.GptOssConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)
    assert gpt_oss_num_parameters(**sizes) == _meta_count(cfg)


def test_published_totals():
    # PEFT's print_trainable_parameters on Llama-2-7b-hf; Meta's model cards; DeepSeek-V3 "671B"
    assert MODEL_PRESETS["Llama-2-7B"].num_params == 6_738_415_616
    assert MODEL_PRESETS["Llama-3-8B"].num_params == 8_030_261_248
    assert MODEL_PRESETS["Llama-3.1-8B"].num_params == 8_030_261_248  # the same shape, a longer context
    assert MODEL_PRESETS["Llama-3.1-405B"].num_params == 405_853_388_800
    assert round(MODEL_PRESETS["DeepSeek-V3"].num_params / 1e9) == 671
    assert round(MODEL_PRESETS["Qwen2.5-72B"].num_params / 1e8) == 727  # "72.7B"
    assert round(MODEL_PRESETS["gpt-oss-120b"].num_params / 1e8) == 1168  # model card: "116.8B" total
    assert round(MODEL_PRESETS["Qwen3-Coder-30B-A3B"].num_params / 1e8) == 305  # "30.5B"
    assert round(weights_bytes("OPT-13B") / 1e9) == 26  # the vLLM paper's Table 1: 26 GB


@pytest.mark.parametrize("hf_cls, kw", [
    ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2)),        # GQA
    ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=1)),        # MQA
    ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=48)),  # D != C / H
])
def test_formula_equals_transformers_cache_tensors(hf_cls, kw):
    cfg = getattr(transformers, hf_cls)(vocab_size=64, hidden_size=64, intermediate_size=64,
                                        num_hidden_layers=3, **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.float16).eval()
    tokens = 11
    with torch.no_grad():
        out = model(torch.randint(0, 64, (2, tokens)), use_cache=True)
    cache = out.past_key_values
    nbytes = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    spec = ModelSpec("hf", num_layers=3, hidden_size=64, num_heads=kw["num_attention_heads"],
                     num_kv_heads=kw["num_key_value_heads"],
                     head_dim=kw.get("head_dim", 64 // kw["num_attention_heads"]), num_params=1)
    assert nbytes == 2 * tokens * kv_bytes_per_token(spec, "fp16")


def test_every_preset_names_its_source():
    for name, spec in MODEL_PRESETS.items():
        assert spec.source, name
        assert model_preset(name) == spec
