"""The vLLM paper's serving set-up for the simulator, the numbers the paper prints, and our figures
beside them.

Follows Kwon et al., SOSP 2023 (arXiv:2309.06180): §6.1 and Fig. 13a (OPT-13B on one A100-40GB,
12 GiB of KV cache, max length 2,048, ShareGPT at 2 req/s), Fig. 13b (Alpaca at 30 req/s) and
Fig. 2 (where KV memory goes, one bar per system: :func:`fig2_rows` compares them segment by segment).
:class:`ServingSetup` ties a model preset (:mod:`paged_kv.memory`), a trace
(:mod:`paged_kv.sim.traces`), one of the paper's four memory policies (:func:`make_policy`:
:mod:`paged_kv.sim.contiguous`, :mod:`paged_kv.sim.paged`) and a roofline step time to
:func:`paged_kv.sim.simulate`; :func:`comparison_rows` and :func:`format_table` print ours
beside :data:`PAPER_RESULTS`.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

from .. import memory
from ..defaults import MAX_SEQ_LEN
from ..errors import ConfigError
from ..validate import count, real
from .contiguous import ORCA_POLICIES
from .memory_policy import MemoryPolicy
from .paged import PagedPolicy
from .result import SimResult
from .simulator import IterationTime, simulate
from .traces import Trace, length_model, synthetic_trace

__all__ = ["A100_40GB", "FIG2_SEGMENTS", "PAPER_RESULTS", "PAPER_SETUP", "POLICIES", "ServingSetup", "comparison_rows",
           "fig2_rows", "format_table", "make_policy"]

# The paper's GPU, from its preset in paged_kv.memory (one home for the datasheet's numbers: HBM2
# bandwidth 1,555 GB/s; fp16/bf16 Tensor Core 312 TFLOPS dense), as the names the roofline takes.
_A100 = memory.gpu_preset("A100-40GB")
A100_40GB = {"hbm_bytes_per_s": _A100.bandwidth, "fp16_flops_per_s": _A100.peak_flops, "source": _A100.perf_source}

# The numbers the paper prints, to show beside ours.  Cited facts, not results of this package.
# Fig. 2 ("Average percentage of memory wastes in different LLM serving systems during the
# experiment in §6.2"): one bar per system, as shares of the KV memory, in the paper's segments
# token states / reservation / internal fragmentation / external fragmentation & others, which
# are our ``token_states`` / ``reserved`` / ``internal`` / ``external``.  The paper's vLLM bar
# prints only its token-state share; the 3.7% rest is not broken down (``rest``).
FIG2_SEGMENTS = ("token_states", "reserved", "internal", "external")
PAPER_RESULTS = {
    "citation": ("W. Kwon et al., \"Efficient Memory Management for Large Language Model Serving "
                 "with PagedAttention\", SOSP 2023 (arXiv:2309.06180)"),
    "fig2": {
        "max": {"token_states": 0.204, "reserved": 0.133, "internal": 0.573, "external": 0.089},
        "pow2": {"token_states": 0.268, "reserved": 0.179, "internal": 0.136, "external": 0.416},
        "oracle": {"token_states": 0.382, "reserved": 0.252, "internal": 0.0, "external": 0.366},
        "paged": {"token_states": 0.963, "rest": 0.037},
    },
    "fig2_run": ("averaged over the §6.2 experiment (basic sampling: OPT-13B/66B/175B, ShareGPT and "
                 "Alpaca, a range of request rates; the caption names no single run)"),
    # Fig. 2's token-state shares, as the paper's text quotes them (§1: "20.4%-38.2%").
    "token_state_share": {"existing systems (range)": (0.204, 0.382), "vLLM": 0.963},
    # Fig. 13a: average number of batched requests, OPT-13B, ShareGPT trace at 2 req/s.
    "mean_batch": {"max": 7.00, "pow2": 9.81, "oracle": 13.62, "paged": 30.42},
    # Fig. 13b: the same, Alpaca trace at 30 req/s.
    "mean_batch_alpaca": {"max": 7.00, "pow2": 43.24, "oracle": 72.75, "paged": 132.44},
}


# The four systems of the paper's §6.1, by the short names PAPER_RESULTS uses.
POLICIES = {**ORCA_POLICIES, "paged": PagedPolicy}


def make_policy(name: str, pool_slots: int, max_seq_len: int = MAX_SEQ_LEN, **kwargs) -> MemoryPolicy:
    """A fresh policy by short name: ``"max"``, ``"pow2"``, ``"oracle"`` or ``"paged"``.

    ``kwargs`` go to the class (``placement=`` for contiguous, ``block_size=``/``watermark=`` for
    paged).  An unknown name or bad arguments raise ConfigError.
    """
    if not isinstance(name, str):
        raise ConfigError(f"policy name must be a string, one of {sorted(POLICIES)}; got {name!r}")
    key = name.lower().replace("orca", "").strip(" -_()")
    if key not in POLICIES:
        raise ConfigError(f"unknown policy {name!r}; known: {sorted(POLICIES)}")
    try:
        return POLICIES[key](pool_slots, max_seq_len, **kwargs)
    except TypeError as e:
        raise ConfigError(f"bad arguments for policy {name!r}: {e}") from None


@dataclass(frozen=True)
class ServingSetup:
    """A serving set-up to simulate: model, KV budget, context length, trace, step time.

    Every field is checked at construction (:class:`~paged_kv.errors.ConfigError` naming the
    value): ``kv_gib`` and ``rate_per_s`` finite and > 0, ``max_seq_len`` and ``num_requests``
    ints >= 1 (numpy ints are fine), ``efficiency`` in (0, 1], ``lengths`` a known length model,
    ``model``/``kv_dtype`` known to :mod:`paged_kv.memory`.

    The default, :data:`PAPER_SETUP`, is the paper's Fig. 13a: OPT-13B on one A100-40GB with
    12 GiB for the KV cache (Table 1: 15.7K slots), max length 2048, ShareGPT at 2 req/s.

    ``efficiency`` scales the A100's peak bandwidth and FLOPs in the roofline step time.  The
    default 0.5 puts the simulated engine in the paper's regime.  By Little's law applied to the
    running requests, a mean batch of 30.42 at 2 req/s with 338-token outputs (Fig. 13a) means
    30.42 / (2 x 338) = ~45 ms per generated token, i.e. per step: roughly twice the ideal
    roofline step at that batch (~26 ms).  With the ideal (1.0), 2 req/s does not fill the pool
    and paging's batch is set by arrivals, not by memory; chapter 4 shows both.
    """

    model: str = "OPT-13B"
    kv_dtype: str = "fp16"
    kv_gib: float = 12.0
    max_seq_len: int = MAX_SEQ_LEN
    rate_per_s: float = 2.0
    lengths: str = "sharegpt"
    num_requests: int = 2000
    efficiency: float = 0.5

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):
            raise ConfigError(f"model must be a preset name, got {self.model!r}")
        length_model(self.lengths)  # raises on an unknown name
        fix = lambda name, value: object.__setattr__(self, name, value)  # frozen: normalise in place
        fix("kv_gib", real("kv_gib", self.kv_gib, 0.0, low_open=True))
        fix("max_seq_len", count("max_seq_len", self.max_seq_len))
        fix("rate_per_s", real("rate_per_s", self.rate_per_s, 0.0, low_open=True))
        fix("num_requests", count("num_requests", self.num_requests))
        fix("efficiency", real("efficiency", self.efficiency, 0.0, 1.0, low_open=True))
        if self.pool_slots < 1:  # also checks model and kv_dtype (paged_kv.memory raises)
            raise ConfigError(f"kv_gib={self.kv_gib!r} holds no token slot of {self.kv_bytes_per_token:,} bytes")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per token, from :mod:`paged_kv.memory` (OPT-13B fp16: 819,200)."""
        return memory.kv_bytes_per_token(memory.model_preset(self.model), self.kv_dtype)

    @property
    def pool_slots(self) -> int:
        """Token slots in the KV budget: ``floor(kv_gib * 2**30 / kv_bytes_per_token)``."""
        return int(self.kv_gib * 2**30) // self.kv_bytes_per_token

    def iteration_time(self) -> IterationTime:
        """Roofline step time on an A100-40GB (:data:`A100_40GB`), scaled by ``efficiency``."""
        weights = memory.weights_bytes(memory.model_preset(self.model), "fp16")
        return IterationTime.roofline(weights, self.kv_bytes_per_token, A100_40GB["hbm_bytes_per_s"],
                                      A100_40GB["fp16_flops_per_s"], self.efficiency)

    def trace(self, seed: int = 0, num_requests: int | None = None, rate_per_s: float | None = None) -> Trace:
        """A synthetic trace of this set-up's lengths; ``None`` takes the set-up's count or rate
        (0 is an error, not a request for the default)."""
        return synthetic_trace(self.num_requests if num_requests is None else num_requests,
                               self.rate_per_s if rate_per_s is None else rate_per_s, self.lengths, seed)

    def policy(self, name: str, **kwargs) -> MemoryPolicy:
        """A fresh policy (:func:`~paged_kv.sim.make_policy`) over this set-up's pool."""
        return make_policy(name, self.pool_slots, self.max_seq_len, **kwargs)

    def run(self, name: str, trace: Trace | None = None, seed: int = 0, **kwargs) -> SimResult:
        """Simulate policy ``name`` (kwargs: policy options, or :func:`simulate` options)."""
        sim_keys = set(inspect.signature(simulate).parameters) - {"trace", "policy"}
        sim = {k: kwargs.pop(k) for k in list(kwargs) if k in sim_keys}
        sim.setdefault("iteration_time", self.iteration_time())
        return simulate(trace if trace is not None else self.trace(seed), self.policy(name, **kwargs), **sim)


