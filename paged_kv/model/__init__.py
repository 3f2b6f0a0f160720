"""The model layer: the tiny Llama the book decodes, its config, tokenizer, weights and sampling.

* :mod:`~paged_kv.model.config`: :class:`ModelConfig`, sizes with units (reads HF Llama configs);
* :mod:`~paged_kv.model.reduction_order`: :class:`ReductionOrder`, the order of a pass's sums (the
  torch path that follows it: :mod:`~paged_kv.model.reduction`);
* :mod:`~paged_kv.model.tokenizer`: :class:`ByteTokenizer`, UTF-8 bytes as tokens;
* :mod:`~paged_kv.model.attention`: :class:`AttentionMetadata` (what one forward pass attends to)
  and the torch/triton attention backends;
* :mod:`~paged_kv.model.llama`: :class:`TinyLlama` (RMSNorm, RoPE, GQA, SwiGLU; HF-compatible names);
* :mod:`~paged_kv.model.draft`: :func:`truncated_draft`, the first layers as a draft model (shared weights);
* :mod:`~paged_kv.model.checkpoint`: the bundled checkpoint in ``weights/``, :func:`load_tiny_model`;
* :mod:`~paged_kv.model.sampling`: :func:`sample`, :func:`probabilities` (apply a :class:`~paged_kv.sampling_params.SamplingParams`).

The model does not know which cache it writes to: a cache object (``paged_kv.storage``) is passed
to its forward pass with the metadata.

The names below are imported on first use (``lazy_loader``, as ``paged_kv`` does): ``config``,
``tokenizer`` and ``reduction_order`` need neither torch nor numpy, so ``from paged_kv.model
import ByteTokenizer`` runs where torch is absent (the browser build); the rest load torch.
"""

import lazy_loader as _lazy

from ..sampling_params import SamplingParams

# "sampling" and "draft" are submodules here too: engine.live and engine.llm_engine name them with
# lazy_loader.load (torch, on first use), which leaves them in sys.modules unbound, and
# ``paged_kv.model.sampling`` must still find it.
__getattr__, __dir__, __all__ = _lazy.attach(__name__, submodules=["sampling", "draft"], submod_attrs={
    "attention": ["BACKENDS", "AttentionMetadata", "check_backend", "decode_attention", "prefill_attention"],
    "checkpoint": ["load_checkpoint", "load_tiny_model", "save_checkpoint", "weights_dir"],
    "config": ["ModelConfig"],
    "draft": ["truncated_draft"],
    "llama": ["TinyLlama", "load_hf_state_dict"],
    "reduction_order": ["ReductionOrder"],
    "sampling": ["apply_penalties", "probabilities", "sample", "sample_generator"],
    "tokenizer": ["ByteTokenizer"],
})
__all__.remove("sampling")
__all__.remove("draft")
__all__.append("SamplingParams")      # the same list __dir__ returns
