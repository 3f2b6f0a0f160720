"""The scheduler alone (no tensors): admission now/later/never, chunk slots, preemption, swaps, pools."""

import pytest

from paged_kv.errors import AdmissionError, ConfigError, PagedKVError
from paged_kv.scheduling import Scheduler, SchedulerConfig, Verdict, group_blocks_needed


def run(sch: Scheduler, steps: int = 1000, token: int = 7) -> list:
    """Drive the scheduler with a fake model that samples ``token``; returns the step outputs."""
    outs = []
    for _ in range(steps):
        if not sch.has_unfinished:
            break
        out = sch.schedule()
        sch.update(out, {c.seq_id: [token] * c.num_samples for c in out.chunks if c.sample})
        sch.check()
        outs.append(out)
    assert not sch.has_unfinished, "the requests did not finish"
    return outs


def test_issue_admission_example():
    """Block size 4, 6 blocks, no watermark: X (22 + 4 new -> 25 stored = 7 blocks) never; W (21 + 4
    -> 24 = 6 blocks) alone; W' (21 + 5) never; nothing refused moves anyone."""
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=6, block_size=4, watermark=0.0))
    with pytest.raises(AdmissionError, match="7 blocks"):
        sch.add("X", list(range(22)), max_tokens=4)
    assert not sch.waiting and sch.num_preemptions == 0
    sch.add("Y", list(range(6)), max_tokens=4)
    sch.add("Z", list(range(5)), max_tokens=3)
    run(sch)
    assert sch.num_preemptions == sch.num_swaps == 0
    sch.add("W", list(range(21)), max_tokens=4)
    out = sch.schedule()
    assert [c.request_id for c in out.chunks] == ["W"] and sch.manager.num_free_blocks == 0
    sch.update(out, {c.seq_id: [7] for c in out.chunks if c.sample})
    run(sch)
    assert sch.manager.num_free_blocks == 6 and sch.finished[-1].request_id == "W"
    assert sch.num_preemptions == 0
    with pytest.raises(AdmissionError, match="25 stored tokens"):
        sch.add("W'", list(range(21)), max_tokens=5)
    assert sch.manager.num_free_blocks == 6


def test_admission_verdicts_name_their_reason():
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=4, block_size=4, watermark=0.0, max_num_seqs=1))
    a = sch.add("a", [1] * 8, max_tokens=4)
    assert sch.admission(a).verdict is Verdict.NOW
    sch.schedule()
    b = sch.add("b", [1] * 4, max_tokens=2)
    verdict = sch.admission(b)
    assert verdict.verdict is Verdict.LATER and "max_num_seqs" in verdict.reason
    assert sch.admission(b, preempted_this_step=True).reason == "a request was preempted in this step"


def test_watermark_and_budget_nevers():
    with pytest.raises(AdmissionError, match="watermark"):
        Scheduler(SchedulerConfig(num_gpu_blocks=10, block_size=4, watermark=0.2)).add("a", [1] * 37, max_tokens=1)
    with pytest.raises(AdmissionError, match="chunked prefill off"):
        Scheduler(SchedulerConfig(num_gpu_blocks=64, block_size=4, enable_chunked_prefill=False,
                                  max_num_batched_tokens=8)).add("a", [1] * 6, max_tokens=4)
    with pytest.raises(AdmissionError, match="max_model_len"):
        Scheduler(SchedulerConfig(num_gpu_blocks=64, max_model_len=10)).add("a", [1] * 6, max_tokens=5)


def test_group_blocks_needed_counts_shared_prompt_blocks_once():
    # prompt 9 at BS 4: 2 full blocks shared; each of 3 samples holds ceil(14/4) = 4 blocks
    assert group_blocks_needed(9, 14, 3, 4) == 2 + 3 * 2
    assert group_blocks_needed(9, 14, 1, 4) == 4


