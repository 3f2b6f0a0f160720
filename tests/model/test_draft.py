"""truncated_draft: the target's first layers with its norm and head, sharing the target's storage;
checked against a forward pass written out by hand from the target's own modules."""

import pytest
import torch

from paged_kv.errors import ConfigError
from paged_kv.model import TinyLlama, truncated_draft
from paged_kv.model.llama import rope_cos_sin
from paged_kv.model.attention import AttentionMetadata


def by_hand(model, ids, n):
    """The target's forward pass stopped after layer n - 1, then its norm and head."""
    B, T = ids.shape
    meta = AttentionMetadata.for_prefill(torch.full((B,), T, dtype=torch.int32), T)
    x = model.embed_tokens(ids)
    cos, sin = rope_cos_sin(meta.positions, model.cfg.head_dim, model.cfg.rope_theta, x.dtype)
    for layer in list(model.layers)[:n]:
        x = layer(x, cos, sin, meta, None, "torch")
    return model.lm_head(model.norm(x)).float()


@pytest.mark.parametrize("n", [1, 2])
def test_draft_is_the_first_layers(small_model, n):
    draft = truncated_draft(small_model, n)
    ids = torch.randint(0, small_model.cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(n))
    with torch.no_grad():
        torch.testing.assert_close(draft(ids), by_hand(small_model, ids, n))
    assert draft.cfg.num_layers == n and len(draft.layers) == n
    assert {f: getattr(draft.cfg, f) for f in ("hidden_size", "vocab_size", "num_kv_heads")} == \
        {f: getattr(small_model.cfg, f) for f in ("hidden_size", "vocab_size", "num_kv_heads")}


def test_all_layers_equal_the_target(small_model):
    ids = torch.randint(0, small_model.cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(truncated_draft(small_model, small_model.cfg.num_layers)(ids), small_model(ids))


def test_weights_are_shared_not_copied(small_model):
    draft = truncated_draft(small_model, 1)
    target = dict(small_model.named_parameters())
    for name, p in draft.named_parameters():
        assert p is target[name] and p.data_ptr() == target[name].data_ptr(), name
    assert len(dict(draft.named_parameters())) < len(target)   # the second layer is not the draft's
    before = sum(p.numel() for p in small_model.parameters())
    with torch.no_grad():                                       # a change to the target is the draft's
        small_model.norm.weight.mul_(2.0)
        try:
            assert torch.equal(draft.norm.weight, small_model.norm.weight)
        finally:
            small_model.norm.weight.div_(2.0)
    assert sum(p.numel() for p in small_model.parameters()) == before


def test_mode_follows_the_target(small_model):
    assert not truncated_draft(small_model, 1).training


@pytest.mark.parametrize("bad", [0, 3, -1, 1.0, True, "1"])
def test_bad_layer_counts(small_model, bad):
    with pytest.raises(ConfigError):
        truncated_draft(small_model, bad)


def test_not_a_model():
    with pytest.raises(ConfigError, match="needs a TinyLlama"):
        truncated_draft(torch.nn.Linear(2, 2), 1)
