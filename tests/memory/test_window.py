"""Sliding-window layers in whole blocks (issue "Faults found by new-user trials"): with paging a
window occupies whole blocks, so the planner must count blocks, never ``window / block_size``.

Expected values are computed here from the cited configs or from a brute-force simulation, never
from the function under test.
"""

import pytest

from paged_kv.memory import model_preset, plan_memory


def test_a_sliding_layer_is_counted_in_whole_blocks():
    # The issue's case: a 1,000-token window at block size 16 is 62.5 blocks of tokens, but a
    # paged layer holds whole blocks.  Mistral-7B-v0.1: 32 sliding layers, 8 KV heads x 128 x fp16.
    spec = model_preset("Mistral-7B").replace(sliding_window=1000)
    block_bytes = 16 * 2 * 8 * 128 * 2  # one block of one layer
    p = plan_memory(spec, "H100", 8192, block_size=16)
    blocks_per_layer = p.kv_bytes_per_sequence / (32 * block_bytes)
    assert blocks_per_layer == int(blocks_per_layer), f"{blocks_per_layer} blocks per layer"


# --- the rule against the manager, simulated -----------------------------------------------------
from collections import deque
from itertools import accumulate

import numpy as np

from paged_kv.errors import ConfigError
from paged_kv.memory import (MODEL_PRESETS, kv_bytes_per_token, kv_cache_bytes, window_blocks,
                             window_max_blocks, window_peak_blocks)