def test_chunks_follow_the_budget_and_start_inside_blocks():
    """A 13-token prompt with budget 5: chunks of 5, 5, 3; each token t in slot table[t//4]*4 + t%4."""
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=10, block_size=4, max_num_batched_tokens=5, watermark=0.0))
    sch.add("a", list(range(13)), max_tokens=2)
    table = None
    starts, sampled_before_end = [], []
    while sch.has_unfinished:
        out = sch.schedule()
        for c in out.chunks:
            table = table or sch.manager.block_table(c.seq_id).block_ids
            assert list(c.slot_mapping) == [table[t // 4] * 4 + t % 4 for t in range(c.start, c.start + c.query_len)]
            starts.append((c.start, c.query_len))
            if c.sample and c.start + c.query_len < 13:
                sampled_before_end.append(c)
        sch.update(out, {c.seq_id: [1] for c in out.chunks if c.sample})
    assert starts == [(0, 5), (5, 5), (10, 3), (13, 1)]
    assert not sampled_before_end


def test_decodes_come_first_and_share_the_budget():
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=64, block_size=4, max_num_batched_tokens=6, watermark=0.0))
    sch.add("a", [1] * 3, max_tokens=5)
    out = sch.schedule()
    sch.update(out, {c.seq_id: [2] for c in out.chunks if c.sample})
    sch.add("b", [1] * 20, max_tokens=2)
    out = sch.schedule()
    assert [(c.request_id, c.query_len) for c in out.chunks] == [("a", 1), ("b", 5)]
    assert out.decode_tokens == 1 and out.prefill_tokens == 5


def _pressure(mode: str):
    """Two requests that cannot both finish in 6 blocks of 4: the later one is preempted."""
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=6, block_size=4, watermark=0.0, preemption_mode=mode,
                                    num_cpu_blocks=6 if mode == "swap" else 0))
    sch.add("old", [1] * 4, max_tokens=12)     # up to 15 stored tokens: 4 blocks
    sch.add("new", [1] * 4, max_tokens=12)
    return sch


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_takes_the_latest_arrival(mode):
    sch = _pressure(mode)
    outs = run(sch)
    preempted = [rid for o in outs for rid in o.preempted]
    assert preempted and set(preempted) == {"new"}
    assert sch.manager.num_free_blocks == 6
    assert [r.request_id for r in sch.finished] == ["old", "new"]
    assert all(len(s.output) == 12 for r in sch.finished for s in r.seqs)
    if mode == "swap":
        assert sch.num_swaps >= 1 and sch.num_swapped_blocks >= 1
        assert any(o.swap_out for o in outs) and any(o.swap_in for o in outs)
    else:
        assert sch.num_recomputes >= 1 and not any(o.swap_out for o in outs)


def test_recompute_resumes_with_generated_tokens_as_context():
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4, watermark=0.0))
    req = sch.add("a", [1] * 5, max_tokens=12)
    while len(req.seqs[0].output) < 7:
        out = sch.schedule()
        sch.update(out, {c.seq_id: [3] for c in out.chunks if c.sample})
    assert sch.preempt("a") == "recompute"
    assert sch.waiting[0] is req and req.seqs[0].num_computed == 0 and sch.manager.num_free_blocks == 8
    out = sch.schedule()
    (chunk,) = out.chunks
    assert (chunk.start, chunk.query_len, chunk.sample) == (0, 12, True)
    assert len(sch.manager.block_table(chunk.seq_id)) == 3          # ceil(12 / 4)
    assert req.seqs[0].prompt_len == 5                              # outputs stay outputs


def test_swap_moves_a_group_and_each_shared_block_once():
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=16, block_size=4, watermark=0.0, preemption_mode="swap",
                                    num_cpu_blocks=16))
    req = sch.add("g", [1] * 9, n=3, max_tokens=4)
    for _ in range(2):
        out = sch.schedule()
        sch.update(out, {c.seq_id: [c.seq_id] * c.num_samples for c in out.chunks if c.sample})
    ids = [s.seq_id for s in req.seqs]
    distinct = {b for s in ids for b in sch.manager.block_table(s).block_ids}
    held = sum(len(sch.manager.block_table(s)) for s in ids)
    assert len(ids) == 3 and len(distinct) < held                  # the prompt's full blocks are shared
    assert sch.preempt("g") == "swap"
    assert sch.num_swapped_blocks == len(distinct)
    assert sch.manager.num_free_blocks == 16
    sch.check()
    run(sch)
    assert sch.manager.num_free_blocks == 16 and all(len(s.output) == 4 for s in req.seqs)


def test_swap_falls_back_to_recompute_when_the_cpu_pool_is_full():
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=8, block_size=4, watermark=0.0, preemption_mode="swap",
                                    num_cpu_blocks=1))
    sch.add("a", [1] * 9, max_tokens=3)
    out = sch.schedule()
    sch.update(out, {c.seq_id: [5] for c in out.chunks if c.sample})
    assert sch.preempt("a") == "recompute"
    assert sch.num_recomputes == 1 and sch.num_swaps == 0


