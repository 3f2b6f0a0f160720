"""The checkpoint (paged_kv.model.checkpoint): save/load round trip, tied weights stored once,
the bundled weights, and readable errors for broken folders."""

import json

import pytest
import torch
from safetensors import safe_open

from paged_kv.errors import ConfigError
from paged_kv.model import (ByteTokenizer, ModelConfig, TinyLlama, load_checkpoint, load_tiny_model,
                            save_checkpoint, weights_dir)


def test_round_trip_keeps_the_logits(small_model, tmp_path):
    save_checkpoint(small_model, tmp_path, dtype=torch.float32, meta={"steps": 7})
    loaded = load_checkpoint(tmp_path)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(loaded(ids), small_model(ids)) and not loaded.training
    assert json.loads((tmp_path / "config.json").read_text()) == small_model.cfg.to_dict()
    with safe_open(str(tmp_path / "tiny-shakespeare.safetensors"), "pt") as f:
        assert f.metadata() == {"steps": "7"}
        assert "lm_head.weight" not in f.keys()        # tied to the embedding: stored once
        assert f.get_tensor("embed_tokens.weight").dtype == torch.float32


def test_fp16_checkpoint_loads_in_the_asked_dtype(small_model, tmp_path):
    save_checkpoint(small_model, tmp_path)                 # fp16 on disk, as shipped
    loaded = load_checkpoint(tmp_path, dtype=torch.float32)
    assert loaded.dtype == torch.float32
    diff = (loaded.embed_tokens.weight - small_model.embed_tokens.weight).abs().max()
    assert 0 < diff < 1e-3                                  # fp16 rounding, nothing more


def test_the_bundled_model_loads_with_its_tokenizer():
    model, tok = load_tiny_model()
    cfg = ModelConfig.from_json(weights_dir() / "config.json")
    assert isinstance(model, TinyLlama) and isinstance(tok, ByteTokenizer)
    assert model.cfg == cfg and not model.training
    assert sum(p.numel() for p in model.parameters()) == cfg.num_parameters()
    assert weights_dir().parts[-3:] == ("paged_kv", "model", "weights")


def test_missing_files_and_mismatched_keys_raise(small_model, tmp_path):
    with pytest.raises(ConfigError, match="no tiny-shakespeare.safetensors"):
        load_checkpoint(tmp_path)
    save_checkpoint(small_model, tmp_path)
    cfg = small_model.cfg.to_dict() | {"num_layers": small_model.cfg.num_layers + 1}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="checkpoint keys differ from the config"):
        load_checkpoint(tmp_path)


def test_the_model_card_states_the_context_and_its_loss_per_position():
    """The card's per-position table covers exactly the context the config declares (its numbers
    come from scripts/position_loss.py on the shipped weights; this checks their frame, cheaply)."""
    import re
    cfg = ModelConfig.from_json(weights_dir() / "config.json")
    card = (weights_dir() / "MODEL_CARD.md").read_text()
    assert f"`max_seq_len` {cfg.max_seq_len} tokens" in card
    inside = card.split("**Held-out loss by position**")[1].split("**Past the context**")[0]
    bands = [(int(a), int(b)) for a, b in re.findall(r"^\| (\d+)–(\d+) \|", inside, re.M)]
    assert bands[0][0] == 0 and bands[-1][1] == cfg.max_seq_len - 1
    assert all(b[0] == a[1] + 1 for a, b in zip(bands, bands[1:]))   # contiguous, no gap
