"""The bundled tiny model: save/load a checkpoint (safetensors + config.json).

The weights in ``paged_kv/model/weights/`` were trained by ``scripts/train_tiny.py`` on Tiny
Shakespeare (see ``paged_kv/model/weights/MODEL_CARD.md`` for data, steps and held-out loss).  They
ship inside the package, so nothing is downloaded at run time.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..defaults import bundled_weights_dir
from ..errors import ConfigError
from .config import ModelConfig
from .llama import TinyLlama
from .tokenizer import ByteTokenizer

WEIGHTS_FILE = "tiny-shakespeare.safetensors"
CONFIG_FILE = "config.json"


def weights_dir() -> Path:
    """Folder of the bundled checkpoint inside the installed package (``paged_kv/model/weights``)."""
    return bundled_weights_dir()


def save_checkpoint(model: TinyLlama, folder: str | Path, dtype=torch.float16, meta: dict | None = None) -> Path:
    """Write ``model`` to ``folder`` as ``config.json`` and safetensors weights in ``dtype``.

    Tied embeddings are stored once (``lm_head.weight`` is omitted).  ``meta`` (str -> str)
    goes into the safetensors header.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()
             if not (model.cfg.tie_embeddings and k == "lm_head.weight")}
    save_file(state, str(folder / WEIGHTS_FILE), metadata={k: str(v) for k, v in (meta or {}).items()})
    (folder / CONFIG_FILE).write_text(json.dumps(model.cfg.to_dict(), indent=2) + "\n")
    return folder / WEIGHTS_FILE


def load_checkpoint(folder: str | Path, device=None, dtype: torch.dtype = torch.float32) -> TinyLlama:
    """Load a checkpoint written by :func:`save_checkpoint`; weights are cast to ``dtype``.

    Raises ``ConfigError`` if the folder lacks the files or they disagree with each other.
    """
    folder = Path(folder)
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        if not (folder / name).is_file():
            raise ConfigError(f"no {name} in checkpoint folder {folder}")
    cfg = ModelConfig.from_json(folder / CONFIG_FILE)
    model = TinyLlama(cfg)
    state = load_file(str(folder / WEIGHTS_FILE))
    if cfg.tie_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    expected = model.state_dict()
    if set(state) != set(expected):
        raise ConfigError(f"checkpoint keys differ from the config: "
                          f"{sorted(set(state) ^ set(expected))[:6]}")
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.to(device=device or "cpu", dtype=dtype).eval()


def load_tiny_model(device=None, dtype: torch.dtype = torch.float32):
    """The book's bundled model and its tokenizer: ``(TinyLlama, ByteTokenizer)``, in eval mode."""
    return load_checkpoint(weights_dir(), device=device, dtype=dtype), ByteTokenizer()
