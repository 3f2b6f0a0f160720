"""Explain a vLLM start-up log: the KV-cache lines ``vllm serve`` prints, recomputed from the
model's config and the GPU's memory, block by block (chapter 3, "Explain my vLLM start-up log").

How vLLM computes the lines, read from its source (``vllm-project/vllm``):

* **Available KV cache memory** (V1 ``gpu_worker.py``; V0 prints the same sum as
  ``Memory profiling results: total_gpu_memory=... kv_cache_size=...``): ``gpu_memory_utilization
  x total`` minus the peak a profile run reaches (the weights, the activations of one step of
  ``max_num_batched_tokens`` tokens, and what was allocated outside torch: NCCL, the CUDA
  context).  Newer versions also subtract an estimate of the CUDA graphs; older ones capture the
  graphs after the cache is allocated, out of the ``1 - gpu_memory_utilization`` margin.
* **The pool** (``vllm/v1/core/kv_cache_utils.py``): a *page* is one layer's block,
  ``block_size x`` that layer's bytes per token (``AttentionSpec.page_size_bytes``: K and V of
  each KV head on this GPU; ``MLAAttentionSpec``: the latent plus the RoPE key, no factor 2).
  Layers of one kind form one group; a model with full and sliding-window layers gets groups of
  ``group_size`` layers each (``_get_kv_cache_groups_uniform_page_size``), and
  ``num_blocks = available // page // group_size``.
* **GPU KV cache size: N tokens** (``_report_kv_cache_config``): ``num_blocks // groups x
  block_size``.  V0 printed ``# GPU blocks`` instead.
* **Maximum concurrency for L tokens per request: X x** (``get_max_concurrency_for_kv_cache_config``):
  ``num_blocks`` over the blocks one request needs at its longest: ``cdiv(L, BS)`` per
  full-attention group and ``cdiv(min(W - 1 + max_num_batched_tokens, L), BS) + 1`` per
  sliding-window group (``SlidingWindowSpec.max_memory_usage_bytes``).  V0 and early V1 printed
  ``num_blocks x BS / L``: the same number whenever ``BS`` divides ``L``.
* **"(Y GiB KV cache is needed, ...)"** (``_check_enough_kv_cache_memory``): the blocks of one
  such request times ``page x group_size``; the engine refuses to start when it exceeds the pool.

Every printed number is rounded, so each check compares the interval a printed value stands for
(``69.66`` means [69.655, 69.665) GiB) with what the ledger computes.  Pure Python.

Legend: BS block size (tokens), L max_model_len (tokens), W sliding window (tokens).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..units import GiB, MiB
from ..validate import count, real
from .kv_dtype import KVDType, get_kv_dtype
from .ledger import as_spec, kv_bytes_per_token_per_layer, weights_bytes
from .presets import gpu_preset
from .spec import GPUSpec, ModelSpec

__all__ = ["LogCheck", "LogExplanation", "VLLMPool", "explain_vllm_log", "parse_vllm_log", "vllm_pool"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class VLLMPool:
    """vLLM's KV pool for one model on one GPU: the page (bytes of one layer's block), how the
    layers are grouped, and the arithmetic behind the lines the engine logs.

    ``groups`` lists each group's kind (``"full"`` or ``"sliding"``); every group spans
    ``group_size`` layers, so one pool block costs ``page_bytes x group_size`` bytes.
    """

    block_size: int
    page_bytes: int
    group_size: int
    groups: tuple
    window: int | None = None
    kv_dtype: str = "bf16"

    @property
    def block_bytes(self) -> int:
        """Bytes of one pool block over the ``group_size`` layers it spans."""
        return self.page_bytes * self.group_size

    def num_blocks(self, available_bytes: int) -> int:
        """Pool blocks in ``available_bytes`` (``get_num_blocks``)."""
        return max(0, available_bytes // self.page_bytes // self.group_size)

    def tokens(self, num_blocks: int) -> int:
        """The "GPU KV cache size" line: ``num_blocks // groups x block_size``."""
        return num_blocks // len(self.groups) * self.block_size

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Pool blocks one request of ``max_model_len`` tokens needs at its longest."""
        full = _cdiv(max_model_len, self.block_size)
        sliding = (_cdiv(min(self.window - 1 + max_num_batched_tokens, max_model_len), self.block_size) + 1
                   if self.window else 0)
        return sum(full if kind == "full" else sliding for kind in self.groups)

    def concurrency(self, num_blocks: int, max_model_len: int, max_num_batched_tokens: int) -> float:
        """The "Maximum concurrency" line."""
        return num_blocks / self.blocks_per_request(max_model_len, max_num_batched_tokens)

    def needed_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Bytes one longest request needs (the start-up check's "KV cache is needed")."""
        return self.blocks_per_request(max_model_len, max_num_batched_tokens) * self.block_bytes

    def max_model_len_for(self, available_bytes: int, max_num_batched_tokens: int, limit: int) -> int:
        """The longest ``max_model_len`` up to ``limit`` whose one request fits (the error's
        "estimated maximum model length"; vLLM bisects the same way), 0 if none."""
        fits = lambda n: self.needed_bytes(n, max_num_batched_tokens) <= available_bytes
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        return lo


