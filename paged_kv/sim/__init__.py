"""The simulator layer (chapter 4): where contiguous allocation wastes KV memory, and what paging
recovers, over request traces shaped like the vLLM paper's.  Pure Python and numpy, no torch.

* :mod:`~paged_kv.sim.traces`: :class:`Trace`, Poisson arrivals, ShareGPT-/Alpaca-like lengths;
* :mod:`~paged_kv.sim.memory_policy`: :class:`MemoryPolicy`, the interface, and the paper's Fig. 2
  categories :data:`CATEGORIES`;
* :mod:`~paged_kv.sim.buddy`: where a contiguous region goes: :class:`BuddyAllocator` (the paper's
  Orca baseline) or :class:`HoleList` (first-/best-fit);
* :mod:`~paged_kv.sim.contiguous`: the Orca baselines, Max/Pow2/Oracle (one contiguous region each);
* :mod:`~paged_kv.sim.paged`: :class:`PagedPolicy`, blocks on demand;
* :mod:`~paged_kv.sim.simulator`: :func:`simulate`, the iteration-level loop (its scheduling rules
  come from :mod:`paged_kv.scheduling`), :class:`IterationTime`;
* :mod:`~paged_kv.sim.result`: :class:`SimResult`, what a run records, and its averages;
* :mod:`~paged_kv.sim.paper_setup`: the paper's OPT-13B/A100 set-up, its four policies by name
  (:func:`make_policy`) and printed numbers;
* :mod:`~paged_kv.sim.sharing`: requests of n samples or k beams sharing blocks (chapter 6):
  :func:`memory_saving` (the paper's Figure 15), :class:`SharedPagedPolicy`,
  :class:`GroupContiguousPolicy`;
* :mod:`~paged_kv.sim.rate_sweep`: latency against load: :func:`normalized_latency` (§6.1),
  :func:`sweep_rates` (every curve over request rates), :func:`latency_sweep` (Figure 14),
  :func:`capacity` (where a curve crosses a line), :func:`sustained_rate` (the knee, from a run
  with every request waiting) and :func:`finish_rate`.
"""

from .buddy import PLACEMENTS, BuddyAllocator, HoleList, next_pow2
from .contiguous import ContiguousPolicy, OrcaMax, OrcaOracle, OrcaPow2
from .memory_policy import CATEGORIES, MemoryPolicy
from .paged import PagedPolicy
from .paper_setup import (A100_40GB, FIG2_SEGMENTS, PAPER_RESULTS, PAPER_SETUP, POLICIES, ServingSetup, comparison_rows,
                          fig2_rows, format_table, make_policy)
from .result import STEP_FIELDS, Layout, SimResult
from .rate_sweep import capacity, finish_rate, latency_sweep, normalized_latency, sustained_rate, sweep_rates
from .sharing import PAPER_SHARING, GroupContiguousPolicy, SharedPagedPolicy, Sharing, group_blocks, memory_saving
from .simulator import IterationTime, simulate
from .traces import (ALPACA_LIKE, LENGTH_MODELS, SHAREGPT_LIKE, LengthModel, Trace, length_model, load_trace,
                     poisson_arrivals, synthetic_trace, trace_from_rows)

__all__ = [
    "A100_40GB", "ALPACA_LIKE", "BuddyAllocator", "CATEGORIES", "ContiguousPolicy", "FIG2_SEGMENTS",
    "GroupContiguousPolicy", "HoleList", "IterationTime", "LENGTH_MODELS", "Layout", "LengthModel", "MemoryPolicy",
    "OrcaMax", "OrcaOracle", "OrcaPow2", "PAPER_RESULTS", "PAPER_SETUP", "PAPER_SHARING", "PLACEMENTS", "POLICIES",
    "PagedPolicy", "SHAREGPT_LIKE", "STEP_FIELDS", "ServingSetup", "SharedPagedPolicy", "Sharing", "SimResult",
    "Trace", "capacity", "comparison_rows", "fig2_rows", "finish_rate", "format_table", "group_blocks", "latency_sweep",
    "length_model", "load_trace", "make_policy", "memory_saving", "next_pow2", "normalized_latency",
    "poisson_arrivals", "simulate", "sustained_rate", "sweep_rates", "synthetic_trace", "trace_from_rows",
]
