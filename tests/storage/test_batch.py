"""The one batch step (paged_kv.storage.batch): block state -> tensors -> forward pass, in order.

Expected slots are written out by hand from the block ids the free-list order fixes, never read
back from the function under test.
"""

import pytest
import torch

from paged_kv.blocks import BlockSpaceManager
from paged_kv.errors import ConfigError, PromptError
from paged_kv.scheduling import Scheduler, SchedulerConfig
from paged_kv.storage import (BatchRow, PagedKVCache, padded_block_tables, prepare_paged_batch, read_rows,
                              run_from_manager, run_paged_batch)


def _manager():
    # free list 3, 0, 2, 1, ...: "a" (5 tokens) gets blocks [3, 0], "b" (3 tokens) gets [2]
    m = BlockSpaceManager(6, 4, free_order=[3, 0, 2, 1, 4, 5])
    m.allocate("a", 5)
    m.allocate("b", 3)
    return m


def batch(manager, seqs, tokens, phase, starts=None):
    return prepare_paged_batch(read_rows(manager, seqs, tokens, starts), phase)


def test_prefill_batch_from_the_manager():
    b = batch(_manager(), ["a", "b"], [[10, 11, 12, 13, 14], [20, 21, 22]], "prefill")
    meta = b.metadata
    assert b.input_ids.tolist() == [[10, 11, 12, 13, 14], [20, 21, 22, 0, 0]]
    assert meta.phase == "prefill" and meta.seq_lens.tolist() == [5, 3] and meta.seq_lens.dtype == torch.int32
    assert meta.query_lens.tolist() == [5, 3] and meta.context_lens.tolist() == [0, 0]
    assert meta.positions[0].tolist() == [0, 1, 2, 3, 4] and meta.positions[1, :3].tolist() == [0, 1, 2]
    # block 3 holds tokens 0-3 of "a" (slots 12-15), block 0 token 4 (slot 0); "b" lives in block 2
    assert meta.slot_mapping.tolist() == [[12, 13, 14, 15, 0], [8, 9, 10, -1, -1]]
    assert meta.slot_mapping.dtype == torch.int64
    assert meta.block_tables.tolist() == [[3, 0], [2, 0]] and meta.block_tables.dtype == torch.int32
    assert b.num_new.tolist() == [5, 3]


def test_a_later_chunk_counts_its_context_in_seq_lens_as_vllm_does():
    # "a" holds 5 tokens; run tokens 2..4 as a chunk: 3 new (query_lens), 5 read (seq_lens)
    meta = batch(_manager(), ["a"], [[12, 13, 14]], "prefill", starts=[2]).metadata
    assert meta.query_lens.tolist() == [3] and meta.seq_lens.tolist() == [5] and meta.context_lens.tolist() == [2]
    assert meta.positions.tolist() == [[2, 3, 4]] and meta.slot_mapping.tolist() == [[14, 15, 0]]


def test_a_scheduler_chunk_is_a_row_and_carries_everything_the_pass_needs():
    sch = Scheduler(SchedulerConfig(num_gpu_blocks=6, block_size=4, watermark=0.0, max_num_batched_tokens=3))
    sch.add("r", [10, 11, 12, 13, 14], max_tokens=2)
    sch.update(out := sch.schedule(), {})                   # tokens 0-2
    (c,) = sch.schedule().chunks                           # tokens 3-4: a chunk inside block 0
    assert (c.start, c.token_ids, c.query_len, c.seq_len, list(c.positions)) == (3, (13, 14), 2, 5, [3, 4])
    assert c.block_table == (0, 1) and c.slot_mapping == (3, 4) and c.sample and out.chunks[0].token_ids == (10, 11, 12)
    meta = prepare_paged_batch([c], "prefill").metadata
    want = prepare_paged_batch([BatchRow([13, 14], 3, [3, 4], [0, 1])], "prefill").metadata
    for name in ("positions", "seq_lens", "query_lens", "slot_mapping", "block_tables"):
        assert torch.equal(getattr(meta, name), getattr(want, name)), name


def test_decode_batch_after_append_slot():
    m = _manager()
    m.append_slot("a")       # token 5 -> block 0, offset 1 = slot 1
    m.append_slot("b")       # token 3 -> block 2, offset 3 = slot 11
    meta = batch(m, ["b", "a"], [[7], [8]], "decode").metadata
    assert meta.phase == "decode" and meta.positions.tolist() == [[3], [5]]
    assert meta.seq_lens.tolist() == [4, 6] and meta.query_lens.tolist() == [1, 1]   # the new token included
    assert meta.slot_mapping.tolist() == [[11], [1]]
    assert padded_block_tables([m.block_ids("b"), m.block_ids("a")], pad=-1).tolist() == [[2, -1], [3, 0]]


def test_copy_on_write_copies_are_taken_and_applied_once(small_model):
    m = _manager()
    cache = PagedKVCache(small_model.cfg, 6, 4)
    m.fork("b", "c")                    # c shares block 2 (3 of 4 slots filled)
    m.append_slot("c")                  # c writes into the shared, partly filled block: copy it
    assert m.pending_copies == ((2, 1),)          # free list after 3, 0, 2 is 1, 4, 5
    assert batch(m, ["c"], [[9]], "decode").metadata.slot_mapping.tolist() == [[7]]     # block 1, offset 3
    assert m.pending_copies == ((2, 1),)          # reading the rows takes nothing
    applied = []
    real = cache.copy_blocks
    cache.copy_blocks = lambda copies, backend="torch": (applied.append(list(copies)), real(copies, backend))
    run_from_manager(small_model, cache, m, ["c"], [[9]], "decode")
    assert applied == [[(2, 1)]] and m.pending_copies == ()


def test_run_applies_the_copies_before_the_new_token_is_written(small_model):
    torch.manual_seed(0)
    cfg = small_model.cfg
    m = BlockSpaceManager(6, 4, free_order=[3, 0, 2, 1, 4, 5])
    cache = PagedKVCache(cfg, 6, 4)
    m.allocate("b", 3)                                                   # block 3
    run_from_manager(small_model, cache, m, ["b"], [[5, 6, 7]], "prefill")
    parent_k = cache.k_cache[0][3].clone()
    m.fork("b", "c")
    m.append_slot("c")                                                   # copy 3 -> 0
    logits = run_from_manager(small_model, cache, m, ["c"], [[8]], "decode")
    assert logits.shape == (1, cfg.vocab_size)
    assert torch.equal(cache.k_cache[0][0, :3], parent_k[:3])            # the shared tokens came along
    assert cache.k_cache[0][0, 3].abs().sum() > 0                        # the new token landed in the copy
    assert torch.equal(cache.k_cache[0][3], parent_k)                    # the parent's block is untouched


@pytest.mark.parametrize("seqs,tokens,phase,err,match", [
    (["a"], [[1, 2, 3, 4, 5]], "verify", ConfigError, "phase"),
    (["a"], [[1, 2]], "decode", ConfigError, "one token"),
    (["a"], [[1] * 6], "prefill", PromptError, "holds 5 tokens; cannot run 6"),
    (["a", "b"], [[1]], "decode", PromptError, "one token list per sequence"),
    ([], [], "decode", PromptError, "one token list"),
])
def test_bad_batches_raise(seqs, tokens, phase, err, match):
    with pytest.raises(err, match=match):
        batch(_manager(), seqs, tokens, phase)
