"""Real vLLM start-up logs from public GitHub threads, stored as data (chapter 3).

Each :class:`StartupLog` keeps the lines a user posted (short quotes: the numbers are facts), where
they were posted (repository, thread number, URL, who and when), and the settings the thread
states (model, GPU, ``--tensor-parallel-size``, ``--kv-cache-dtype``, ``--max-num-batched-tokens``).
:meth:`StartupLog.explain` recomputes every line with
:func:`~paged_kv.memory.vllm_log.explain_vllm_log`; ``tests/memory/test_vllm_log.py`` checks that
each stored log reconciles.  What a thread leaves out is said in ``unknown``, never filled in.

Together they cover a GQA model in vLLM's V0 and V1 engines, an MLA model with TP=8, a
sliding-window model (gpt-oss: half its layers slide over 128 tokens) and an fp8 KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from .vllm_log import LogExplanation, explain_vllm_log

__all__ = ["STARTUP_LOGS", "StartupLog"]


@dataclass(frozen=True)
class StartupLog:
    """One quoted log and its source.

    Attributes:
        key: a short name (``"llama31-8b-3090"``).
        repo, number, url: the GitHub thread; ``author`` and ``date`` of the post quoted.
        lines: the quoted lines, as posted (prefixes such as timestamps may be cut).
        model: the model preset; ``gpu``: a GPU preset when the log does not print the total.
        tp, kv_cache_dtype, block_size, max_num_batched_tokens, gpu_memory_utilization: the
            settings the thread gives (or vLLM's defaults, said in ``unknown``).
        unknown: what the thread does not say and the reconciliation cannot know.
    """

    key: str
    title: str
    repo: str
    number: int
    url: str
    author: str
    date: str
    lines: str
    model: str
    gpu: str | None = None
    tp: int = 1
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float | None = None
    unknown: str = ""

    @property
    def cite(self) -> str:
        """``"vllm-project/vllm#10517"``."""
        return f"{self.repo}#{self.number}"

    def explain(self) -> LogExplanation:
        """The reconciliation of these lines with the ledger."""
        return explain_vllm_log(self.lines, self.model, self.gpu, tp=self.tp, kv_cache_dtype=self.kv_cache_dtype,
                                block_size=self.block_size, max_num_batched_tokens=self.max_num_batched_tokens,
                                gpu_memory_utilization=self.gpu_memory_utilization)


STARTUP_LOGS: dict[str, StartupLog] = {log.key: log for log in [
    StartupLog(
        "llama31-8b-3090", "Llama-3.1-8B-Instruct on one RTX 3090, V0 engine, max_model_len 20,000",
        "vllm-project/vllm", 10517, "https://github.com/vllm-project/vllm/issues/10517",
        "kaspersiminski", "2024-12-02",
        "Loading model weights took 14.9888 GB\n"
        "Memory profiling results: total_gpu_memory=23.58GiB initial_memory_usage=15.34GiB "
        "peak_torch_memory=17.06GiB memory_usage_post_profile=15.35GiB non_torch_memory=0.35GiB "
        "kv_cache_size=3.81GiB gpu_memory_utilization=0.90\n"
        "GPU blocks: 1952, # CPU blocks: 2048\n"
        "Maximum concurrency for 20000 tokens per request: 1.56x",
        "Llama-3.1-8B", unknown="the vLLM version (V0, late 2024); the GPU's total comes from the log itself"),
    StartupLog(
        "llama31-8b-3090-29k", "the same, with max_model_len 29,000: the engine refuses to start",
        "vllm-project/vllm", 10517, "https://github.com/vllm-project/vllm/issues/10517",
        "kaspersiminski", "2024-12-02",
        "Loading model weights took 14.9888 GB\n"
        "Memory profiling results: total_gpu_memory=23.58GiB initial_memory_usage=15.34GiB "
        "peak_torch_memory=17.98GiB memory_usage_post_profile=15.35GiB non_torch_memory=0.35GiB "
        "kv_cache_size=2.89GiB gpu_memory_utilization=0.90\n"
        "# GPU blocks: 1478, # CPU blocks: 2048\n"
        "Maximum concurrency for 29000 tokens per request: 0.82x\n"
        "The model's max seq len (29000) is larger than the maximum number of tokens that can be "
        "stored in KV cache (23648).",
        "Llama-3.1-8B", unknown="why the profile's peak is 0.92 GiB higher: V0 profiles a prefill of "
                                "max_model_len tokens (up to 32K; above it chunked prefill is on by default and "
                                "the profile is one chunk, so the thread's 35K and 45K runs start), so the "
                                "activations grow with it"),
    StartupLog(
        "qwen3-0.6b-a100", "Qwen3-0.6B on one A100, V1 engine, bf16 KV cache, max_model_len 4,096",
        "vllm-project/vllm", 24577, "https://github.com/vllm-project/vllm/pull/24577",
        "mgoin", "2025-09-10",
        "Model loading took 1.1201 GiB and 0.596228 seconds\n"
        "Available KV cache memory: 69.66 GiB\n"
        "GPU KV cache size: 652,144 tokens\n"
        "Maximum concurrency for 4,096 tokens per request: 159.21x",
        "Qwen3-0.6B", gpu="A100-80GB",
        unknown="which A100 (69.66 GiB of KV memory rules out the 40 GB card) and the total CUDA reports "
                "(a little below nvidia-smi's 80 GiB); gpu_memory_utilization taken as vLLM's default 0.9"),
    StartupLog(
        "deepseek-v3-mi308-tp8", "DeepSeek-V3 on 8 x MI308 with TP=8 (MLA), max_model_len 32,768, one line per GPU",
        "vllm-project/vllm", 15928, "https://github.com/vllm-project/vllm/issues/15928",
        "hoangvictor", "2025-04-01",
        "GPU KV cache size: 107,824 tokens\n"
        "Maximum concurrency for 32,768 tokens per request: 3.29x\n"
        "GPU KV cache size: 107,456 tokens\n"
        "Maximum concurrency for 32,768 tokens per request: 3.28x\n"
        "GPU KV cache size: 107,312 tokens\n"
        "Maximum concurrency for 32,768 tokens per request: 3.27x\n"
        "GPU KV cache size: 107,344 tokens\n"
        "Maximum concurrency for 32,768 tokens per request: 3.28x\n"
        "GPU KV cache size: 107,392 tokens\n"
        "Maximum concurrency for 32,768 tokens per request: 3.28x",
        "DeepSeek-V3", tp=8,
        unknown="the available memory and weights per GPU (not in the quoted lines); that version logged each "
                "rank's own pool, where vLLM now gives every rank the smallest"),
    StartupLog(
        "gpt-oss-120b-h100", "gpt-oss-120b on one H100 (sliding window on half the layers): the engine refuses to start",
        "vllm-project/vllm", 27508, "https://github.com/vllm-project/vllm/issues/27508",
        "matheusfvesco", "2025-10-31",
        "Available KV cache memory: 1.71 GiB\n"
        "ValueError: To serve at least one request with the models's max seq len (131072), (4.54 GiB KV cache "
        "is needed, which is larger than the available KV cache memory (1.71 GiB).",
        "gpt-oss-120b", gpu="H100-80GB", max_num_batched_tokens=1024, gpu_memory_utilization=0.95,
        unknown="the weights and activation peak (not in the quoted lines); the command was "
                "`vllm serve openai/gpt-oss-120b --gpu-memory-utilization 0.95 --max-num-batched-tokens 1024`"),
    StartupLog(
        "fp8-kv-100k", "an fp8 KV cache, V1 engine, max_model_len 100,000, and the refused 221,000",
        "vllm-project/vllm", 25350, "https://github.com/vllm-project/vllm/issues/25350",
        "ErykCh", "2025-09-21",
        "Available KV cache memory: 10.55 GiB\n"
        "GPU KV cache size: 230,528 tokens\n"
        "Maximum concurrency for 100,000 tokens per request: 2.31x\n"
        "ValueError: To serve at least one request with the models's max seq len (221000), (10.12 GiB KV cache "
        "is needed, which is larger than the available KV cache memory (5.59 GiB). Based on the available memory, "
        "the estimated maximum model length is 122080.",
        "Qwen3-Coder-30B-A3B", kv_cache_dtype="fp8",
        unknown="the model: the quoted lines do not name it. Their numbers need 49,152 B a token in fp8, "
                "48 layers x 4 KV heads x 128, the shape of Qwen3-30B-A3B and its Coder version (whose "
                "262,144-token context admits 221,000), taken here; the GPU is not named either"),
]}
