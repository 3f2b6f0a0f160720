"""The model layer: the tiny Llama the book decodes, its config, tokenizer, weights and sampling.

* :mod:`~paged_kv.model.config`: :class:`ModelConfig`, sizes with units (reads HF Llama configs);
* :mod:`~paged_kv.model.tokenizer`: :class:`ByteTokenizer`, UTF-8 bytes as tokens;
* :mod:`~paged_kv.model.attention`: :class:`AttentionMetadata` (what one forward pass attends to)
  and the torch/triton attention backends;
* :mod:`~paged_kv.model.llama`: :class:`TinyLlama` (RMSNorm, RoPE, GQA, SwiGLU; HF-compatible names);
* :mod:`~paged_kv.model.checkpoint`: the bundled checkpoint in ``weights/``, :func:`load_tiny_model`;
* :mod:`~paged_kv.model.sampling`: :func:`sample` (applies a :class:`~paged_kv.sampling_params.SamplingParams`).

The model does not know which cache it writes to: a cache object (``paged_kv.storage``) is passed
to its forward pass with the metadata.
"""

from .attention import BACKENDS, AttentionMetadata, check_backend, decode_attention, prefill_attention
from .checkpoint import load_checkpoint, load_tiny_model, save_checkpoint, weights_dir
from .config import ModelConfig
from .llama import TinyLlama, load_hf_state_dict
from ..sampling_params import SamplingParams
from .sampling import apply_penalties, sample, sample_generator
from .tokenizer import ByteTokenizer

__all__ = ["AttentionMetadata", "BACKENDS", "ByteTokenizer", "ModelConfig", "SamplingParams", "TinyLlama",
           "check_backend", "decode_attention", "load_checkpoint", "load_hf_state_dict", "load_tiny_model",
           "prefill_attention", "apply_penalties", "sample", "sample_generator", "save_checkpoint", "weights_dir"]