def simulate(window: int, block_size: int, length: int) -> list[int]:
    """Blocks held after each of ``length`` tokens, by brute force: the sequence grows one token per
    step; before token ``p`` (0-based) is written, every block whose last token lies before ``p``'s
    window (positions ``p - window + 1 .. p``) is freed, then the block for ``p`` is allocated if it
    is not held yet (vLLM v1: ``remove_skipped_blocks``, then ``allocate_new_blocks``).
    ``result[t - 1]`` is what a sequence of ``t`` tokens holds."""
    held, out = deque(), []
    for p in range(length):
        first_needed = p - window + 1
        while held and (held[0] + 1) * block_size <= first_needed:   # wholly outside the window
            held.popleft()
        if not held or held[-1] != p // block_size:
            held.append(p // block_size)
        out.append(len(held))
    return out


WINDOWS = [*range(1, 41), 63, 64, 65, 127, 128, 129, 1000, 1024, 4096]
BLOCK_SIZES = [1, 2, 3, 4, 5, 7, 8, 16, 32]


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_window_counts_equal_the_simulated_manager(block_size):
    for window in WINDOWS:
        length = window + 3 * block_size + 3          # past the first length that reaches the peak
        held = [0] + simulate(window, block_size, length)          # held[t]: at t tokens
        peak = list(accumulate(held, max))                         # peak[t]: the most, up to t tokens
        for t in range(length + 1):
            assert window_blocks(t, window, block_size) == held[t], (window, block_size, t)
            assert window_peak_blocks(t, window, block_size) == peak[t], (window, block_size, t)
        assert window_max_blocks(window, block_size) == max(held), (window, block_size)
        assert window_peak_blocks(10 * length, window, block_size) == max(held)


def test_the_issues_window_is_64_whole_blocks_not_62_5():
    held = simulate(1000, 16, 1100)
    assert 1000 / 16 == 62.5 and max(held) == window_max_blocks(1000, 16) == 64
    assert held[1000 - 1] == 63          # the window alone, at 1,000 tokens: ceil(1000 / 16)
    # at one length the count can fall back: 8,192 tokens with a 4,096 window lie in whole blocks
    held = simulate(4096, 16, 8193)
    assert held[8192 - 1] == window_blocks(8192, 4096, 16) == 256
    assert held[8193 - 1] == window_blocks(8193, 4096, 16) == 257 == window_max_blocks(4096, 16)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_vllms_pool_bound_is_our_maximum_or_one_more(block_size):
    """``SlidingWindowSpec.max_memory_usage_bytes`` (vllm/v1/kv_cache_interface.py) with one new
    token per step and a long ``max_model_len``: ``cdiv(W - 1 + 1, BS) + 1`` blocks.  It is never
    below what the manager holds, and one more exactly when BS divides W - 1."""
    for window in WINDOWS:
        vllm_bound = -(-(window - 1 + 1) // block_size) + 1
        ours = window_max_blocks(window, block_size)
        assert vllm_bound - ours == (1 if (window - 1) % block_size == 0 else 0), (window, block_size)


# --- the ledger and the planner in whole blocks ---------------------------------------------------
LENGTHS = [1, 15, 16, 17, 100, 4095, 4096, 4097, 4111, 4112, 8192, 8193, 32768]


@pytest.mark.parametrize("name, window", [("Mistral-7B", 4096), ("Gemma-2-9B", 4096), ("Mistral-7B", 1000),
                                          ("Gemma-2-9B", 100)])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_paged_bytes_per_sequence_are_whole_blocks_at_the_peak(name, window, block_size):
    # mistralai/Mistral-7B-v0.1: 32 layers, all sliding; google/gemma-2-9b: 42 layers, 21 sliding,
    # head_dim 256; both 8 KV heads.  One block of one layer: BS x 2 (K, V) x Hkv x D x 2 B (fp16).
    layers, sliding, head_dim = {"Mistral-7B": (32, 32, 128), "Gemma-2-9B": (42, 21, 256)}[name]
    spec = model_preset(name).replace(sliding_window=window)
    block_bytes = block_size * 2 * 8 * head_dim * 2
    held = simulate(window, block_size, max(LENGTHS))
    for t in LENGTHS:
        blocks = (layers - sliding) * -(-t // block_size) + sliding * max(held[:t])
        assert kv_cache_bytes(spec, t, 3, block_size=block_size) == 3 * blocks * block_bytes, t
        p = plan_memory(spec, "H200", t, 3, block_size=block_size)
        assert p.kv_bytes_per_sequence == blocks * block_bytes and p.kv_bytes == 3 * blocks * block_bytes
        assert p.max_batch_size == p.kv_budget_bytes // (blocks * block_bytes) and p.block_size == block_size


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_block_size_one_is_the_per_token_count_and_larger_blocks_never_hold_less(name):
    for t in (0, 1, 100, 4096, 5000, 40000):
        per_token = kv_cache_bytes(name, t, 2)
        assert kv_cache_bytes(name, t, 2, block_size=1) == per_token
        assert kv_cache_bytes(name, t, 2, block_size=16) >= per_token
    p = plan_memory(name, "H200", 5000, block_size=16)
    assert f"whole blocks of 16 tokens" in p.summary() and "blocks" not in plan_memory(name, "H200", 5000).summary()


def test_paged_bytes_with_tp_and_pp_split_like_the_per_token_count():
    # Gemma-2-9B over PP=2: the busiest stage holds ceil(21 / 2) = 11 full and 11 sliding layers
    block_bytes = 16 * 2 * 8 * 256 * 2 // 2          # TP=2 halves the KV heads
    expect = (11 * -(-8192 // 16) + 11 * max(simulate(4096, 16, 8192))) * block_bytes
    assert kv_cache_bytes("Gemma-2-9B", 8192, 1, tp=2, pp=2, block_size=16) == expect


@pytest.mark.parametrize("call", [lambda: window_blocks(-1, 4, 4), lambda: window_blocks(4, 0, 4),
                                  lambda: window_peak_blocks(4, 4, 0), lambda: window_max_blocks(True, 4),
                                  lambda: window_max_blocks(4, 2.0), lambda: window_blocks(np.int64(4), 4, "4"),
                                  lambda: kv_cache_bytes("Mistral-7B", 8, 1, block_size=0)])
def test_window_counts_refuse_impossible_sizes(call):
    with pytest.raises(ConfigError):
        call()


def test_numpy_integers_count_like_ints():
    assert window_blocks(np.int64(4100), np.int32(4096), np.int64(16)) == window_blocks(4100, 4096, 16)
    assert kv_cache_bytes("Mistral-7B", 8192, 1, block_size=np.int64(16)) == kv_cache_bytes(
        "Mistral-7B", 8192, 1, block_size=16)