def test_group_recompute_forks_at_the_prompt_end():
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=32, block_size=4, watermark=0.0))
    req = sch.add("g", [1] * 6, n=2, max_tokens=5)
    for _ in range(3):
        out = sch.schedule()
        sch.update(out, {c.seq_id: [10 + c.seq_id] * c.num_samples for c in out.chunks if c.sample})
    before = [list(s.tokens) for s in req.seqs]
    sch.preempt("g")
    out = sch.schedule()
    assert [(c.start, c.query_len, c.sample) for c in out.chunks] == [(0, 6, False)]   # the prompt, once
    sch.update(out, {})
    out = sch.schedule()
    assert sorted((c.start, c.query_len, c.sample) for c in out.chunks) == [(6, 3, True), (6, 3, True)]
    assert [list(s.tokens) for s in req.seqs] == before
    sch.check()


def test_errors_name_the_bad_value():
    with pytest.raises(ConfigError, match="num_cpu_blocks"):
        SchedulerConfig(num_gpu_blocks=4, preemption_mode="swap")
    with pytest.raises(ConfigError, match="'sometimes'"):
        SchedulerConfig(num_gpu_blocks=4, preemption_mode="sometimes")
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=4))
    with pytest.raises(PagedKVError, match="no request 'nobody'"):
        sch.preempt("nobody")
    sch.add("a", [1], max_tokens=1)
    with pytest.raises(AdmissionError, match="already in use"):
        sch.add("a", [1], max_tokens=1)
    out = sch.schedule()
    with pytest.raises(PagedKVError, match="sampled tokens do not match"):
        sch.update(out, {})


def test_reservation_holds_the_whole_request_up_front():
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=16, block_size=4, watermark=0.0, reservation="oracle"))
    sch.add("a", [1] * 5, max_tokens=8)          # 12 stored tokens: 3 blocks from the start
    sch.schedule()
    assert sch.manager.num_free_blocks == 13
    with pytest.raises(AdmissionError, match="n = 1"):
        sch.add("b", [1] * 5, n=2, max_tokens=2)


def test_nobody_new_starts_while_a_request_is_swapped_out():
    """vLLM paper §4.5: with swapping, new requests wait until the swapped-out ones are back."""
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=16, block_size=4, watermark=0.0, preemption_mode="swap",
                                    num_cpu_blocks=16))
    sch.add("a", [1] * 4, max_tokens=6)
    sch.add("b", [1] * 4, max_tokens=6)
    out = sch.schedule()
    sch.update(out, {c.seq_id: [2] for c in out.chunks if c.sample})
    sch.preempt("b")
    new = sch.add("c", [1] * 2, max_tokens=2)
    verdict = sch.admission(new)
    assert verdict.verdict is Verdict.LATER and "swapped out" in verdict.reason
    starts = []
    while sch.has_unfinished:
        out = sch.schedule()
        starts += out.admitted
        sch.update(out, {c.seq_id: [2] for c in out.chunks if c.sample})
    assert starts.index("b") < starts.index("c")


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_group_whose_leader_finished_first_resumes_after_preemption(mode):
    """A tight budget re-prefills one sample before the other, so the leader (sample 0) finishes a
    step before its sibling; preempted then, the group must resume from the unfinished sample."""
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=32, block_size=4, watermark=0.0, max_num_batched_tokens=3,
                                    preemption_mode=mode, num_cpu_blocks=32))
    req = sch.add("g", [1] * 3, n=2, max_tokens=4)
    for _ in range(2):                                  # the prompt (forks 2 samples); one decode
        out = sch.schedule()
        sch.update(out, {c.seq_id: [5] * c.num_samples for c in out.chunks if c.sample})
    assert [s.num_generated for s in req.seqs] == [2, 2]
    sch.preempt("g", "recompute")                       # uneven re-prefill: the leader gets ahead
    while req.seqs[0].num_generated < 4:
        out = sch.schedule()
        sch.update(out, {c.seq_id: [5] * c.num_samples for c in out.chunks if c.sample})
        sch.check()
    assert req.seqs[1].num_generated < 4 and req.seqs[0].seq_id not in sch.manager
    assert sch.preempt("g") == mode
    sch.check()
    outs = run(sch, steps=50)
    assert all(s.num_generated == 4 for s in req.seqs) and len(outs) < 50
    assert sch.manager.num_free_blocks == 32
