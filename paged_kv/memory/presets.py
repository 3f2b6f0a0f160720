"""Model and GPU presets for the KV-cache ledger (:mod:`paged_kv.memory`), each with its source.

Model shapes are copied from each model's public ``config.json`` on the Hugging Face Hub (the
repository is named in :attr:`ModelSpec.source`), except OPT-175B, whose weights were never put
on the Hub: its shape is Table 1 of the OPT paper (Zhang et al. 2022).  Parameter counts are
*computed* from the shape (the same count as ``sum(p.numel())`` over the transformers model, which
``tests/memory/test_presets.py`` checks on the ``meta`` device), never typed in.  The book's own
model (``"tiny"``) is read from ``paged_kv/model/weights/config.json``.

GPU memory follows what ``nvidia-smi`` reports as "total" for each card (with ECC on, the
data-centre default), in MiB; the marketing name ("16 GB", "141 GB") is kept beside it.  Vendor
"GB" here is neither 10^9 nor exact: an "80 GB" A100 shows 81,920 MiB = exactly 80 GiB, an
"80 GB" H100 shows 81,559 MiB (79.6 GiB), a "16 GB" T4 shows 15,360 MiB (15.0 GiB: ECC takes
1/16 of its 16 GiB of GDDR6) and a "141 GB" H200 shows 143,771 MiB (140.4 GiB).  PyTorch's
``torch.cuda.get_device_properties(0).total_memory`` is a little lower still (e.g. ~14.7 GiB on
Colab's T4), because the driver keeps some for itself.
"""

from __future__ import annotations

import json

from ..defaults import bundled_weights_dir
from ..errors import UnknownPresetError
from ..units import MiB
from .spec import (GPUSpec, ModelSpec, deepseek_v3_num_parameters, gpt_oss_num_parameters, llama_num_parameters,
                   opt_num_parameters, qwen3_moe_num_parameters)

__all__ = ["GPU_PRESETS", "MODEL_PRESETS", "PAPER_FIG1", "PAPER_TABLE1", "gpu_preset", "model_preset", "tiny_spec"]


# --- the presets --------------------------------------------------------------------------
def _llama(name, source, *, layers, hidden, heads, kv_heads, intermediate, vocab, max_position,
           head_dim=None, tied=False, weights_dtype="bf16", qkv_bias=False, qk_norm=False,
           norms_per_layer=2, sliding_window=None, sliding_layers=0) -> ModelSpec:
    head_dim = head_dim or hidden // heads
    params = llama_num_parameters(vocab=vocab, hidden=hidden, layers=layers, heads=heads,
                                  kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate,
                                  tied=tied, qkv_bias=qkv_bias, qk_norm=qk_norm,
                                  norms_per_layer=norms_per_layer)
    return ModelSpec(name, layers, hidden, heads, kv_heads, head_dim, params,
                     sliding_window=sliding_window, sliding_layers=sliding_layers,
                     weights_dtype=weights_dtype, max_position=max_position, source=source,
                     gathered_params=0 if tied else vocab * hidden)


def _opt(name, source, *, layers, hidden, heads, ffn) -> ModelSpec:
    params = opt_num_parameters(vocab=50272, hidden=hidden, layers=layers, ffn=ffn, max_position=2048)
    return ModelSpec(name, layers, hidden, heads, heads, hidden // heads, params,
                     weights_dtype="fp16", max_position=2048, source=source,
                     gathered_params=(2048 + 2) * hidden)  # learned positions; the tied embedding is read by the head


_DEEPSEEK_V3 = dict(vocab=129280, hidden=7168, layers=61, heads=128, q_lora_rank=1536, kv_lora_rank=512,
                    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, intermediate=18432,
                    moe_intermediate=2048, n_routed_experts=256, n_shared_experts=1, first_k_dense=3)

_QWEN3_CODER_30B = dict(vocab=151936, hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128,
                        moe_intermediate=768, n_experts=128)
_GPT_OSS_120B = dict(vocab=201088, hidden=2880, layers=36, heads=64, kv_heads=8, head_dim=64, intermediate=2880,
                     n_experts=128)

