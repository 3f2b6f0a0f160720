"""The KV-sizing layer (chapter 3): how many bytes the KV cache takes, and what fits on a GPU.

Pure Python (no torch), so the static calculator can run where torch does not.  Modules:

* :mod:`~paged_kv.memory.kv_dtype`: bytes per cached element (fp16, fp8, int8/int4 with scales);
* :mod:`~paged_kv.memory.spec`: :class:`ModelSpec`, :class:`GPUSpec`, parameter-count formulas;
* :mod:`~paged_kv.memory.presets`: the cited model and GPU presets, the paper's Table 1;
* :mod:`~paged_kv.memory.window`: a sliding-window layer's blocks, at one length and at its
  peak (vLLM v1's rule);
* :mod:`~paged_kv.memory.ledger`: bytes per token / per sequence / of the weights, per GPU;
* :mod:`~paged_kv.memory.plan`: :func:`plan_memory`, the largest batch that fits;
* :mod:`~paged_kv.memory.decode_cost`: bytes and FLOPs of one decode step, arithmetic intensity,
  ridge points, both roofline bounds on a step's time (cached or recompute, chapter 1), the
  roofline bound and the memory wall on tokens/s (chapter 2);
* :mod:`~paged_kv.memory.speculation`: when speculative decoding pays: tokens per verify pass
  (Leviathan et al. 2023, eq. 1), the verify pass's roofline time, the speed-up, the crossover
  batch (chapter 9);
* :mod:`~paged_kv.memory.vllm_log`: a vLLM start-up log's KV-cache lines recomputed from the
  ledger (:func:`explain_vllm_log`, "why only X x?");
* :mod:`~paged_kv.memory.startup_logs`: real start-up logs from public threads, cited, as data.

Byte units (``GiB`` vs ``GB``, :func:`format_bytes`) live in the leaf :mod:`paged_kv.units`.
"""

from .decode_cost import (DecodeCeiling, IterationTime, StepTime, arithmetic_intensity, generation_time, max_decode_throughput, ridge_point,
                          roofline_tokens_per_s, step_bytes, step_flops, step_time, weights_read_per_step)
from .kv_dtype import KV_DTYPES, KVDType, get_kv_dtype
from .ledger import (as_spec, attention_variant, budget_range_for_slots, layers_per_stage, kv_bytes_per_token, kv_bytes_per_token_per_layer, kv_cache_bytes,
                     kv_heads_per_gpu, kv_slots, tokens_to_reach, weights_bytes)
from .plan import MemoryPlan, max_batch_size, max_tokens, plan_memory
from .presets import GPU_PRESETS, MODEL_PRESETS, PAPER_FIG1, PAPER_TABLE1, gpu_preset, model_preset, tiny_spec
from .speculation import crossover_batch, draft_time, expected_tokens_per_pass, speedup, verify_step_time
from .spec import WEIGHT_DTYPE_BITS, GPUSpec, ModelSpec, weights_dtype_name
from .startup_logs import STARTUP_LOGS, StartupLog
from .vllm_log import LogCheck, LogExplanation, VLLMPool, explain_vllm_log, parse_vllm_log, vllm_pool
from .window import window_blocks, window_max_blocks, window_peak_blocks

__all__ = [
    "GPU_PRESETS", "GPUSpec", "KVDType", "KV_DTYPES", "MODEL_PRESETS", "MemoryPlan", "ModelSpec", "PAPER_FIG1", "PAPER_TABLE1",
    "WEIGHT_DTYPE_BITS", "as_spec", "attention_variant", "budget_range_for_slots", "layers_per_stage", "get_kv_dtype", "gpu_preset", "kv_bytes_per_token",
    "kv_bytes_per_token_per_layer", "kv_cache_bytes", "kv_heads_per_gpu", "kv_slots", "max_batch_size",
    "max_tokens", "model_preset", "plan_memory", "tiny_spec", "tokens_to_reach", "weights_bytes",
    "weights_dtype_name", "arithmetic_intensity", "ridge_point", "roofline_tokens_per_s", "step_bytes",
    "step_flops", "weights_read_per_step", "DecodeCeiling", "IterationTime", "StepTime", "generation_time",
    "max_decode_throughput", "step_time", "window_blocks", "window_max_blocks", "window_peak_blocks",
    "STARTUP_LOGS", "StartupLog", "LogCheck", "LogExplanation", "VLLMPool", "explain_vllm_log", "parse_vllm_log",
    "vllm_pool", "crossover_batch", "draft_time", "expected_tokens_per_pass", "speedup", "verify_step_time",
]
