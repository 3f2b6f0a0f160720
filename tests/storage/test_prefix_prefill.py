"""Prefix caching meets storage: a prompt whose first blocks are cached prefills only its suffix,
attending to the cached blocks as context, and gets the logits of a full prefill (torch reference
and the Triton paged-prefill kernel, in the interpreter on CPU)."""

import pytest
import torch

from paged_kv.blocks import BlockSpaceManager
from paged_kv.storage import PagedKVCache, prepare_paged_batch, read_rows, run_from_manager, run_paged_batch


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_suffix_prefill_over_cached_blocks_equals_full_prefill(small_model, backend):
    if backend == "triton":
        pytest.importorskip("triton")
    cfg, BS = small_model.cfg, 4
    shared, a_tail, b_tail = [3, 1, 4, 1, 5, 9, 2, 6], [5, 3], [8, 9, 7]
    a, b = shared + a_tail, shared + b_tail

    m = BlockSpaceManager(8, BS, enable_prefix_caching=True)
    cache = PagedKVCache(cfg, 8, BS)
    m.allocate("a", len(a))
    run_from_manager(small_model, cache, m, ["a"], [a], "prefill", backend)
    m.cache_full_blocks("a", a, len(a))
    hit = m.cache_hit(b)
    assert len(hit) == 2                                   # the 8 shared tokens, two blocks
    m.allocate("b", len(b), cached=hit)
    assert m.block_table("b").block_ids[:2] == m.block_table("a").block_ids[:2]
    suffix = prepare_paged_batch(read_rows(m, ["b"], [b[8:]], starts=[8]), "prefill")
    assert suffix.metadata.context_lens.tolist() == [8] and suffix.input_ids.shape == (1, 3)
    assert suffix.metadata.query_lens.tolist() == [3] and suffix.metadata.seq_lens.tolist() == [11]
    got = run_paged_batch(small_model, cache, suffix, backend)

    m2, cache2 = BlockSpaceManager(8, BS), PagedKVCache(cfg, 8, BS)      # no cache: all of b
    m2.allocate("b", len(b))
    want = run_from_manager(small_model, cache2, m2, ["b"], [b], "prefill", "torch")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
