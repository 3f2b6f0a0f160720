"""How a preempted request gives its GPU blocks back: by swap or by recompute (vLLM paper §4.5).

*Which* request is preempted is a rule shared with the simulator
(:func:`~paged_kv.scheduling.rules.preemption_victim`); this module is *how*, on the block manager.
A group of samples is preempted whole: its sequences share blocks, and half a group swapped out
would leave the other half's shared blocks behind.  Pure Python.
"""

from __future__ import annotations

from ..blocks import BlockSpaceManager
from .request import Request

__all__ = ["recompute", "swap_out"]


def swap_out(manager: BlockSpaceManager, request: Request) -> list[tuple[int, int]] | None:
    """Move the request's blocks to the CPU pool, each shared block once (its ref count travels
    with it); returns the ``(gpu, cpu)`` block pairs the cache must copy, or ``None`` when the CPU
    pool cannot take them all (nothing changes; vLLM v0 then aborts the request, the scheduler
    here recomputes it instead).  Copy-on-write copies must have been taken first."""
    ids = [s.seq_id for s in request.holders()]
    if manager.cpu_allocator is None or not manager.can_swap_out(ids):
        return None
    return manager.swap_out(ids)


def recompute(manager: BlockSpaceManager, request: Request) -> None:
    """Free the request's blocks and forget its K/V: every sequence's ``num_computed`` is 0 and the
    group is no longer forked, so its re-admission prefills the prompt once in the leader and the
    other samples fork again at the prompt's end (sharing survives the preemption).  Its tokens,
    generated ones included, stay: they are run again, and nothing is sampled twice."""
    for s in request.holders():
        manager.free(s.seq_id)
    for s in request.seqs:
        s.num_computed = 0
    request.forked = False
