"""The scheduling layer: who runs in each step, shared by the simulator (:mod:`paged_kv.sim`) and
the serving engine (:mod:`paged_kv.engine`).  Pure Python.

* :mod:`~paged_kv.scheduling.request`: :class:`Request` and :class:`Sequence` (tokens and
  progress), and the rules of a group of samples (leader, holders, the next step's plan);
* :mod:`~paged_kv.scheduling.config`: :class:`SchedulerConfig`, the knobs;
* :mod:`~paged_kv.scheduling.output`: :class:`SchedulerOutput` and its :class:`Chunk`\\ s, the step as data;
* :mod:`~paged_kv.scheduling.admission`: :class:`Admission`, :class:`Verdict` (now / later / never);
* :mod:`~paged_kv.scheduling.rules`: the rules shared with the simulator, :func:`may_admit`,
  :func:`preemption_victim`, :func:`requeue_preempted`; and :func:`admission_order`, the waiting
  queue's walk by the configured policy (FCFS, or longest prefix match first);
* :mod:`~paged_kv.scheduling.preemption`: how a preempted request gives its blocks back (swap or recompute);
* :mod:`~paged_kv.scheduling.scheduler`: :class:`Scheduler` (continuous batching, chunked prefill,
  admission, preemption, prefix-cache lookups).
"""

from ..blocks.block_table import group_blocks_needed
from .admission import Admission, Verdict
from .config import SchedulerConfig
from .output import Chunk, SchedulerOutput
from .request import Request, Sequence
from .rules import POLICIES, admission_order, may_admit, preemption_victim, requeue_preempted
from .scheduler import Scheduler

__all__ = ["Admission", "Chunk", "POLICIES", "Request", "Scheduler", "SchedulerConfig", "SchedulerOutput",
           "Sequence", "Verdict", "admission_order", "group_blocks_needed", "may_admit", "preemption_victim",
           "requeue_preempted"]
