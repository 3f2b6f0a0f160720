"""paged-kv: the package behind the book on KV-cache memory management.

The package is in layers, one subpackage each (the README's "Architecture" section is the map):
leaves (:mod:`errors`, :mod:`validate`, :mod:`units`, :mod:`defaults`, :mod:`sampling_params`) at
the bottom; the pure-Python
bookkeeping (:mod:`memory`, :mod:`blocks`, :mod:`scheduling`, :mod:`sim`); the tensors
(:mod:`model`, :mod:`storage`, :mod:`decoding`, :mod:`engine`); and on top the figures
(:mod:`viz`) and live panels (:mod:`widgets`).

``import paged_kv`` is cheap: the names below, those two or more chapters use and every exception,
are imported on first use (``lazy_loader``), so ``import paged_kv.sim`` does not load torch and
``kernels`` can import the leaves without loading the model.  Everything else is imported from its
subpackage, whose ``__init__`` lists the layer's API.
"""

import lazy_loader as _lazy

__version__ = "0.1.0"

# "storage" is a submodule here too: engine modules name it with lazy_loader.load (torch, on first
# use), which leaves it in sys.modules unbound, and ``paged_kv.storage`` must still find it.
__getattr__, __dir__, __all__ = _lazy.attach(__name__, submodules=["storage"], submod_attrs={
    "errors": ["AdmissionError", "BlockError", "CacheError", "ConfigError", "DTypeNotSupportedError", "KernelUnavailableError",
               "OutOfBlocksError", "PagedKVError", "PromptError", "TensorError", "UnknownPresetError"],
    "units": ["GB", "GiB", "format_bytes"],
    "defaults": ["BLOCK_SIZE"],
    "sampling_params": ["SamplingParams"],
    "model": ["ByteTokenizer", "ModelConfig", "TinyLlama", "load_tiny_model"],
    "memory": ["gpu_preset", "kv_bytes_per_token", "model_preset", "plan_memory", "weights_bytes"],
    "blocks": ["BlockAllocator", "BlockSpaceManager", "BlockTable", "blocks_needed"],
    "storage": ["ContiguousKVCache", "PagedKVCache"],
    "decoding": ["forward_flops", "generate", "profile_decoding"],
    "sim": ["simulate", "synthetic_trace"],
    "engine": ["EngineConfig", "LLMEngine"],
})
__all__.remove("storage")             # a layer, not one of the shared names (the same list __dir__ returns)