def _kv_dtype(name: str | KVDType) -> KVDType:
    """vLLM's ``--kv-cache-dtype``: ``"auto"`` (the model's 16-bit dtype), ``"fp8"``, ..."""
    return get_kv_dtype("bf16" if name == "auto" else name)


def vllm_pool(model, kv_cache_dtype: str | KVDType = "auto", *, tp: int = 1, block_size: int = 16) -> VLLMPool:
    """The pool vLLM builds for ``model`` on each of ``tp`` GPUs (pages, groups; no bytes yet).

    One group of all layers when every layer is alike; otherwise groups of ``group_size`` layers
    of one kind, ``group_size`` the smaller layer count (the larger when it is under 1.5 times
    the smaller), as ``_get_kv_cache_groups_uniform_page_size`` does.

    Raises:
        ConfigError: a ``tp`` that cannot split the heads, a bad block size or KV dtype.
    """
    spec = as_spec(model)
    bs = count("block_size", block_size, 1)
    dt = _kv_dtype(kv_cache_dtype)
    page = bs * kv_bytes_per_token_per_layer(spec, dt, tp=tp)
    full, sliding = spec.num_layers - spec.sliding_layers, spec.sliding_layers
    if not full or not sliding:
        kind = "sliding" if sliding else "full"
        return VLLMPool(bs, page, spec.num_layers, (kind,), spec.sliding_window, dt.name)
    size = min(full, sliding)
    if max(full, sliding) < 1.5 * size:
        size = max(full, sliding)
    groups = ("full",) * _cdiv(full, size) + ("sliding",) * _cdiv(sliding, size)
    return VLLMPool(bs, page, size, groups, spec.sliding_window, dt.name)


# --- reading a log ------------------------------------------------------------------------------
_NUM = r"(-?[\d,]*\.?\d+)"
_PATTERNS = {
    "weights_gib": rf"(?:Model loading took|Loading model weights took)\s+{_NUM}\s*Gi?B",
    "available_gib": rf"Available KV cache memory:\s*{_NUM}\s*GiB",
    "kv_tokens": rf"GPU KV cache size:\s*{_NUM}\s*tokens",
    "gpu_blocks": rf"GPU blocks:\s*{_NUM}",
    "concurrency": rf"Maximum concurrency for\s*{_NUM}\s*tokens per request:\s*{_NUM}\s*x",
    "needed": rf"max seq len \({_NUM}\),?\s*\(?{_NUM} GiB KV cache is needed, which is larger than the "
              rf"available KV cache memory \({_NUM} GiB\)",
    "stored_tokens": rf"tokens that can be stored in KV cache \({_NUM}\)",
    "estimated_len": rf"estimated maximum model length is {_NUM}",
    "total_gib": rf"total_gpu_memory={_NUM}\s*GiB",
    "peak_torch_gib": rf"peak_torch_memory={_NUM}\s*GiB",
    "non_torch_gib": rf"non_torch_memory={_NUM}\s*GiB",
    "kv_cache_size_gib": rf"kv_cache_size={_NUM}\s*GiB",
    "utilization": rf"gpu_memory_utilization={_NUM}",
}


def parse_vllm_log(text: str) -> dict:
    """The KV-cache numbers in a pasted vLLM log, as printed (strings, so their rounding is
    kept): ``{"available_gib": ["69.66"], "kv_tokens": ["652,144"], "concurrency":
    [("4,096", "159.21")], ...}``, one entry per line found, in order (a multi-GPU log repeats
    lines per rank).  Keys with no match are absent.

    Raises:
        ConfigError: ``text`` is not a string, or holds none of the lines.
    """
    if not isinstance(text, str):
        raise ConfigError(f"expected the log as a string, got {type(text).__name__}")
    found = {key: re.findall(pattern, text) for key, pattern in _PATTERNS.items()}
    found = {key: values for key, values in found.items() if values}
    if not found:
        raise ConfigError("no vLLM KV-cache line found: paste lines such as 'Available KV cache memory: "
                          "69.66 GiB', 'GPU KV cache size: 652,144 tokens', 'Maximum concurrency for ...'")
    return found


