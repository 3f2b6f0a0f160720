"""The blocks ``n`` samples of one prompt hold at their peak: the one formula
(:func:`paged_kv.blocks.group_blocks_needed`) against brute force.

The brute force never uses the formula: it runs the real block manager the way a step does
(``conftest.peak_blocks``) and, separately, the real :class:`Scheduler` alone on a pool of exactly
that peak, and reads the blocks in use after every step.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from paged_kv.blocks import group_blocks_held, group_blocks_needed, stored_tokens
from paged_kv.errors import ConfigError
from paged_kv.scheduling import Scheduler, SchedulerConfig

from conftest import peak_blocks

GRID = list(itertools.product(range(1, 21), range(1, 5), range(1, 7), range(1, 9)))   # P, n, max_tokens, BS


def scheduler_peak(P: int, n: int, max_tokens: int, bs: int, pool: int) -> int:
    """Run the request alone through the real scheduler on ``pool`` blocks; most blocks in use."""
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=pool, block_size=bs, watermark=0.0))
    sch.add("r", list(range(P)), n=n, max_tokens=max_tokens)
    peak = 0
    while sch.has_unfinished:
        out = sch.schedule()
        assert not out.preempted, "alone on a pool of its peak, nothing is preempted"
        peak = max(peak, pool - sch.manager.num_free_blocks)
        sch.update(out, {c.seq_id: [7] * c.num_samples for c in out.chunks if c.sample})
        sch.check()
    assert sch.manager.num_free_blocks == pool
    return peak


def test_the_formula_is_the_peak_the_block_manager_reaches():
    wrong = [(P, n, M, bs) for P, n, M, bs in GRID
             if group_blocks_needed(P, stored_tokens(P, M), n, bs) != peak_blocks(P, n, M, bs)]
    assert wrong == [], f"{len(wrong)} of {len(GRID)} configurations, e.g. {wrong[:5]}"


@pytest.mark.parametrize("bs", range(1, 9))
def test_the_scheduler_runs_every_request_on_a_pool_of_its_peak_and_refuses_one_block_less(bs):
    for P, n, M in itertools.product(range(1, 21), range(1, 5), range(1, 7)):
        peak = peak_blocks(P, n, M, bs)
        assert scheduler_peak(P, n, M, bs, peak) == peak, (P, n, M, bs)
        small = Scheduler(SchedulerConfig(num_gpu_blocks=max(1, peak - 1), block_size=bs, watermark=0.0))
        if peak > 1:
            with pytest.raises(Exception, match="can never run"):
                small.add("r", list(range(P)), n=n, max_tokens=M)


def test_one_token_samples_never_write_so_they_share_even_the_partial_prompt_block():
    # the case: n = 3, a 10-token prompt, blocks of 4, max_tokens = 1: 3 blocks, not 2 + 3
    assert group_blocks_needed(10, 10, 3, 4) == 3 == peak_blocks(10, 3, 1, 4)
    assert scheduler_peak(10, 3, 1, 4, pool=4) == 3


def test_the_unchecked_form_broadcasts_over_numpy_arrays_like_the_scalar_one():
    P = np.array([1, 4, 9, 10, 10])
    L = np.array([1, 7, 9, 10, 21])
    got = group_blocks_held(P, L, 3, 4)
    # by hand: unwritten -> ceil(L/4); written -> P//4 + 3 * (ceil(L/4) - P//4)
    assert got.tolist() == [group_blocks_held(int(p), int(x), 3, 4) for p, x in zip(P, L)] == [1, 1 + 3 * 1, 3, 3, 2 + 3 * 4]


@pytest.mark.parametrize("args", [(0, 5, 1, 4), (5, 4, 1, 4), (5, 6, 0, 4), (5, 6, 1, 0), (5.0, 6, 1, 4),
                                  (5, True, 1, 4)])
def test_bad_counts_are_refused_by_name(args):
    with pytest.raises(ConfigError):
        group_blocks_needed(*args)
