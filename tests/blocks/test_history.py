"""The event history: snapshots are plain data, record what happened, never change afterwards,
agree with the manager, and replay the vLLM paper's Figures 6-7."""

import dataclasses
import json

import pytest

from paged_kv.blocks import BlockSpaceManager
from paged_kv.errors import BlockError, OutOfBlocksError
from paged_kv.blocks import BlockHistory, paper_trace, snapshot


def test_paper_trace_matches_figures_6_and_7():
    """Figure 6: A's blocks 7, 1, 3 hold "Four score and seven" | "years ago our fathers" | "brought";
    Figure 7: B's blocks 5, 2 hold "It was the best" | "of times"; blocks 0, 4, 6, 8 are empty."""
    h = paper_trace()
    assert [e.kind for e in h.events] == ["start", "allocate", "append", "append", "allocate"]
    final = h.snapshots[-1].blocks
    expect = {7: ("A", 0, "Four score and seven"), 1: ("A", 1, "years ago our fathers"), 3: ("A", 2, "brought"),
              5: ("B", 0, "It was the best"), 2: ("B", 1, "of times")}
    for b, (owner, logical, words) in expect.items():
        assert (final[b].owner, final[b].logical, final[b].labels) == (owner, logical, tuple(words.split()))
        assert final[b].filled == len(words.split()) and final[b].ref_count == 1
    assert [b.block_id for b in final if b.ref_count == 0] == [0, 4, 6, 8]
    # Figure 6, steps 1-3: the block table's "# filled" goes 4, 3 -> 4, 4 -> 4, 4, 1
    assert h.snapshots[1].tables["A"] == ((0, 7, 4), (1, 1, 3))
    assert h.snapshots[2].tables["A"] == ((0, 7, 4), (1, 1, 4)) and h.events[2].new_blocks == ()
    assert h.snapshots[3].tables["A"] == ((0, 7, 4), (1, 1, 4), (2, 3, 1)) and h.events[3].new_blocks == (3,)
    assert h.events[2].slots == (1 * 4 + 3,) and h.events[3].slots == (3 * 4 + 0,)
    assert h.snapshots[-1].wasted_slots == (12 - 9) + (8 - 6)


def test_snapshots_are_plain_data_and_frozen_in_time():
    h = paper_trace()
    json.dumps([dataclasses.asdict(s) for s in h.snapshots])   # only ints, strings, tuples, dicts
    assert h.snapshots[1].blocks[1].filled == 3                 # still 3 after "fathers" filled it
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.snapshots[1].blocks[1].filled = 4


def test_every_snapshot_agrees_with_ref_counts_and_pool_size():
    h = BlockHistory(BlockSpaceManager(6, 2))
    h.allocate(0, 3), h.fork(0, 1), h.append(1, "x"), h.append(0, "y"), h.allocate(2, 2), h.free(0)
    for s in h.snapshots:
        assert s.used_blocks + len(s.free_list) == s.num_blocks
        for b in s.blocks:
            assert b.ref_count == len(b.holders)
            assert (b.filled == 0) == (b.ref_count == 0)
    assert h.snapshots[-1] == snapshot(h.manager, h.snapshots[-1].step, h.events[-1], h.labels)


def test_fork_copy_on_write_and_free_events():
    h = BlockHistory(BlockSpaceManager(6, 4))
    h.allocate("p", list("abcde"))                     # blocks 0, 1; block 1 holds "e"
    h.fork("p", "c")
    assert h.snapshots[-1].blocks[1].ref_count == 2
    assert h.snapshots[-1].blocks[1].holders == (("p", 1), ("c", 1))
    ev = h.append("c", "f").event
    assert ev.copies == ((1, 2),) and ev.new_blocks == (2,) and "copy-on-write" in ev.text
    assert h.snapshots[-1].blocks[2].labels == ("e", "f") and h.snapshots[-1].blocks[1].labels == ("e",)
    ev = h.free("p").event
    assert ev.freed_blocks == (1,) and h.snapshots[-1].blocks[0].ref_count == 1


def test_a_failed_event_records_nothing():
    h = BlockHistory(BlockSpaceManager(2, 4))
    h.allocate("a", 8)
    n = len(h.snapshots)
    with pytest.raises(OutOfBlocksError):
        h.allocate("b", 1)
    with pytest.raises(OutOfBlocksError):
        h.append("a", "z")
    assert len(h.snapshots) == n and "b" not in h.labels and len(h.labels["a"]) == 8


@pytest.mark.parametrize("bad,match", [(-3, "must be an int >= 1, got -3"), (0, "got 0"), (2.7, "must be an int >= \\d+, got 2.7")])
def test_bad_prompt_lengths_name_the_value(bad, match):
    h = BlockHistory(BlockSpaceManager(4, 2))
    with pytest.raises(BlockError, match=match):
        h.allocate("a", bad)
    assert len(h.snapshots) == 1 and h.manager.num_free_blocks == 4


def test_preempt_frees_all_blocks_last_first_and_says_so():
    h = BlockHistory(BlockSpaceManager(6, 2))
    h.allocate(0, 5)                                    # blocks 0, 1, 2
    snap = h.preempt(0, "pool full")
    assert snap.event.kind == "preempt" and snap.event.freed_blocks == (2, 1, 0)   # appended in this order
    assert tuple(h.manager.allocator.free_list()) == (3, 4, 5, 2, 1, 0)
    assert snap.event.text.startswith("request 0: preempted (pool full)") and 0 not in snap.tables


def test_captions_name_a_sequence_by_its_noun():
    """A forked sample is not a "request": the paper's Figure 8 captions say "sample A2", Figure 9
    "beam 5"; a plain history still says "request" (one sequence per request)."""
    from paged_kv.blocks import paper_beam_trace, paper_sampling_trace

    fig8 = [e.text for e in paper_sampling_trace().events if e.text]
    assert fig8 and all(t.startswith("sample A") for t in fig8), fig8
    assert "sample A2: forked from sample A1" in fig8[1]
    assert all(e.text.startswith("beam ") for e in paper_beam_trace().events if e.text)
    h = BlockHistory(BlockSpaceManager(4, 2))
    h.allocate("x", 3)
    assert h.events[-1].text.startswith("request x: prompt of 3 tokens")


@pytest.mark.parametrize("bad", ["", "  ", None, 3, "a: b"])
def test_a_bad_noun_is_refused_by_name(bad):
    with pytest.raises(BlockError, match="noun"):
        BlockHistory(BlockSpaceManager(4, 2), noun=bad)
