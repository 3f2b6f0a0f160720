"""Swapping a group's blocks to the CPU pool and back (vLLM paper §4.5), each shared block once."""

import pytest

from paged_kv.blocks import BlockSpaceManager
from paged_kv.errors import BlockError, OutOfBlocksError


def _group():
    m = BlockSpaceManager(8, 4, num_cpu_blocks=6)
    m.allocate("a", 10)                    # blocks 0, 1, 2
    m.fork("a", "b")
    m.append_slot("b")                     # b copies block 2 -> 3
    m.take_copies()
    m.allocate("c", 3)                     # block 4, another request
    return m


def test_swap_out_moves_each_shared_block_once_and_back():
    m = _group()
    mapping = m.swap_out(["a", "b"])
    assert mapping == [(0, 0), (1, 1), (2, 2), (3, 3)]        # 4 distinct blocks, not 3 + 3
    assert m.swapped_ids == ["a", "b"] and m.seq_ids == ["c"] and m.num_free_blocks == 7
    assert [m.cpu_allocator.ref_count(b) for b in range(4)] == [2, 2, 1, 1]   # ref counts travel
    m.check()
    m.allocate("d", 12)                    # the freed GPU blocks are reused meanwhile
    back = m.swap_in(["a", "b"])
    assert [c for c, _ in back] == [0, 1, 2, 3] and len({g for _, g in back}) == 4
    ta, tb = m.block_table("a").block_ids, m.block_table("b").block_ids
    assert ta[:2] == tb[:2] and ta[2] != tb[2] and m.allocator.ref_count(ta[0]) == 2
    assert m.cpu_allocator.num_free_blocks == 6
    m.check()


def test_swap_needs_the_whole_group_and_room():
    m = _group()
    with pytest.raises(BlockError, match="held outside"):
        m.swap_out(["a"])                  # b shares blocks 0 and 1
    small = BlockSpaceManager(8, 4, num_cpu_blocks=2)
    small.allocate("x", 12)
    assert not small.can_swap_out(["x"])
    with pytest.raises(OutOfBlocksError):
        small.swap_out(["x"])
    assert small.seq_ids == ["x"] and small.cpu_allocator.num_free_blocks == 2
    with pytest.raises(BlockError, match="no CPU pool"):
        BlockSpaceManager(4, 4).swap_out([])


def test_a_swapped_sequence_can_be_freed_and_queued_copies_block_swapping():
    m = _group()
    m.swap_out(["a", "b"])
    m.free("a")
    m.free("b")
    assert m.cpu_allocator.num_free_blocks == 6 and "a" not in m
    m.check()
    m.fork("c", "e")
    m.append_slot("e")                     # queues a copy of c's partial block
    with pytest.raises(BlockError, match="apply them first"):
        m.swap_out(["c", "e"])
