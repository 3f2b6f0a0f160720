"""A draft model for speculative decoding: the target's own first layers, its final norm and head.

Speculative decoding (Leviathan et al., ICML 2023, §3; Chen et al. 2023) needs a cheaper model of
the same tokenizer to propose tokens the target then verifies.  The cheapest one that needs no
training and no second checkpoint is the target truncated: its first ``n`` decoder layers, then its
own final norm and LM head (the idea of early-exit and self-speculative drafting, e.g. Zhang et
al., "Draft & Verify", 2023, and LayerSkip, Elhoushi et al. 2024, which train for it; the bundled
model was not, so its early exits are weaker drafts than a trained one would be: the loss the
script ``scripts/spec_decode_draft.py`` prints says how much).

The draft *shares* the target's parameters: no tensor is copied, so it costs no memory beyond its
own KV cache, and any change to the target's weights is the draft's too (``tests/model/test_draft.py``
checks the storage is the same).  Being a :class:`~paged_kv.model.TinyLlama` with a config of
``n`` layers, it runs with every cache and backend the target does; its KV cache has ``n`` layers.
"""

from __future__ import annotations

import dataclasses

import torch.nn as nn

from ..errors import ConfigError
from ..validate import count
from .llama import TinyLlama

__all__ = ["truncated_draft"]


def truncated_draft(model: TinyLlama, num_layers: int) -> TinyLlama:
    """The first ``num_layers`` decoder layers of ``model`` plus its final norm and LM head.

    The result is a :class:`TinyLlama` whose ``cfg`` is ``model.cfg`` with ``num_layers`` replaced
    and whose modules *are* the target's (the embedding, layers ``0 .. num_layers - 1``, the norm
    and the head): weights shared, not copied; ``forward`` is the target's loop over fewer layers.
    Each layer keeps its index, so a draft's KV cache of ``num_layers`` layers is addressed
    exactly as the target's first layers.  It is put in the target's train/eval mode.

    Args:
        model: the target model.
        num_layers: decoder layers kept, ``1 <= num_layers <= model.cfg.num_layers`` (all of
            them gives a model equal to the target, sharing everything).

    Raises:
        ConfigError: ``model`` not a :class:`TinyLlama`, or ``num_layers`` not an int in range.
    """
    if not isinstance(model, TinyLlama):
        raise ConfigError(f"truncated_draft needs a TinyLlama, got {type(model).__name__}")
    n = count("num_layers (draft decoder layers)", num_layers, 1)
    if n > model.cfg.num_layers:
        raise ConfigError(f"a draft of {n} layers: the target has only {model.cfg.num_layers}")
    draft = TinyLlama.__new__(TinyLlama)       # skip __init__: it would allocate and initialise weights
    nn.Module.__init__(draft)
    draft.cfg = dataclasses.replace(model.cfg, num_layers=n)
    draft.embed_tokens = model.embed_tokens
    draft.layers = nn.ModuleList(model.layers[:n])
    draft.norm = model.norm
    draft.lm_head = model.lm_head
    return draft.train(model.training)
