"""Golden equivalence for chapter 5: paged cache == contiguous cache == recompute, token for token.

Also the paged cache itself: sizing from a byte budget, the slot-mapping writes, copy-on-write
block copies, and all-or-nothing out-of-blocks errors of the decoder.
"""

import random

import pytest
import torch

from paged_kv.blocks import BlockHistory, BlockSpaceManager
from paged_kv.errors import OutOfBlocksError
from paged_kv.decoding import ContiguousDecoder, generate
from paged_kv.decoding import PagedDecoder

# Lengths 7, 1, 17, 16: with 16-token blocks the batch starts inside, at and past a boundary.
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [40], list(range(100, 117)), list(range(60, 76))]


def _greedy(decoder, prompts, n):
    """generate()'s loop over a decoder we built ourselves; returns tokens and [n, B, V] logits."""
    logits = [decoder.prefill(prompts)]
    tokens = [logits[-1].argmax(-1).tolist()]
    for _ in range(n - 1):
        logits.append(decoder.decode(tokens[-1]))
        tokens.append(logits[-1].argmax(-1).tolist())
    return [list(t) for t in zip(*tokens)], torch.stack(logits)


def test_paged_equals_contiguous_equals_recompute(small_model):
    runs = {c: generate(small_model, PROMPTS, 24, cache=c, keep_logits=True)
            for c in ("recompute", "contiguous", "paged")}
    assert runs["paged"].tokens == runs["contiguous"].tokens == runs["recompute"].tokens
    torch.testing.assert_close(runs["paged"].logits, runs["contiguous"].logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(runs["paged"].logits, runs["recompute"].logits, atol=1e-4, rtol=1e-4)


def test_triton_backend_paged_equals_torch(small_model):
    torch_run = generate(small_model, PROMPTS, 8, cache="paged", keep_logits=True)
    triton_run = generate(small_model, PROMPTS, 8, cache="paged", backend="triton", keep_logits=True)
    contiguous = generate(small_model, PROMPTS, 8, cache="contiguous", backend="triton")
    assert triton_run.tokens == torch_run.tokens == contiguous.tokens
    torch.testing.assert_close(triton_run.logits, torch_run.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_scattered_small_blocks_give_the_same_tokens(small_model, backend):
    """Block size 4 and a shuffled free list: every sequence's blocks land far apart."""
    n = 6 if backend == "triton" else 20
    expected = generate(small_model, PROMPTS, n, cache="contiguous").tokens
    order = list(range(40))
    random.Random(0).shuffle(order)
    pool = BlockHistory(BlockSpaceManager(40, 4, free_order=order), record=False)
    decoder = PagedDecoder(small_model, backend, PROMPTS, n, block_size=4, history=pool)
    tokens, _ = _greedy(decoder, PROMPTS, n)
    assert tokens == expected
    tables = decoder.block_tables()
    assert tables[2, :5].tolist() == list(decoder.manager.block_table(2))[:5]
    assert tables[2, :5].tolist() != sorted(tables[2, :5].tolist())   # not in physical order


def test_blocks_grow_on_demand(small_model):
    cfg, n, BS = small_model.cfg, 10, 16
    seen = []
    res = generate(small_model, PROMPTS, n, cache="paged",
                   on_step=lambda step, d: seen.append([len(d.manager.block_table(i)) for i in range(4)]))
    # After the prefill and each decode step, sequence b holds ceil(tokens / BS) blocks.
    for step, blocks in enumerate(seen):
        tokens = [len(p) + step for p in PROMPTS]
        assert blocks == [-(-t // BS) for t in tokens], f"step {step}"
    per_block = 2 * cfg.num_layers * BS * cfg.num_kv_heads * cfg.head_dim * 4    # fp32 bytes
    # the last sampled token is never fed back, so each sequence stores prompt + n - 1 tokens
    pool_blocks = sum(-(-(len(p) + n - 1) // BS) for p in PROMPTS)               # 1+1+2+2
    assert res.cache_bytes == pool_blocks * per_block


def test_pool_against_contiguous_reservation(small_model):
    """A ragged batch: contiguous reserves 4 x 69 slots (60 + 10 - 1: the last token is never
    written), the pool 5 + 1 + 1 + 2 blocks of 16.

    (On a batch of near-equal lengths, like PROMPTS, rounding up to blocks can cost more than
    the contiguous padding: 7 x 16 = 112 slots against 4 x 27 = 108.)
    """
    cfg, n = small_model.cfg, 10
    prompts = [[1] * 60, [2], [3] * 5, [4] * 20]
    per_slot = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
    paged = generate(small_model, prompts, n, cache="paged")
    contiguous = generate(small_model, prompts, n, cache="contiguous")
    assert paged.tokens == contiguous.tokens
    assert contiguous.cache_bytes == 4 * 69 * per_slot
    assert paged.cache_bytes == (5 + 1 + 1 + 2) * 16 * per_slot


def test_paged_cache_holds_the_contiguous_cache_rows(small_model):
    """After prefill + 5 steps, gathering each sequence's slots gives the contiguous rows."""
    n = 6
    paged = PagedDecoder(small_model, "torch", PROMPTS, n, block_size=8)
    contig = ContiguousDecoder(small_model, "torch", len(PROMPTS), max(map(len, PROMPTS)) + n)
    assert _greedy(paged, PROMPTS, n)[0] == _greedy(contig, PROMPTS, n)[0]
    for layer in range(small_model.cfg.num_layers):
        for b, p in enumerate(PROMPTS):
            t = len(p) + n - 1                                 # the last token is never fed back
            slots = torch.tensor(paged.manager.slot_mapping(b, 0, t))
            k = paged.cache.k_cache[layer].flatten(0, 1)[slots]
            v = paged.cache.v_cache[layer].flatten(0, 1)[slots]
            torch.testing.assert_close(k, contig.cache.k[layer][b, :t], atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(v, contig.cache.v[layer][b, :t], atol=1e-6, rtol=1e-6)


def test_out_of_blocks_is_all_or_nothing(small_model):
    # Prompts need 1 + 1 + 2 + 1 = 5 blocks; a pool of 4 refuses the whole batch.
    small = PagedDecoder(small_model, "torch", PROMPTS, 4, num_blocks=4)
    with pytest.raises(OutOfBlocksError) as err:
        small.prefill(PROMPTS)
    assert (err.value.needed, err.value.free) == (5, 4)
    assert small.manager.num_free_blocks == 4 and small.manager.seq_ids == []
    # Exactly the prompts' blocks: the first decode step needs a block for the 16-token prompt.
    tight = PagedDecoder(small_model, "torch", PROMPTS, 4, num_blocks=5)
    logits = tight.prefill(PROMPTS)
    with pytest.raises(OutOfBlocksError) as err:
        tight.decode(logits.argmax(-1).tolist())
    assert (err.value.needed, err.value.free) == (1, 0)
    assert [tight.manager.num_tokens(i) for i in range(4)] == [len(p) for p in PROMPTS]
    tight.free()
    assert tight.manager.num_free_blocks == 5


# --- PagedKVCache ----------------------------------------------------------------------------