_PUBLIC_MODELS = [
    _opt("OPT-13B", "facebook/opt-13b", layers=40, hidden=5120, heads=40, ffn=20480),
    _opt("OPT-66B", "facebook/opt-66b", layers=64, hidden=9216, heads=72, ffn=36864),
    _opt("OPT-175B", "OPT paper (Zhang et al. 2022), Table 1; not on the Hub",
         layers=96, hidden=12288, heads=96, ffn=49152),
    _llama("Llama-2-7B", "meta-llama/Llama-2-7b-hf", layers=32, hidden=4096, heads=32, kv_heads=32,
           intermediate=11008, vocab=32000, max_position=4096, weights_dtype="fp16"),
    _llama("Llama-2-13B", "meta-llama/Llama-2-13b-hf", layers=40, hidden=5120, heads=40, kv_heads=40,
           intermediate=13824, vocab=32000, max_position=4096, weights_dtype="fp16"),
    _llama("Llama-2-70B", "meta-llama/Llama-2-70b-hf", layers=80, hidden=8192, heads=64, kv_heads=8,
           intermediate=28672, vocab=32000, max_position=4096, weights_dtype="fp16"),
    _llama("Llama-3-8B", "meta-llama/Meta-Llama-3-8B", layers=32, hidden=4096, heads=32, kv_heads=8,
           intermediate=14336, vocab=128256, max_position=8192),
    _llama("Llama-3-70B", "meta-llama/Meta-Llama-3-70B", layers=80, hidden=8192, heads=64, kv_heads=8,
           intermediate=28672, vocab=128256, max_position=8192),
    _llama("Llama-3.1-405B", "meta-llama/Llama-3.1-405B", layers=126, hidden=16384, heads=128,
           kv_heads=8, intermediate=53248, vocab=128256, max_position=131072),
    _llama("Mistral-7B", "mistralai/Mistral-7B-v0.1", layers=32, hidden=4096, heads=32, kv_heads=8,
           intermediate=14336, vocab=32000, max_position=32768, sliding_window=4096, sliding_layers=32),
    _llama("Gemma-2-9B", "google/gemma-2-9b", layers=42, hidden=3584, heads=16, kv_heads=8, head_dim=256,
           intermediate=14336, vocab=256000, max_position=8192, tied=True, norms_per_layer=4,
           sliding_window=4096, sliding_layers=21),
    _llama("Qwen2.5-72B", "Qwen/Qwen2.5-72B", layers=80, hidden=8192, heads=64, kv_heads=8,
           intermediate=29568, vocab=152064, max_position=131072, qkv_bias=True),
    _llama("Qwen3-4B", "Qwen/Qwen3-4B", layers=36, hidden=2560, heads=32, kv_heads=8, head_dim=128,
           intermediate=9728, vocab=151936, max_position=40960, tied=True, qk_norm=True),
    # The models of chapter 3's vLLM start-up logs (paged_kv.memory.startup_logs)
    _llama("Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct", layers=32, hidden=4096, heads=32, kv_heads=8,
           intermediate=14336, vocab=128256, max_position=131072),
    _llama("Qwen3-0.6B", "Qwen/Qwen3-0.6B", layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128,
           intermediate=3072, vocab=151936, max_position=40960, tied=True, qk_norm=True),
    ModelSpec("Qwen3-Coder-30B-A3B", num_layers=48, hidden_size=2048, num_heads=32, num_kv_heads=4, head_dim=128,
              num_params=qwen3_moe_num_parameters(**_QWEN3_CODER_30B), max_position=262144,
              source="Qwen/Qwen3-Coder-30B-A3B-Instruct", gathered_params=151936 * 2048),
    # every other layer slides over 128 tokens (config "layer_types"); the experts ship in MXFP4
    # (4-bit values and one 8-bit scale per 32: 4.25 bits), the rest in bf16: "int4" is a lower bound
    ModelSpec("gpt-oss-120b", num_layers=36, hidden_size=2880, num_heads=64, num_kv_heads=8, head_dim=64,
              num_params=gpt_oss_num_parameters(**_GPT_OSS_120B), sliding_window=128, sliding_layers=18,
              weights_dtype="int4", max_position=131072, source="openai/gpt-oss-120b",
              gathered_params=201088 * 2880),
    ModelSpec("DeepSeek-V3", num_layers=61, hidden_size=7168, num_heads=128, num_kv_heads=128,
              head_dim=128, num_params=deepseek_v3_num_parameters(**_DEEPSEEK_V3),
              kv_lora_rank=512, qk_rope_head_dim=64, weights_dtype="fp8", max_position=163840,
              source="deepseek-ai/DeepSeek-V3", gathered_params=_DEEPSEEK_V3["vocab"] * _DEEPSEEK_V3["hidden"]),
]

# Bandwidth and dense fp16/bf16 tensor-core peak from NVIDIA's datasheets (decimal units, as
# printed; the datasheets' "with sparsity" figures are twice these).
GPU_PRESETS: dict[str, GPUSpec] = {g.name: g for g in [
    GPUSpec("T4", "16 GB", 15360 * MiB, "nvidia-smi on a Tesla T4 (ECC on), e.g. Colab",
            bandwidth=320e9, peak_flops=65e12, perf_source="NVIDIA T4 datasheet: 320 GB/s, 65 TFLOPS fp16"),
    GPUSpec("A100-40GB", "40 GB", 40960 * MiB, "nvidia-smi on an A100-SXM4-40GB",
            bandwidth=1555e9, peak_flops=312e12,
            perf_source="NVIDIA A100 datasheet (SXM 40GB): 1,555 GB/s, 312 TFLOPS bf16 dense"),
    GPUSpec("A100-80GB", "80 GB", 81920 * MiB, "nvidia-smi on an A100-SXM4-80GB",
            bandwidth=2039e9, peak_flops=312e12,
            perf_source="NVIDIA A100 datasheet (SXM 80GB): 2,039 GB/s, 312 TFLOPS bf16 dense"),
    GPUSpec("H100-80GB", "80 GB", 81559 * MiB, "nvidia-smi on an H100 80GB HBM3 (SXM)",
            bandwidth=3.35e12, peak_flops=989.4e12,
            perf_source="NVIDIA H100 datasheet (SXM): 3.35 TB/s, 989.4 TFLOPS bf16 dense"),
    GPUSpec("H200", "141 GB", 143771 * MiB, "nvidia-smi on an H200 (SXM)",
            bandwidth=4.8e12, peak_flops=989.4e12,
            perf_source="NVIDIA H200 datasheet (SXM): 4.8 TB/s, 989 TFLOPS bf16 dense"),
]}


