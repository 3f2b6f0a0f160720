"""The scheduling layer: who runs in each step, shared by the simulator (:mod:`paged_kv.sim`) and
the serving engine (:mod:`paged_kv.engine`).  Pure Python.

* :mod:`~paged_kv.scheduling.rules`: the named rules, :func:`may_admit`, :func:`preemption_victim`,
  :func:`requeue_preempted`.
* :mod:`~paged_kv.scheduling.request`: :class:`Request` and :class:`Sequence` (tokens and progress).
* :mod:`~paged_kv.scheduling.scheduler`: :class:`Scheduler` (continuous batching, chunked prefill,
  admission now/later/never, preemption by recompute or swap) and its :class:`SchedulerConfig`.
"""

from .request import Request, Sequence
from .rules import may_admit, preemption_victim, requeue_preempted
from .scheduler import Admission, Chunk, Scheduler, SchedulerConfig, SchedulerOutput, group_blocks_needed

__all__ = ["Admission", "Chunk", "Request", "Scheduler", "SchedulerConfig", "SchedulerOutput", "Sequence",
           "group_blocks_needed", "may_admit", "preemption_victim", "requeue_preempted"]
