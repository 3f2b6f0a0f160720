"""Serving defaults shared by the layers, each with the system it comes from; where the bundled
model lives.

A leaf module (imports nothing of ours).  A default appears here once and every signature that
needs it names the constant, so a reader changes it in one place and sees where it is used.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BLOCK_SIZE", "MAX_NUM_BATCHED_TOKENS", "MAX_NUM_SEQS", "MAX_SEQ_LEN", "RESERVE_FRACTION", "WATERMARK", "bundled_weights_dir"]

# Tokens per KV block: vLLM's default on CUDA GPUs (``--block-size 16``; vLLM paper §7.2 finds
# 16 "large enough to efficiently utilize the GPU and small enough to avoid significant internal
# fragmentation").
BLOCK_SIZE = 16

# Most sequences running at once: vLLM's ``max_num_seqs`` (256).
MAX_NUM_SEQS = 256

# The token budget of one step, prefill chunks and decode tokens together: vLLM v0's
# ``max_num_batched_tokens`` default with chunked prefill on (512).
MAX_NUM_BATCHED_TOKENS = 512

# Share of free blocks kept back when admitting a prompt, so running sequences can still grow:
# vLLM v0 ``BlockSpaceManager(watermark=0.01)``.
WATERMARK = 0.01

# Share of each GPU's memory kept for activations, the CUDA context and allocator slack:
# 1 - vLLM's default ``gpu_memory_utilization=0.9``.
RESERVE_FRACTION = 0.10


def bundled_weights_dir() -> Path:
    """The folder of the bundled tiny model (``paged_kv/model/weights``: safetensors, config,
    model card), found from this file so that nothing needs importing to locate it."""
    return Path(__file__).resolve().parent / "model" / "weights"

# The simulator's default context: OPT's 2,048 tokens, the vLLM paper's set-up (§6.1).
MAX_SEQ_LEN = 2048
