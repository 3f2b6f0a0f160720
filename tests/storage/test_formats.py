"""Format bridges: vLLM, FlashInfer and FlashAttention metadata for one block-manager state must
describe exactly the same tokens (decoded from the tensors alone), with the dtypes those engines take."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_kv.blocks import BlockSpaceManager
from paged_kv.errors import OutOfBlocksError
from paged_kv.storage import (FlashAttnLayout, FlashInferLayout, VLLMLayout, all_layouts, flash_attn_layout,
                              flashinfer_layout, token_locations, vllm_layout)
from paged_kv.blocks import paper_trace


def figure7_manager():
    return paper_trace().manager


def test_figure_7_in_all_three_formats():
    """Expected values read off the vLLM paper's Figure 7: A holds 9 tokens in blocks 7, 1, 3 and
    B holds 6 in blocks 5, 2 (block size 4)."""
    m = figure7_manager()
    v = vllm_layout(m)
    assert v.block_tables.tolist() == [[7, 1, 3], [5, 2, 0]] and v.seq_lens.tolist() == [9, 6]
    assert v.slot_mapping.tolist() == [28, 29, 30, 31, 4, 5, 6, 7, 12, 20, 21, 22, 23, 8, 9]
    fi = flashinfer_layout(m)
    assert fi.kv_indptr.tolist() == [0, 3, 5] and fi.kv_indices.tolist() == [7, 1, 3, 5, 2]
    assert fi.kv_last_page_len.tolist() == [1, 2]
    fa = flash_attn_layout(m)
    assert fa.block_table.tolist() == [[7, 1, 3], [5, 2, 0]] and fa.cache_seqlens.tolist() == [9, 6]


def test_decode_step_slot_mapping_holds_only_the_new_tokens():
    m = figure7_manager()
    m.append_slot("A"), m.append_slot("B")          # A: 10th token -> block 3 offset 1; B: 7th -> block 2 offset 2
    v = vllm_layout(m, new_tokens=1)
    assert v.slot_mapping.tolist() == [3 * 4 + 1, 2 * 4 + 2] and v.query_lens.tolist() == [1, 1]
    assert v.written_locations() == [[(3, 1)], [(2, 2)]]
    v = vllm_layout(m, new_tokens=[2, 0])
    assert v.written_locations() == [[(3, 0), (3, 1)], []]


def test_dtypes_are_what_the_engines_take():
    m = figure7_manager()
    v, fi, fa = vllm_layout(m), flashinfer_layout(m), flash_attn_layout(m)
    assert v.block_tables.dtype == v.seq_lens.dtype == torch.int32 and v.slot_mapping.dtype == torch.int64
    assert fi.kv_indptr.dtype == fi.kv_indices.dtype == fi.kv_last_page_len.dtype == torch.int32
    assert fa.block_table.dtype == fa.cache_seqlens.dtype == torch.int32


def test_last_page_len_is_never_zero_and_pad_is_configurable():
    m = BlockSpaceManager(8, 4)
    m.allocate("x", 8), m.allocate("y", 1)
    assert flashinfer_layout(m).kv_last_page_len.tolist() == [4, 1]
    assert vllm_layout(m, pad=-1).block_tables.tolist() == [[0, 1], [2, -1]]


def test_sequence_order_follows_seq_ids():
    m = figure7_manager()
    assert flash_attn_layout(m, ["B", "A"]).cache_seqlens.tolist() == [6, 9]
    assert token_locations(m, ["B"]) == [[(5, 0), (5, 1), (5, 2), (5, 3), (2, 0), (2, 1)]]


def test_a_wrong_field_changes_the_decoded_tokens():
    """The comparison can fail: each field matters to the decoding."""
    m = figure7_manager()
    truth = token_locations(m)
    fi = flashinfer_layout(m)
    assert fi.token_locations() == truth
    assert FlashInferLayout(4, fi.kv_indptr, fi.kv_indices, fi.kv_last_page_len + 1).token_locations() != truth
    assert FlashInferLayout(4, fi.kv_indptr, fi.kv_indices.flip(0), fi.kv_last_page_len).token_locations() != truth
    fa = flash_attn_layout(m)
    assert FlashAttnLayout(4, fa.block_table, fa.cache_seqlens - 1).token_locations() != truth
    v = vllm_layout(m)
    assert VLLMLayout(4, v.block_tables, v.seq_lens, v.query_lens, v.slot_mapping + 1).written_locations() != truth


def test_empty_state():
    m = BlockSpaceManager(4, 4)
    layouts = all_layouts(m)
    assert all(layout.token_locations() == [] for layout in layouts.values())
    assert layouts["FlashInfer"].kv_indptr.tolist() == [0]


ops = st.lists(st.tuples(st.sampled_from(["allocate", "append", "fork", "free"]), st.integers(1, 40),
                         st.integers(0, 10)), max_size=40)


@settings(max_examples=120, deadline=None)
@given(ops=ops, block_size=st.sampled_from([1, 3, 4, 16]), num_blocks=st.integers(1, 24))
def test_all_three_formats_describe_the_same_tokens(ops, block_size, num_blocks):
    m = BlockSpaceManager(num_blocks, block_size, free_order=list(reversed(range(num_blocks))))
    next_id = 0
    for op, n, pick in ops:
        live = m.seq_ids
        try:
            if op == "allocate":
                m.allocate(next_id, n)
                next_id += 1
            elif live and op == "append":
                m.append_slot(live[pick % len(live)])
            elif live and op == "fork":
                m.fork(live[pick % len(live)], next_id)
                next_id += 1
            elif live and op == "free":
                m.free(live[pick % len(live)])
        except OutOfBlocksError:
            pass
    truth = token_locations(m)
    # independent of the block table: the manager's own slot mapping, decoded
    assert truth == [[divmod(s, block_size) for s in m.slot_mapping(q)] for q in m.seq_ids]
    layouts = all_layouts(m)
    for name, layout in layouts.items():
        assert layout.token_locations() == truth, name
    assert layouts["vLLM"].written_locations() == truth
