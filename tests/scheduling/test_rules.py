"""The named scheduling rules (paged_kv.scheduling.rules), alone and as the simulator applies them."""

from collections import deque

import pytest

from paged_kv.errors import ConfigError
from paged_kv.scheduling import may_admit, preemption_victim, requeue_preempted
from paged_kv.sim import OrcaOracle, PagedPolicy, simulate, trace_from_rows


def test_the_victim_is_the_latest_arrival():
    assert preemption_victim([3, 0, 7, 5]) == 7
    arrival = {"a": 0.5, "b": 2.0, "c": 1.0}
    assert preemption_victim(["a", "b", "c"], arrival=arrival.__getitem__) == "b"
    assert preemption_victim(["x", "y"], arrival=lambda r: 1.0) == "y"   # a tie: the later in the list


def test_no_victim_when_nothing_runs():
    with pytest.raises(ConfigError, match="no running request"):
        preemption_victim([])


def test_a_preempted_request_goes_to_the_front():
    waiting = deque([4, 5])
    requeue_preempted(waiting, 2)
    assert list(waiting) == [2, 4, 5]


@pytest.mark.parametrize("kwargs,expected", [
    (dict(), True),
    (dict(preempted_this_step=True), False),                      # no admission in a step that preempted
    (dict(num_running=4), False),                                 # max_num_seqs reached
    (dict(num_running=3), True),
    (dict(max_prefill_tokens=10, admitted_this_step=1, prefill_tokens_this_step=6, prompt_tokens=5), False),
    (dict(max_prefill_tokens=11, admitted_this_step=1, prefill_tokens_this_step=6, prompt_tokens=5), True),
    (dict(max_prefill_tokens=10, admitted_this_step=0, prompt_tokens=50), True),   # the first one always
])
def test_may_admit(kwargs, expected):
    args = dict(preempted_this_step=False, num_running=0, max_num_seqs=4, admitted_this_step=0,
                prefill_tokens_this_step=0, prompt_tokens=5, max_prefill_tokens=None) | kwargs
    assert may_admit(**args) is expected


def test_simulator_stops_at_the_head_of_the_queue():
    # Head-of-line blocking: request 1 (8 slots) does not fit next to request 0, so request 2
    # (1 slot, which would fit) waits behind it.
    trace = trace_from_rows([(0, 4, 4), (0, 6, 2), (0, 1, 1)])
    res = simulate(trace, OrcaOracle(10, 16))
    assert res.first_admit_s.tolist() == [0.0, 4.0, 4.0]


class _ShortOnceAt(PagedPolicy):
    """A roomy paged pool that pretends, once, at step ``at``, to lack one block."""

    def __init__(self, at: int, **kw) -> None:
        super().__init__(**kw)
        self.at, self.done = at, False

    def shortfall(self, step: int) -> int:
        if step == self.at and not self.done:
            self.done = True
            return 1
        return 0


def test_simulator_preempts_the_latest_and_admits_nothing_in_that_step():
    # Memory is ample, so without the rule the victim (at the head of the queue) would be admitted
    # again in the very step that preempted it.
    trace = trace_from_rows([(0, 3, 6), (0, 3, 6), (0, 2, 6)])
    res = simulate(trace, _ShortOnceAt(2, pool_slots=256, max_seq_len=64, block_size=4, watermark=0.0),
                   max_batch=2)
    steps = res.steps
    assert steps["preempted"].tolist()[:4] == [0, 0, 1, 0]
    assert steps["admitted"].tolist()[:4] == [2, 0, 0, 1]       # step 2 preempted: nobody admitted
    assert res.preemptions.tolist() == [0, 1, 0]                  # the latest *running* arrival: 1
