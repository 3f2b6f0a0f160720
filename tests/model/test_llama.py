"""TinyLlama against the oracle: transformers' LlamaForCausalLM with the same weights."""

import pytest
import torch

from paged_kv.model import ModelConfig
from paged_kv.errors import ConfigError, PromptError, TensorError
from paged_kv.model import TinyLlama, load_hf_state_dict

transformers = pytest.importorskip("transformers")


def _hf_pair(tie: bool, seed: int = 0):
    hf_cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, tie_word_embeddings=tie, attention_bias=False, mlp_bias=False)
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # HF initialises norms to 1; make them non-trivial so they are tested
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    ours = load_hf_state_dict(TinyLlama(ModelConfig.from_hf(hf_cfg)).eval(), hf.state_dict())
    return hf, ours


@pytest.mark.parametrize("tie", [True, False])
def test_logits_match_transformers(tie):
    hf, ours = _hf_pair(tie)
    ids = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


def test_greedy_tokens_match_transformers():
    hf, ours = _hf_pair(False, seed=3)
    prompt = torch.tensor([[72, 101, 108, 108, 111]])
    with torch.no_grad():
        expected = hf.generate(prompt, max_new_tokens=20, do_sample=False)[0, 5:].tolist()
    from paged_kv.decoding import generate
    for cache in ("recompute", "contiguous"):
        assert generate(ours, [prompt[0].tolist()], 20, cache=cache).tokens[0] == expected


def test_config_from_hf_reads_head_dim():
    cfg = ModelConfig.from_hf({"vocab_size": 151936, "hidden_size": 2560, "num_hidden_layers": 36,
                               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                               "intermediate_size": 9728, "max_position_embeddings": 40960})
    assert cfg.head_dim == 128 and cfg.head_dim != cfg.hidden_size // cfg.num_heads


def test_parameter_count_formula_matches_modules(small_cfg):
    mqa = ModelConfig(vocab_size=50, hidden_size=48, num_layers=3, num_heads=4, num_kv_heads=1, head_dim=16,
                      intermediate_size=80, max_seq_len=32)   # head_dim * heads != hidden_size
    for base in (small_cfg, mqa):
        for tie in (True, False):
            cfg = ModelConfig(**{**base.to_dict(), "tie_embeddings": tie})
            m = TinyLlama(cfg)
            assert cfg.num_parameters() == sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_heads=6, num_kv_heads=4, hidden_size=48), "not divisible by num_kv_heads"),
    (dict(hidden_size=0), "hidden_size"),
    (dict(hidden_size=50, num_heads=4), "hidden_size 50"),
    (dict(head_dim=15), "even"),
    (dict(rms_norm_eps=0.0), "rms_norm_eps"),
    (dict(num_layers=True), "num_layers"),
])
def test_bad_config_raises(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**kwargs)


def test_unknown_state_dict_keys_raise(small_model):
    state = {"model." + k: v for k, v in small_model.state_dict().items()}
    state["model.extra.weight"] = torch.zeros(1)
    with pytest.raises(ConfigError, match="extra"):
        load_hf_state_dict(TinyLlama(small_model.cfg), state)


def test_forward_rejects_bad_input(small_model):
    with pytest.raises(PromptError, match="256"):
        small_model(torch.tensor([[1, 256]]))
    with pytest.raises(TensorError, match="integer"):
        small_model(torch.zeros(1, 3))
    with pytest.raises(PromptError, match="max_seq_len"):
        small_model(torch.zeros(1, small_model.cfg.max_seq_len + 1, dtype=torch.long))


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}


def _hf_cfg(**extra):
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                rms_norm_eps=1e-5, tie_word_embeddings=False)
    return transformers.LlamaConfig(**{**base, **extra})


def _rope_kwargs(rope: dict) -> dict:
    """transformers >= 5 takes RoPE settings as rope_parameters (theta inside), older as rope_scaling."""
    if "rope_parameters" in transformers.LlamaConfig().to_dict():
        return {"rope_parameters": {"rope_theta": 10000.0, **rope}}
    return {"rope_scaling": rope}


def test_llama3_rope_scaling_matches_transformers():
    """Llama-3.1's rope rule (HF rope_type "llama3"): positions up to 40, past the 16-token
    original context, so all three frequency bands (kept, divided, blended) are exercised."""
    hf_cfg = _hf_cfg(**_rope_kwargs(LLAMA3_ROPE))
    torch.manual_seed(5)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    cfg = ModelConfig.from_hf(hf_cfg)
    assert cfg.rope_scaling == (4.0, 1.0, 4.0, 16)
    ours = load_hf_state_dict(TinyLlama(cfg).eval(), hf.state_dict())
    plain = load_hf_state_dict(TinyLlama(ModelConfig.from_hf(_hf_cfg())).eval(), hf.state_dict())
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(ids).logits
        torch.testing.assert_close(ours(ids), expected, atol=2e-5, rtol=1e-5)
        assert (plain(ids) - expected).abs().max() > 1e-3   # the scaling matters: plain RoPE differs


@pytest.mark.parametrize("extra,name", [
    ({"rope_type": "linear", "factor": 2.0}, "linear"),
    ({"rope_type": "dynamic", "factor": 2.0}, "dynamic"),
    ({"rope_type": "yarn", "factor": 2.0}, "yarn"),
])
def test_unimplemented_rope_scaling_is_refused(extra, name):
    with pytest.raises(ConfigError, match=f"rope_type '{name}'"):
        ModelConfig.from_hf({**_hf_cfg().to_dict(), "rope_scaling": extra})


@pytest.mark.parametrize("field,value", [("attention_bias", True), ("mlp_bias", True), ("hidden_act", "gelu"),
                                         ("attn_logit_softcapping", 50.0), ("partial_rotary_factor", 0.5),
                                         ("sliding_window", 16)])
def test_unimplemented_math_fields_are_refused(field, value):
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_hf({**_hf_cfg().to_dict(), field: value})


def test_rope_scaling_round_trips_and_is_checked():
    cfg = ModelConfig(rope_scaling=(8.0, 1.0, 4.0, 8192))
    assert ModelConfig.from_dict(__import__("json").loads(__import__("json").dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ConfigError, match="high_freq_factor"):
        ModelConfig(rope_scaling=(8.0, 4.0, 1.0, 8192))
    with pytest.raises(ConfigError, match="rope_scaling"):
        ModelConfig(rope_scaling=(8.0, 1.0))
