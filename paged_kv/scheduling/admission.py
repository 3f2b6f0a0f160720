"""May a request start?  The verdict (now, later, never) and the reasons a request can never run.

One answer serves the submit check (a "never" is refused with its reason, nothing queued) and every
step (head-of-line blocking on "later"), as vLLM v0's ``AllocStatus.OK / LATER / NEVER`` does.
:func:`never_reason` depends on the request and the configuration alone; :func:`decide` adds the
moment (who runs, the free blocks, the budget left), as :meth:`~paged_kv.scheduling.Scheduler.admission`
hands it over.  Pure Python.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

from ..blocks import BlockSpaceManager
from ..blocks.block_table import blocks_needed
from .config import SchedulerConfig
from .request import SWAPPED, Request
from .rules import may_admit

__all__ = ["Admission", "Verdict", "decide", "never_reason", "reserved_tokens"]


class Verdict(Enum):
    """An enum, not strings: a misspelt verdict fails at once instead of never matching."""

    NOW = "now"
    LATER = "later"
    NEVER = "never"


class Admission(NamedTuple):
    """The answer to "may this request start?".

    Attributes:
        verdict: a :class:`Verdict`.
        reason: why, in words (empty for ``NOW``).
        hit: the prefix-cache blocks the admission found (looked up once and handed to the
            admission that follows); empty without prefix caching.
    """

    verdict: Verdict
    reason: str = ""
    hit: tuple[int, ...] = ()


def never_reason(request: Request, config: SchedulerConfig) -> str:
    """Why ``request`` could not finish even alone on an empty pool, or ``""`` if it could.

    Its lifetime (the blocks its samples hold at their peak, :meth:`Request.lifetime_blocks`) must
    fit the pool; the most one admission of it allocates (:meth:`Request.admission_tokens`: after a
    recompute preemption a lone sequence re-prefills everything) must fit the pool less the
    watermark; with chunked prefill off, its largest prefill must fit the token budget; and
    ``n`` and ``prompt + max_tokens`` must respect ``max_num_seqs`` and ``max_model_len``.
    """
    c, bs = config, config.block_size
    if c.reservation != "none" and request.n > 1:
        return f"reservation={c.reservation!r} models n = 1 requests only (this one asks n = {request.n})"
    if request.n > c.max_num_seqs:
        return (f"its n = {request.n} samples run together, but at most max_num_seqs = "
                f"{c.max_num_seqs} sequences run at once")
    if c.max_model_len is not None and request.prompt_len + request.max_tokens > c.max_model_len:
        return (f"prompt {request.prompt_len} + max_tokens {request.max_tokens} tokens exceed "
                f"max_model_len {c.max_model_len}")
    lifetime = request.lifetime_blocks(bs) if c.reservation == "none" else \
        blocks_needed(reserved_tokens(request, c), bs)
    if lifetime > c.num_gpu_blocks:
        return (f"it needs {lifetime} blocks of {bs} tokens ({_lifetime_words(request)}) but the pool "
                f"has {c.num_gpu_blocks}")
    most = request.admission_tokens() if c.reservation == "none" else reserved_tokens(request, c)
    usable = c.num_gpu_blocks - c.watermark_blocks
    if blocks_needed(most, bs) > usable:
        return (f"its re-prefill after a preemption can reach {most} tokens, {blocks_needed(most, bs)} "
                f"blocks, more than the {usable} admission may use (pool {c.num_gpu_blocks} less "
                f"watermark {c.watermark_blocks})")
    if not c.enable_chunked_prefill and request.largest_prefill() > c.max_num_batched_tokens:
        return (f"with chunked prefill off a prefill runs whole, and its re-prefill after a preemption "
                f"can reach {request.largest_prefill()} tokens > max_num_batched_tokens "
                f"{c.max_num_batched_tokens}")
    return ""


def decide(request: Request, config: SchedulerConfig, manager: BlockSpaceManager, hit: list[int], *,
           num_swapped: int, num_running: int, preempted_this_step: bool = False,
           budget_left: int | None = None) -> Admission:
    """The verdict for a request that could run alone (:func:`never_reason` said so), now.

    ``LATER`` when: a swapped-out request comes back first (§4.5: nobody new starts while
    ``num_swapped`` requests wait on the CPU pool); the rules say wait
    (:func:`~paged_kv.scheduling.rules.may_admit`: a preemption in this step, ``max_num_seqs``
    counting ``num_running`` sequences); the free blocks less the watermark cannot take its
    prefill (``hit``: its prefix-cache hit blocks, which it needs no new block for, unless they are
    cached-free); or ``budget_left`` tokens (``None``: not checked) cannot take its first chunk.
    Otherwise ``NOW``, with the hit.
    """
    c = config
    if num_swapped and request.status != SWAPPED:
        return Admission(Verdict.LATER, f"{num_swapped} preempted request(s) are swapped out: they come back "
                                        f"before anyone new starts")
    if not may_admit(preempted_this_step, num_running + request.n - 1, c.max_num_seqs, 0, 0, 0, None):
        why = "a request was preempted in this step" if preempted_this_step else \
            f"{num_running} sequences run (max_num_seqs {c.max_num_seqs})"
        return Admission(Verdict.LATER, why)
    if c.reservation != "none":
        need = blocks_needed(reserved_tokens(request, c), c.block_size)
    else:
        need = manager.blocks_to_allocate(request.prefill_target, hit)
    free = manager.num_free_blocks
    if free - need < c.watermark_blocks:
        if hit:
            revived = sum(1 for b in hit if manager.allocator.ref_count(b) == 0)
            return Admission(Verdict.LATER, f"it hits {len(hit)} cached blocks ({revived} of them cached-free) and "
                                            f"needs {need - revived} new blocks; {free - revived} other blocks are "
                                            f"free and {c.watermark_blocks} stay free (watermark)")
        return Admission(Verdict.LATER, f"it needs {need} blocks now; {free} are free and "
                                        f"{c.watermark_blocks} stay free (watermark)")
    if budget_left is not None:
        todo = request.prefill_target - len(hit) * c.block_size
        first = min(todo, budget_left) if c.enable_chunked_prefill else todo
        if budget_left < 1 or first > budget_left:
            return Admission(Verdict.LATER, f"the step's token budget has {budget_left} tokens left")
    return Admission(Verdict.NOW, hit=tuple(hit))


def reserved_tokens(request: Request, config: SchedulerConfig) -> int:
    """Tokens a contiguous-style reservation takes at admission: the request's exact lifetime
    (``"oracle"``) or ``max_model_len`` (``"max"``); with ``"none"``, what it prefills."""
    if config.reservation == "max":
        return config.max_model_len
    if config.reservation == "oracle":
        return request.stored_tokens()
    return request.prefill_target


def _lifetime_words(req: Request) -> str:
    per = f"prompt {req.prompt_len} + {req.max_tokens} new - 1 = {req.stored_tokens()} stored tokens"
    if req.n == 1:
        return per
    shared = "the whole prompt, as they never write" if req.max_tokens == 1 else "the prompt's full blocks"
    return f"{req.n} samples of {per}, sharing {shared}"
