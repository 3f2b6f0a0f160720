"""Copy-on-write bookkeeping (vLLM paper §4.4) on the chapter's boundary cases, by hand."""

import pytest

from paged_kv.blocks import BlockSpaceManager
from paged_kv.errors import BlockError, OutOfBlocksError


def _refs(m, blocks):
    return [m.allocator.ref_count(b) for b in blocks]


def test_fork_chain_copies_the_shared_partial_block_once():
    # block size 4, a pool of 8, a 10-token prompt: blocks of 4, 4 and 2 tokens
    m = BlockSpaceManager(8, 4)
    m.allocate("A", 10)                                   # blocks 0, 1, 2
    m.fork("A", "B")
    m.fork("B", "C")
    assert _refs(m, [0, 1, 2]) == [3, 3, 3] and m.num_free_blocks == 5
    slot = m.append_slot("C")                             # C writes token 10 into shared block 2
    assert m.take_copies() == [(2, 3)]                    # copied once, to the first free block
    assert m.block_table("C").block_ids == [0, 1, 3] and slot == 3 * 4 + 2
    assert _refs(m, [0, 1, 2, 3]) == [3, 3, 2, 1]
    for seq in ("A", "C", "B"):
        m.free(seq)
    assert m.num_free_blocks == 8
    with pytest.raises(BlockError, match="unknown sequence 'B'"):
        m.free("B")
    m.check()


def test_the_last_holder_writes_in_place():
    m = BlockSpaceManager(8, 4)
    m.allocate("A", 6)                                    # blocks 0 (full), 1 (2 tokens)
    m.fork("A", "B")
    assert m.blocks_to_append_all(["A", "B"]) == 1        # one copy, not two
    assert m.blocks_to_append("A") == m.blocks_to_append("B") == 1   # each alone would copy
    m.append_slot("A")
    assert m.take_copies() == [(1, 2)]
    m.append_slot("B")                                    # block 1 now has one holder: no copy
    assert m.take_copies() == [] and m.block_table("B").block_ids == [0, 1]


def test_blocks_to_append_all_counts_holders_outside_the_step():
    m = BlockSpaceManager(8, 4)
    m.allocate("A", 5)
    m.fork("A", "B")
    m.fork("A", "C")                                      # block 1 (1 token) held 3 times
    assert m.blocks_to_append_all(["A", "B"]) == 2        # C still holds it: both copy
    assert m.blocks_to_append_all(["A", "B", "C"]) == 2
    m.allocate("D", 4)                                    # a full last block: a new one
    assert m.blocks_to_append_all(["D", "A"]) == 2
    with pytest.raises(BlockError, match="named twice"):
        m.blocks_to_append_all(["A", "A"])


def test_a_freed_copy_destination_leaves_the_queue():
    m = BlockSpaceManager(6, 4)
    m.allocate("A", 3)
    m.fork("A", "B")
    m.append_slot("B")                                    # queues (0, 1)
    assert m.pending_copies == ((0, 1),)
    m.free("B")                                           # preempted before the cache copied
    assert m.pending_copies == () and m.num_free_blocks == 5
    m.check()


def test_check_names_a_stale_copy():
    m = BlockSpaceManager(6, 4)
    m.allocate("A", 3)
    m._copies.append((0, 4))                              # corrupt on purpose: block 4 is free
    with pytest.raises(BlockError, match="copies into blocks no table holds"):
        m.check()


def test_out_of_blocks_while_copying_changes_nothing():
    m = BlockSpaceManager(2, 4)
    m.allocate("A", 6)                                    # both blocks
    m.fork("A", "B")
    with pytest.raises(OutOfBlocksError):
        m.append_slot("B")                                # the copy needs a block: none free
    assert m.block_table("B").block_ids == [0, 1] and _refs(m, [0, 1]) == [2, 2]
    m.check()


# --- the paper's Figures 8 and 9, replayed by the real manager --------------------------------------
def test_figure_8_parallel_sampling():
    from paged_kv.blocks import paper_sampling_trace
    h = paper_sampling_trace()
    after_fork = h.snapshots[2]
    assert [b.ref_count for b in after_fork.blocks if b.block_id in (7, 1)] == [2, 2]
    last = h.snapshots[-1]
    assert [e[1] for e in last.tables["A1"]] == [7, 3] and [e[1] for e in last.tables["A2"]] == [7, 1]
    assert h.events[3].copies == ((1, 3),) and h.events[4].copies == ()
    refs = {b.block_id: b.ref_count for b in last.blocks}
    assert (refs[7], refs[1], refs[3]) == (2, 1, 1)
    assert last.blocks[3].labels == ("years", "ago", "our", "fathers")
    assert last.blocks[1].labels == ("years", "ago", "our", "mothers")


def test_figure_9_beam_search():
    from paged_kv.blocks import paper_beam_trace
    h = paper_beam_trace()
    before = next(s for s in h.snapshots if s.event.kind == "fork" and s.event.seq_id == 4)
    tables = {s: [e[1] for e in t] for s, t in h.snapshots[h.snapshots.index(before) - 1].tables.items()}
    assert tables == {0: [0, 1, 3, 5], 1: [0, 1, 3, 6], 2: [0, 1, 3, 7], 3: [0, 2, 4, 8]}
    freed = [b for e in h.events if e.kind == "free" for b in e.freed_blocks]
    assert sorted(freed) == [2, 4, 5, 8]
    last = {s: [e[1] for e in t] for s, t in h.snapshots[-1].tables.items()}
    assert last == {1: [0, 1, 3, 6, 9], 4: [0, 1, 3, 6, 10], 2: [0, 1, 3, 7, 11], 5: [0, 1, 3, 7, 12]}
    refs = {b.block_id: b.ref_count for b in h.snapshots[-1].blocks}
    assert (refs[0], refs[1], refs[3], refs[6], refs[7]) == (4, 4, 4, 2, 2)
    h.manager.check()
