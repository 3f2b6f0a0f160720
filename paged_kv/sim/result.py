"""What a simulator run records, and the averages read from it (vLLM paper Fig. 2 and Fig. 13a).

:func:`paged_kv.sim.simulate` returns a :class:`SimResult`: one row per step (one model
iteration) of :data:`STEP_FIELDS`, per-request admission and finish times, and optional
slot-by-slot :class:`Layout` snapshots.  Averages are time-weighted over a measurement window,
from the first to the last arrival (the paper's steady load), or over the whole run for a burst
(every request arriving at one instant).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from ..validate import real
from .memory_policy import CATEGORIES
from .traces import Trace

__all__ = ["Layout", "STEP_FIELDS", "SimResult"]

STEP_FIELDS = ("time_s", "dt_s", "running", "waiting", *CATEGORIES, "admitted", "prefill_tokens",
               "preempted", "finished")


@dataclass(frozen=True)
class Layout:
    """The pool slot by slot at one step (``-1``: idle): ``owner [pool]`` int32 request id
    (-1 none), ``category [pool]`` int8 index into :data:`paged_kv.sim.CATEGORIES`, and
    ``borders``, the sorted slot ids where an allocation unit starts (a block, a region, a buddy
    block's unused tail, a hole; :meth:`paged_kv.sim.MemoryPolicy.borders`), or ``None``."""

    step: int
    time_s: float
    owner: np.ndarray
    category: np.ndarray
    borders: np.ndarray | None = None


@dataclass
class SimResult:
    """What :func:`simulate` recorded: one row per step, one entry per request, some layouts.

    Attributes:
        steps: name -> ``[S]`` array for each of :data:`STEP_FIELDS` (slots for the categories,
            seconds for ``time_s``/``dt_s``, counts otherwise).  A step covers
            ``[time_s, time_s + dt_s)``; the pool is idle (everything free) between steps.
        first_admit_s, finish_s: ``[N]`` float64, when each request was first admitted and freed.
        preemptions: ``[N]`` int64, times each request was preempted.
    """

    policy: str
    pool_slots: int
    trace: Trace
    steps: dict[str, np.ndarray]
    first_admit_s: np.ndarray
    finish_s: np.ndarray
    preemptions: np.ndarray
    idle_external: int = 0
    block_size: int | None = None
    layouts: list[Layout] = field(default_factory=list)

    @property
    def num_steps(self) -> int:
        return len(self.steps["time_s"])

    def window(self) -> tuple[float, float]:
        """The measurement window (s): from the first to the last arrival, the stretch in which the
        load is the trace's (afterwards the queue only drains).

        A burst, every request arriving at one instant (e.g. a single request), has no such
        stretch: its window is the whole run, from the burst to the end of the last step, so
        averages are over the steps it took (each weighted by its duration).
        """
        a0, a1 = float(self.trace.arrival_s[0]), float(self.trace.arrival_s[-1])
        if a1 == a0 and self.num_steps:
            a1 = float(self.steps["time_s"][-1] + self.steps["dt_s"][-1])
        return a0, a1

    def time_average(self, name: str, t0: float | None = None, t1: float | None = None) -> float:
        """Time-weighted mean of step field ``name`` over ``[t0, t1]`` (default: :meth:`window`),
        with idle time counted as an empty pool.

        ``t0 == t1`` gives the value at that instant: the step running at ``t0`` (steps cover
        ``[time_s, time_s + dt_s)``), or the empty pool if none was.

        Raises:
            ConfigError: an unknown field, a time that is not a finite number, or ``t1 < t0``.
        """
        if name not in self.steps:
            raise ConfigError(f"unknown step field {name!r}; known: {list(self.steps)}")
        w0, w1 = self.window()
        t0 = w0 if t0 is None else real("t0", t0)
        t1 = w1 if t1 is None else real("t1", t1)
        if t1 < t0:
            raise ConfigError(f"averaging window [{t0}, {t1}] ends before it starts")
        start, dt = self.steps["time_s"], self.steps["dt_s"]
        idle = {"free": self.pool_slots - self.idle_external, "external": self.idle_external}.get(name, 0)
        if t1 == t0:
            k = int(np.searchsorted(start, t0, side="right")) - 1
            return float(self.steps[name][k]) if k >= 0 and t0 < start[k] + dt[k] else float(idle)
        overlap = np.clip(np.minimum(start + dt, t1) - np.maximum(start, t0), 0, None)
        busy = float(overlap.sum())
        return (float((self.steps[name] * overlap).sum()) + idle * ((t1 - t0) - busy)) / (t1 - t0)

    def shares(self) -> dict[str, float]:
        """Time-averaged fraction of the pool in each category (sums to 1)."""
        return {c: self.time_average(c) / self.pool_slots for c in CATEGORIES}

    def used_shares(self) -> dict[str, float]:
        """As :meth:`shares` but of the memory not free (token states + reserved + fragmentation):
        the basis of the paper's Fig. 2, which was measured on a full pool."""
        s = self.shares()
        used = 1.0 - s["free"]
        return {c: (s[c] / used if used > 0 else math.nan) for c in CATEGORIES if c != "free"}

    def mean_batch(self) -> float:
        """Time-averaged number of running requests over :meth:`window` (the paper's Fig. 13)."""
        return self.time_average("running")

    def summary(self) -> dict:
        """Headline numbers: mean batch, shares, throughput, latency, preemptions, steps."""
        st, used = self.steps, self.used_shares()
        busy = float(st["dt_s"].sum())
        lat = self.finish_s - self.trace.arrival_s
        return {"policy": self.policy, "mean_batch": self.mean_batch(),
                "token_share_of_used": used["token_states"],
                "waste_share_of_used": 1.0 - used["token_states"],
                "free_share": self.shares()["free"],
                "tokens_per_step": float(st["running"].mean()) if self.num_steps else 0.0,
                "tokens_per_s": float(st["running"].sum()) / busy if busy else 0.0,
                "mean_latency_s": float(lat.mean()), "max_waiting": int(st["waiting"].max(initial=0)),
                "preemptions": int(self.preemptions.sum()), "steps": self.num_steps}