def _value(text: str) -> float:
    return float(text.replace(",", ""))


def _interval(text: str, scale: float = 1.0) -> tuple[float, float]:
    """The values a printed number stands for, ``[low, high)``, times ``scale``."""
    decimals = len(text.partition(".")[2])
    half = 0.5 * 10 ** -decimals
    return (_value(text) - half) * scale, (_value(text) + half) * scale


@dataclass(frozen=True)
class LogCheck:
    """One printed line against the ledger: ``agrees`` is None where nothing can be checked."""

    line: str
    printed: str
    computed: str
    agrees: bool | None
    note: str = ""


@dataclass
class LogExplanation:
    """What :func:`explain_vllm_log` found: the pool, each check, the blocks consistent with the
    log (``blocks``, a ``(low, high)`` range, inclusive), the memory budget (bytes per GPU) and
    the answer to "why only X x?" (:meth:`why`)."""

    model: ModelSpec
    pool: VLLMPool
    parsed: dict
    checks: list = field(default_factory=list)
    blocks: tuple | None = None
    budget: dict = field(default_factory=dict)
    reasons: list = field(default_factory=list)

    @property
    def all_agree(self) -> bool:
        """Whether every check that could be made agrees."""
        return all(c.agrees is not False for c in self.checks)

    def why(self) -> str:
        """The reasons, one sentence each (Markdown)."""
        return " ".join(self.reasons)


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB"


