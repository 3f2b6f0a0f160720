"""Shared fixtures. Importing paged_kv first switches on the Triton interpreter (no GPU here)."""

import paged_kv  # noqa: F401  (must come before anything imports triton)
import pytest
import torch

from paged_kv.config import ModelConfig
from paged_kv.model import TinyLlama


@pytest.fixture(scope="session")
def small_cfg() -> ModelConfig:
    """A small random model config: GQA (4 query heads, 2 KV heads), head_dim 16."""
    return ModelConfig(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                       intermediate_size=128, max_seq_len=128)


@pytest.fixture(scope="session")
def small_model(small_cfg) -> TinyLlama:
    torch.manual_seed(0)
    return TinyLlama(small_cfg).eval()
