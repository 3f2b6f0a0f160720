"""Sliding-window layers in whole blocks (issue "Faults found by new-user trials"): with paging a
window occupies whole blocks, so the planner must count blocks, never ``window / block_size``.

Expected values are computed here from the cited configs or from a brute-force simulation, never
from the function under test.
"""

import pytest

from paged_kv.memory import model_preset, plan_memory


def test_a_sliding_layer_is_counted_in_whole_blocks():
    # The case: a 1,000-token window at block size 16 is 62.5 blocks of tokens, but a
    # paged layer holds whole blocks.  Mistral-7B-v0.1: 32 sliding layers, 8 KV heads x 128 x fp16.
    spec = model_preset("Mistral-7B").replace(sliding_window=1000)
    block_bytes = 16 * 2 * 8 * 128 * 2  # one block of one layer
    p = plan_memory(spec, "H100", 8192, block_size=16)
    blocks_per_layer = p.kv_bytes_per_sequence / (32 * block_bytes)
    assert blocks_per_layer == int(blocks_per_layer), f"{blocks_per_layer} blocks per layer"