def explain_vllm_log(text: str, model, gpu: str | GPUSpec | None = None, *, tp: int = 1,
                     kv_cache_dtype: str | KVDType = "auto", block_size: int = 16,
                     gpu_memory_utilization: float | None = None, max_num_batched_tokens: int = 8192,
                     weights_dtype: str | None = None) -> LogExplanation:
    """Reconcile a pasted vLLM start-up log with the ledger and say why its concurrency is what
    it is.

    Args:
        text: log lines as vLLM printed them (any subset of those :func:`parse_vllm_log` reads).
        model: the served model (preset name, :class:`ModelSpec` or ``ModelConfig``).
        gpu: its GPU (preset or spec) when the log does not print the total; ``None``: the
            total comes from a V0 profiling line, or stays unknown.
        tp: tensor-parallel GPUs (each holds ``1/tp`` of the KV heads; MLA latents are whole).
        kv_cache_dtype: vLLM's ``--kv-cache-dtype`` (``"auto"``: 16-bit, ``"fp8"``).
        block_size: vLLM's ``--block-size`` (16 by default on CUDA).
        gpu_memory_utilization: vLLM's fraction (default: the log's, else 0.9).
        max_num_batched_tokens: counts only for sliding-window layers (their blocks per request).
        weights_dtype: the checkpoint's dtype for the weights check (default: the preset's).

    Raises:
        ConfigError: no KV-cache line in ``text``, or impossible settings.
        UnknownPresetError: an unknown model or GPU name.
    """
    spec = as_spec(model)
    parsed = parse_vllm_log(text)
    pool = vllm_pool(spec, kv_cache_dtype, tp=tp, block_size=block_size)
    mnbt = count("max_num_batched_tokens", max_num_batched_tokens, 1)
    out = LogExplanation(spec, pool, parsed)
    add = lambda *a, **k: out.checks.append(LogCheck(*a, **k))
    lo_blocks, hi_blocks = 0, None

    def narrow(lo: int, hi: int) -> None:
        nonlocal lo_blocks, hi_blocks
        lo_blocks = max(lo_blocks, lo)
        hi_blocks = hi if hi_blocks is None else min(hi_blocks, hi)

    # the pool (of the first GPU, when every rank prints its own lines), from each line that fixes it
    for printed in (parsed.get("kv_tokens", []) + parsed.get("stored_tokens", []))[:1]:
        n = len(pool.groups)
        base = int(_value(printed)) // pool.block_size * n
        narrow(base, base + n - 1)
    for printed in parsed.get("gpu_blocks", [])[:1]:
        narrow(int(_value(printed)), int(_value(printed)))
    for printed in parsed.get("available_gib", [])[:1]:
        lo, hi = _interval(printed, GiB)
        blocks = pool.num_blocks(int(lo)), pool.num_blocks(int(hi))
        add("Available KV cache memory", f"{printed} GiB",
            f"{blocks[0]:,}-{blocks[1]:,} blocks of {pool.block_bytes:,} B", None)
        narrow(*blocks)
    out.blocks = None if hi_blocks is None else (lo_blocks, hi_blocks)
    consistent = out.blocks is None or out.blocks[0] <= out.blocks[1]
    if out.blocks and len(parsed.get("available_gib", [])) and parsed.get("kv_tokens"):
        add("GPU KV cache size", f"{parsed['kv_tokens'][0]} tokens",
            f"{pool.tokens(out.blocks[0]):,} tokens ({out.blocks[0]:,} blocks)", consistent,
            "the available memory's rounding interval and the token count meet")

    for printed in parsed.get("stored_tokens", [])[:1]:
        if out.blocks:
            t = pool.tokens(out.blocks[0])
            add("tokens that can be stored", printed, f"{out.blocks[0]:,} blocks x {pool.block_size} = {t:,}",
                t == int(_value(printed)))

    # the concurrency of each line, from the blocks its own line fixes (one line per rank)
    per_line = [int(_value(b)) for b in parsed.get("gpu_blocks", [])] or [
        int(_value(t)) // pool.block_size * len(pool.groups) for t in parsed.get("kv_tokens", [])]
    for i, (length, printed) in enumerate(parsed.get("concurrency", [])):
        L = int(_value(length))
        if per_line:
            blocks = per_line[min(i, len(per_line) - 1)]
        elif out.blocks:
            blocks = out.blocks[0]
        else:
            add("Maximum concurrency", f"{printed}x", "no pool size in the log", None)
            continue
        x = pool.concurrency(blocks, L, mnbt)
        add(f"Maximum concurrency for {length} tokens", f"{printed}x",
            f"{blocks:,} / {pool.blocks_per_request(L, mnbt):,} blocks = {x:.2f}x", f"{x:.2f}" == printed)

    # the start-up check that failed
    for length, needed, available in parsed.get("needed", []):
        L = int(_value(length))
        need = pool.needed_bytes(L, mnbt)
        add(f"KV cache needed for {length} tokens", f"{needed} GiB",
            f"{pool.blocks_per_request(L, mnbt):,} blocks x {pool.block_bytes:,} B = {need / GiB:.2f} GiB",
            f"{need / GiB:.2f}" == needed)
        lo, hi = _interval(available, GiB)
        fit = pool.max_model_len_for(int(lo), mnbt, L), pool.max_model_len_for(int(hi), mnbt, L)
        estimate = parsed.get("estimated_len", [None])[0]
        add("estimated maximum model length", estimate or "(not in the lines)", f"{fit[0]:,}-{fit[1]:,} tokens",
            None if estimate is None else fit[0] <= int(_value(estimate)) <= fit[1],
            f"the longest that fits in {available} GiB, which is rounded")

    # weights, and where the rest of the GPU goes
    w = weights_bytes(spec, weights_dtype, tp=tp)
    out.budget["weights_computed"] = w
    for printed in parsed.get("weights_gib", [])[:1]:
        lo, hi = _interval(printed, GiB)
        rope = (spec.max_position or 0) * (spec.qk_rope_head_dim or spec.head_dim) * 2
        add("weights", f"{printed} GiB", f"{_gib(w)} of parameters", None,
            f"the log holds {(lo - w) / MiB:,.1f}-{(hi - w) / MiB:,.1f} MiB more; a RoPE cos/sin table "
            f"(max_position x rotary dim, 16-bit) would be {rope / MiB:,.1f} MiB")
        out.budget["weights_printed"] = _value(printed) * GiB
    util = gpu_memory_utilization
    if util is None:
        util = _value(parsed["utilization"][0]) if "utilization" in parsed else 0.9
    util = real("gpu_memory_utilization", util, 0.0, 1.0, low_open=True)
    total = None
    if "total_gib" in parsed:
        total = _value(parsed["total_gib"][0]) * GiB
    elif gpu is not None:
        total = (gpu if isinstance(gpu, GPUSpec) else gpu_preset(gpu)).memory_bytes
        out.budget["total_from"] = "preset"
    if "peak_torch_gib" in parsed and "non_torch_gib" in parsed and total is not None:
        t_lo, t_hi = _interval(parsed["total_gib"][0], GiB)
        p_lo, p_hi = _interval(parsed["peak_torch_gib"][0], GiB)
        n_lo, n_hi = _interval(parsed["non_torch_gib"][0], GiB)
        kv_lo, kv_hi = util * t_lo - p_hi - n_hi, util * t_hi - p_lo - n_lo
        printed = parsed.get("kv_cache_size_gib", ["?"])[0]
        k_lo, k_hi = _interval(printed, GiB) if printed != "?" else (kv_lo, kv_hi)
        add("kv_cache_size (V0 profile)", f"{printed} GiB",
            f"{util:g} x total - peak_torch - non_torch = {kv_lo / GiB:.3f}-{kv_hi / GiB:.3f} GiB",
            k_lo < kv_hi and kv_lo < k_hi)
    kv = None
    if parsed.get("available_gib"):
        kv = _value(parsed["available_gib"][0]) * GiB
    elif parsed.get("kv_cache_size_gib"):
        kv = _value(parsed["kv_cache_size_gib"][0]) * GiB
    weights = out.budget.get("weights_printed", w)
    if total is not None:
        out.budget.update(total=total, utilization=util, budget=util * total, margin=(1 - util) * total)
        if kv is not None:
            out.budget.update(kv=kv, rest=util * total - weights - kv)
    _reasons(out, mnbt, kv)
    return out


def _reasons(out: LogExplanation, mnbt: int, kv: float | None) -> None:
    """The "why only X x?" sentences, every number computed here."""
    pool, b = out.pool, out.budget
    concurrency = out.parsed.get("concurrency") or [(m[0], None) for m in out.parsed.get("needed", [])]
    if not concurrency:
        return
    L = int(_value(concurrency[0][0]))
    per_request = pool.blocks_per_request(L, mnbt)
    kinds = " and ".join(sorted(set(pool.groups)))
    say = out.reasons.append
    say(f"One block holds {pool.block_size} tokens of {pool.group_size} layers: "
        f"{pool.block_bytes:,} B ({pool.page_bytes:,} B a layer).")
    window = (f", {pool.groups.count('sliding')} sliding-window group(s) only their window of "
              f"{pool.window:,} plus one step's {mnbt:,} tokens" if "sliding" in pool.groups else "")
    say(f"A request of {L:,} tokens needs {per_request:,} blocks ({kinds} group(s){window}).")
    if out.blocks and out.blocks[0] <= out.blocks[1]:
        n = out.blocks[0]
        x = n / per_request
        fit = (f"{x:.2f} such requests fit at once (shorter requests share the pool: the line counts requests "
               "at the full length)") if x >= 1 else f"{x:.2f}: not one such request fits, and the engine stops"
        say(f"The pool holds {n:,} blocks{'' if out.blocks[0] == out.blocks[1] else ' or a few more'}, "
            f"so {n:,} / {per_request:,} = {fit}.")
    if kv is not None and "total" in b:
        graphs = " (and, in newer versions, CUDA graphs)" if "available_gib" in out.parsed else ""
        if "weights_printed" in b:
            rest = (f"minus {_gib(b['weights_printed'])} of weights, minus {_gib(b['rest'])} for the "
                    f"activations at the profile's peak and memory outside torch{graphs}")
        else:
            rest = (f"minus {_gib(b['budget'] - kv)} for the weights, the activations at the profile's peak and "
                    f"memory outside torch{graphs} together (the lines do not split them)")
        preset = (" (the preset's nvidia-smi total; CUDA reports a little less, so the rest is a little smaller)"
                  if b.get("total_from") == "preset" else "")
        say(f"The pool is what the budget leaves: {b['utilization']:g} x {_gib(b['total'])}{preset} = "
            f"{_gib(b['budget'])}, {rest}, = {_gib(kv)}; the other {_gib(b['margin'])} "
            f"({1 - b['utilization']:.0%}) stay outside it.")
    if kv is not None:
        half = pool.num_blocks(int(kv)) / pool.blocks_per_request(L // 2, mnbt)
        lever = f"a max_model_len of {L // 2:,} would give {half:.2f}x"
        if get_kv_dtype(pool.kv_dtype).bits == 16:
            fp8 = VLLMPool(pool.block_size, pool.page_bytes // 2, pool.group_size, pool.groups, pool.window, "fp8")
            lever += f"; an fp8 cache (half the bytes a token) {fp8.num_blocks(int(kv)) / per_request:.2f}x"
        say(f"Levers, on the same memory: {lever}.")
