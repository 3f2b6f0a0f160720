"""Held-out loss by position (paged_kv.model.evaluation), against a brute force: one forward pass
per prefix, so a band's mean cannot come from the same batched code it checks."""

import pytest
import torch
import torch.nn.functional as F

from paged_kv.errors import ConfigError, PromptError
from paged_kv.model.evaluation import loss_by_position


def test_bands_match_one_prefix_at_a_time(small_model):
    torch.manual_seed(1)
    data = torch.randint(0, small_model.cfg.vocab_size, (3 * 12 + 5,))
    bands = loss_by_position(small_model, data, window=12, band=4, max_windows=3, batch=2)
    assert [(b.start, b.end, b.predictions) for b in bands] == [(0, 4, 12), (4, 8, 12), (8, 12, 12)]
    per_pos = torch.zeros(12, dtype=torch.float64)
    with torch.no_grad():
        for w in range(3):
            for p in range(12):
                prefix = data[w * 12: w * 12 + p + 1][None]          # tokens 0..p of window w
                logits = small_model(prefix)[0, -1]
                per_pos[p] += F.cross_entropy(logits[None], data[w * 12 + p + 1][None]).double()
    expected = (per_pos / 3).view(3, 4).mean(1)
    assert [b.loss for b in bands] == pytest.approx(expected.tolist(), rel=1e-5)


def test_max_windows_caps_what_is_read(small_model):
    data = torch.arange(40) % small_model.cfg.vocab_size
    one = loss_by_position(small_model, data, window=8, band=8, max_windows=1)
    again = loss_by_position(small_model, data[:9], window=8, band=8)   # the first window alone
    assert one[0].predictions == 8 and one[0].loss == pytest.approx(again[0].loss)


def test_refusals(small_model):
    data = torch.zeros(50, dtype=torch.long)
    with pytest.raises(ConfigError, match="band 5 must divide window 12"):
        loss_by_position(small_model, data, window=12, band=5)
    with pytest.raises(ConfigError, match="fewer than one window"):
        loss_by_position(small_model, data[:12], window=12, band=4)
    with pytest.raises(ConfigError, match="1-D"):
        loss_by_position(small_model, data[None], window=12, band=4)
    too_long = small_model.cfg.max_seq_len + 4
    with pytest.raises(PromptError, match="past the model's max_seq_len"):
        loss_by_position(small_model, torch.zeros(too_long + 1, dtype=torch.long), window=too_long, band=4)
