"""The scheduling layer: the rules that decide who runs (FCFS, preemption), shared by the
simulator (:mod:`paged_kv.sim`) and the serving engine.  Pure Python.

* :mod:`~paged_kv.scheduling.rules`: :func:`may_admit`, :func:`preemption_victim`,
  :func:`requeue_preempted`.
"""

from .rules import may_admit, preemption_victim, requeue_preempted

__all__ = ["may_admit", "preemption_victim", "requeue_preempted"]
