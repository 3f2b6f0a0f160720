"""paged-kv: the package behind the book on KV-cache memory management.

Importing it first runs :mod:`kernels._runtime`, which switches on the Triton interpreter when
there is no GPU (before any kernel is defined).  See the README's "Architecture" section for the
map of modules.
"""

import kernels._runtime  # noqa: F401  (device/dtype policy and interpreter switch come first)

from .attention import AttentionMetadata
from .block_allocator import BlockAllocator
from .blocks import BlockSpaceManager, BlockTable, blocks_needed
from .caches import ContiguousKVCache
from .checkpoint import load_checkpoint, load_tiny_model, save_checkpoint
from .config import ModelConfig
from .errors import (BlockError, CacheError, ConfigError, DTypeNotSupportedError, KernelUnavailableError,
                     OutOfBlocksError, PagedKVError, PromptError, TensorError, UnknownPresetError)
from .generate import GenerationResult, generate
from .history import BlockHistory, paper_trace
from .memory import (kv_bytes_per_token, kv_cache_bytes, max_batch_size, max_tokens, plan_memory,
                     weights_bytes)
from .model import TinyLlama, load_hf_state_dict
from .paged_cache import PagedKVCache
from .presets import GPUSpec, ModelSpec, gpu_preset, model_preset
from .sampling import SamplingParams, sample
from .tokenizer import ByteTokenizer

__version__ = "0.1.0"

__all__ = [
    "AttentionMetadata", "BlockAllocator", "BlockError", "BlockHistory", "BlockSpaceManager",
    "BlockTable", "GPUSpec", "ModelSpec", "PagedKVCache", "blocks_needed", "gpu_preset",
    "kv_bytes_per_token", "kv_cache_bytes", "max_batch_size", "max_tokens", "model_preset",
    "paper_trace", "plan_memory", "weights_bytes", "ByteTokenizer", "CacheError", "ConfigError",
    "ContiguousKVCache", "DTypeNotSupportedError", "GenerationResult", "KernelUnavailableError",
    "ModelConfig", "OutOfBlocksError", "PagedKVError", "PromptError", "SamplingParams", "TensorError",
    "TinyLlama", "UnknownPresetError", "generate", "load_checkpoint", "load_hf_state_dict",
    "load_tiny_model", "sample", "save_checkpoint",
]