PAPER_SETUP = ServingSetup()


def comparison_rows(results: dict[str, SimResult]) -> list[dict]:
    """Our figures beside :data:`PAPER_RESULTS`: one row per policy short name in ``results``.

    Columns: mean batch (ours, paper's Fig. 13a) and token-state share of used memory (ours,
    the paper's Fig. 2 bar for that system).
    """
    rows = []
    for key, res in results.items():
        paper_share = PAPER_RESULTS["fig2"].get(key, {}).get("token_states", math.nan)
        rows.append({"policy": res.policy, "batch (ours)": res.mean_batch(),
                     "batch (paper)": PAPER_RESULTS["mean_batch"].get(key, math.nan),
                     "token share (ours)": res.used_shares()["token_states"],
                     "token share (paper)": paper_share})
    return rows


def fig2_rows(results: dict[str, SimResult]) -> list[dict]:
    """The paper's Fig. 2 bar by bar: one row per policy short name in ``results``, each segment's
    share of the KV memory in use, ours (``SimResult.used_shares``) beside the paper's.

    Columns ``"<segment> share (ours)"`` and ``"<segment> share (paper)"`` for each of
    :data:`FIG2_SEGMENTS`; the paper's vLLM bar has only token states, so its other three are NaN
    and ``"rest share (paper)"`` holds its 3.7% (ours: the sum of our three waste segments).

    Raises:
        ConfigError: a key that is not one of the paper's four systems.
    """
    rows = []
    for key, res in results.items():
        if key not in PAPER_RESULTS["fig2"]:
            raise ConfigError(f"no Fig. 2 bar for {key!r}; known: {sorted(PAPER_RESULTS['fig2'])}")
        ours, paper = res.used_shares(), PAPER_RESULTS["fig2"][key]
        row = {"policy": res.policy}
        for seg in FIG2_SEGMENTS:
            row[f"{seg} share (ours)"] = ours[seg]
            row[f"{seg} share (paper)"] = paper.get(seg, math.nan)
        row["rest share (ours)"] = 1.0 - ours["token_states"]
        row["rest share (paper)"] = 1.0 - paper["token_states"]
        rows.append(row)
    return rows


def _fmt(v, percent: bool) -> str:
    if isinstance(v, tuple):
        return "–".join(_fmt(x, percent) for x in v)
    if isinstance(v, float) and math.isnan(v):
        return "–"
    if isinstance(v, float):
        return f"{100 * v:.1f}%" if percent else f"{v:.2f}"
    return str(v)


def format_table(rows: list[dict]) -> str:
    """Rows of dicts as a fixed-width text table; columns named "... share ..." print as %."""
    if not rows:
        return ""
    cols = list(rows[0])
    cells = [[_fmt(r[c], "share" in c) for c in cols] for r in rows]
    width = [max(len(c), *(len(row[j]) for row in cells)) for j, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.rjust(w) if j else v.ljust(w) for j, (v, w) in enumerate(zip(vals, width)))
    return "\n".join([line(cols), line(["-" * w for w in width]), *map(line, cells)])