def tiny_spec() -> ModelSpec:
    """The book's own model, read from the bundled ``paged_kv/model/weights/config.json``.

    Read as plain JSON (the fields of :class:`paged_kv.model.ModelConfig`), so the ledger needs
    neither torch nor the model layer; its parameter count is the Llama formula
    (:func:`~paged_kv.memory.spec.llama_num_parameters`), which ``tests/memory/test_presets.py``
    checks against the loaded model's ``sum(p.numel())``.
    """
    cfg = json.loads((bundled_weights_dir() / "config.json").read_text())
    head_dim = cfg["head_dim"] or cfg["hidden_size"] // cfg["num_heads"]
    params = llama_num_parameters(vocab=cfg["vocab_size"], hidden=cfg["hidden_size"], layers=cfg["num_layers"],
                                  heads=cfg["num_heads"], kv_heads=cfg["num_kv_heads"], head_dim=head_dim,
                                  intermediate=cfg["intermediate_size"], tied=cfg["tie_embeddings"])
    return ModelSpec("tiny", cfg["num_layers"], cfg["hidden_size"], cfg["num_heads"], cfg["num_kv_heads"],
                     head_dim, params, weights_dtype="fp16", max_position=cfg["max_seq_len"],
                     source="paged_kv/model/weights/config.json",
                     gathered_params=0 if cfg["tie_embeddings"] else cfg["vocab_size"] * cfg["hidden_size"])


MODEL_PRESETS: dict[str, ModelSpec] = {"tiny": tiny_spec(), **{m.name: m for m in _PUBLIC_MODELS}}


def _lookup(table: dict, name: str, what: str):
    if not isinstance(name, str):
        raise UnknownPresetError(f"{what} preset names are strings, got {name!r}")
    for key, value in table.items():
        if key.lower() == name.strip().lower():
            return key, value
    raise UnknownPresetError(f"unknown {what} preset {name!r}; known: {', '.join(table)}")


def model_preset(name: str) -> ModelSpec:
    """The :class:`ModelSpec` named ``name`` (case-insensitive), e.g. ``"llama-3-8b"``.

    ``"tiny"`` is re-read from the bundled config on every call.

    Raises:
        UnknownPresetError: the name is not a preset; the message lists the known ones.
    """
    key, spec = _lookup(MODEL_PRESETS, name, "model")
    return tiny_spec() if key == "tiny" else spec


def gpu_preset(name: str) -> GPUSpec:
    """The :class:`GPUSpec` named ``name`` (case-insensitive): T4, A100-40GB, A100-80GB,
    H100-80GB, H200.  ``"A100"`` and ``"H100"`` mean their 80 GB versions.

    Raises:
        UnknownPresetError: the name is not a preset; the message lists the known ones.
    """
    aliases = {"a100": "A100-80GB", "h100": "H100-80GB"}
    name = aliases.get(name.strip().lower(), name) if isinstance(name, str) else name
    return _lookup(GPU_PRESETS, name, "GPU")[1]


# The vLLM paper's Table 1 as printed (Kwon et al. 2023, SOSP): model, GPUs, the memory it gives
# to the KV cache, and the "max. # KV cache slots" it prints.  Chapter 3 recomputes the slots.
PAPER_TABLE1 = [
    {"model": "OPT-13B", "gpus": "1 x A100 (40 GB)", "tp": 1, "kv_gb": 12, "slots_printed": "15.7K"},
    {"model": "OPT-66B", "gpus": "4 x A100 (40 GB)", "tp": 4, "kv_gb": 21, "slots_printed": "9.7K"},
    {"model": "OPT-175B", "gpus": "8 x A100-80GB", "tp": 8, "kv_gb": 264, "slots_printed": "60.1K"},
]

# The vLLM paper's Fig. 1 (left) as printed: OPT-13B served on one NVIDIA A100 (40 GB); the
# parameters take "26GB, 65%", the KV cache ">30%", activations and the rest the remainder.
PAPER_FIG1 = {"model": "OPT-13B", "gpu": "A100-40GB", "weights_gb": 26, "weights_share": 0.65,
              "kv_share_at_least": 0.30}
