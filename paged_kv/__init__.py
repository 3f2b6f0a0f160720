"""paged-kv: the package behind the book on KV-cache memory management.

Importing it first runs :mod:`kernels._runtime`, which switches on the Triton interpreter when
there is no GPU (before any kernel is defined).  See the README's "Architecture" section for the
map of modules.
"""

import kernels._runtime  # noqa: F401  (device/dtype policy and interpreter switch come first)

from .attention import AttentionMetadata
from .caches import ContiguousKVCache
from .checkpoint import load_checkpoint, load_tiny_model, save_checkpoint
from .config import ModelConfig
from .errors import (BlockError, CacheError, ConfigError, DTypeNotSupportedError, KernelUnavailableError,
                     OutOfBlocksError, PagedKVError, PromptError, TensorError, UnknownPresetError)
from .generate import GenerationResult, generate
from .model import TinyLlama, load_hf_state_dict
from .sampling import SamplingParams, sample
from .tokenizer import ByteTokenizer

__version__ = "0.1.0"

__all__ = [
    "AttentionMetadata", "BlockError", "ByteTokenizer", "CacheError", "ConfigError",
    "ContiguousKVCache", "DTypeNotSupportedError", "GenerationResult", "KernelUnavailableError",
    "ModelConfig", "OutOfBlocksError", "PagedKVError", "PromptError", "SamplingParams", "TensorError",
    "TinyLlama", "UnknownPresetError", "generate", "load_checkpoint", "load_hf_state_dict",
    "load_tiny_model", "sample", "save_checkpoint",
]
