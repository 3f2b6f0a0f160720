"""One step is scheduled, run and recorded once, in order; what is recorded is checked first.

A step is data (``SchedulerOutput``); these tests hand the scheduler the wrong data (a step
recorded twice, a stale one, another scheduler's, malformed token lists) and expect our own error
with nothing changed, instead of the silent loops and wrong tokens a new-user trial found.
"""

from __future__ import annotations

import pytest

from paged_kv.errors import ConfigError, PagedKVError, PromptError
from paged_kv.scheduling import Scheduler, SchedulerConfig


def scheduler(**kw) -> Scheduler:
    return Scheduler(SchedulerConfig(**{"num_gpu_blocks": 16, "block_size": 4, "watermark": 0.0} | kw))


def tokens(out, token=7) -> dict:
    return {c.seq_id: [token] * c.num_samples for c in out.chunks if c.sample}


def state(sch: Scheduler):
    return ([(r.request_id, r.status, [(s.seq_id, s.num_computed, list(s.tokens)) for s in r.seqs])
             for r in sch.requests.values()], sch.manager.num_free_blocks)


def test_each_step_is_numbered_and_recorded_once_in_order():
    sch = scheduler()
    sch.add("a", [1, 2, 3], n=2, max_tokens=3)
    first = sch.schedule()
    assert first.step == 1
    with pytest.raises(PagedKVError, match="still in flight"):
        sch.schedule()                                     # the result of step 1 comes first
    sch.update(first, tokens(first))
    before = state(sch)
    with pytest.raises(PagedKVError, match="records the step in flight"):
        sch.update(first, tokens(first))                   # recorded twice: refused, nothing changes
    assert state(sch) == before
    second = sch.schedule()
    assert second.step == 2
    with pytest.raises(PagedKVError, match="step 2"):
        sch.update(first, tokens(first))                   # a stale step
    other = scheduler()
    other.add("a", [1, 2, 3], n=2, max_tokens=3)
    with pytest.raises(PagedKVError, match="records the step in flight"):
        sch.update(other.schedule(), {})                   # another scheduler's step
    with pytest.raises(PagedKVError, match="step 2 is still in flight"):
        sch.schedule()                                     # the refusals left step 2 in flight
    sch.update(second, tokens(second))
    sch.check()
    assert len(sch.requests["a"].seqs) == 2


@pytest.mark.parametrize("bad", [None, 5, [7], {0: 5}, {0: ["x"]}, {0: [-3]}, {0: [1.5]}])
def test_malformed_sampled_tokens_are_refused_before_anything_is_recorded(bad):
    sch = scheduler()
    sch.add("a", [1, 2, 3], max_tokens=3)
    out = sch.schedule()
    before = state(sch)
    with pytest.raises(PagedKVError):
        sch.update(out, bad)
    assert state(sch) == before
    sch.update(out, tokens(out))                           # the right result is still accepted
    sch.check()


def test_preempt_waits_for_the_step_in_flight():
    sch = scheduler(preemption_mode="swap", num_cpu_blocks=8)
    sch.add("a", [1, 2, 3, 4, 5], max_tokens=4)
    out = sch.schedule()
    with pytest.raises(PagedKVError, match="in flight"):
        sch.preempt("a")
    sch.update(out, tokens(out))
    assert sch.preempt("a") == "swap"
    with pytest.raises(PagedKVError, match="hashable"):
        sch.preempt(["a"])
    sch.check()


@pytest.mark.parametrize("kw,err", [
    ({"prompt": "abc"}, PromptError), ({"prompt": [1.5, 2]}, PromptError), ({"prompt": [1, -5]}, PromptError),
    ({"prompt": None}, PromptError), ({"prompt": 5}, PromptError), ({"arrival": "x"}, ConfigError),
    ({"adapter_shift": "a"}, ConfigError), ({"sampling_params": {"n": 1}}, ConfigError),
])
def test_add_refuses_what_the_engine_would_refuse(kw, err):
    sch = scheduler()
    args = {"request_id": "r", "prompt": [1, 2, 3]} | kw
    with pytest.raises(err):
        sch.add(**args)
    assert not sch.requests and not sch.waiting


def test_check_names_a_group_with_too_many_sequences_and_a_waiting_request_with_computed_tokens():
    sch = scheduler()
    req = sch.add("a", [1, 2, 3], max_tokens=3)
    sch.check()
    req.seqs[0].num_computed = 2                            # waiting, but "computed": no blocks hold it
    with pytest.raises(PagedKVError, match="waiting request 'a' has computed tokens"):
        sch.check()
    req.seqs[0].num_computed = 0
    req.seqs.append(req.seqs[0])                            # n = 1 with two sequences
    with pytest.raises(PagedKVError, match="2 sequences for n = 1"):
        sch.check()


def test_a_running_request_with_nothing_to_run_is_an_error_not_an_endless_loop():
    sch = scheduler()
    req = sch.add("a", [1, 2, 3], max_tokens=3)
    out = sch.schedule()
    sch.update(out, tokens(out))
    req.seqs[0].num_computed = len(req.seqs[0].tokens)      # corrupt: the pending token marked computed
    with pytest.raises(PagedKVError, match="running but none has a token to run"):
        sch.schedule()
