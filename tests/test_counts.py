"""One count check everywhere: every public entry point that takes a count or a size treats the
same inputs the same way (``paged_kv.validate.count``).

A numpy integer is accepted like a Python int; a bool (``True == 1``), a float (even ``2.0``) and a
negative number are refused with one of our errors, naming the argument and the value, before
anything is allocated.
"""

from __future__ import annotations

import numpy as np
import pytest

from paged_kv.blocks import BlockAllocator, BlockSpaceManager, BlockTable, blocks_needed
from paged_kv.decoding import PagedDecoder, beam_search, generate, profile_decoding
from paged_kv.engine import LiveRequests
from paged_kv.errors import PagedKVError
from paged_kv.memory import KVDType, kv_cache_bytes, kv_slots, plan_memory, tokens_to_reach, weights_bytes
from paged_kv.model import ModelConfig, SamplingParams
from paged_kv.sim import PagedPolicy, ServingSetup, simulate, synthetic_trace, trace_from_rows
from paged_kv.storage import ContiguousKVCache, PagedKVCache

CFG = ModelConfig(vocab_size=32, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                  intermediate_size=32, max_seq_len=64)


def _model():
    from paged_kv.model import TinyLlama
    return TinyLlama(CFG).eval()


MODEL = _model()
TRACE = trace_from_rows([(0, 3, 2), (1, 2, 2)])

# name -> (call with the count under test, a valid value).  Each call makes one count the variable.
ENTRY_POINTS = {
    "ModelConfig(num_layers)": (lambda n: ModelConfig(num_layers=n), 2),
    "ModelConfig(head_dim)": (lambda n: ModelConfig(head_dim=n), 64),
    "ModelConfig(max_seq_len)": (lambda n: ModelConfig(max_seq_len=n), 128),
    "SamplingParams(top_k)": (lambda n: SamplingParams(temperature=1.0, top_k=n, seed=0), 5),
    "SamplingParams(seed)": (lambda n: SamplingParams(temperature=1.0, seed=n), 3),
    "SamplingParams(n)": (lambda n: SamplingParams(temperature=1.0, seed=0, n=n), 2),
    "beam_search(beam_width)": (lambda n: beam_search(MODEL, [1, 2], n, 2, block_size=4), 2),
    "ContiguousKVCache(batch_size)": (lambda n: ContiguousKVCache(CFG, n, 8), 2),
    "ContiguousKVCache(max_seq_len)": (lambda n: ContiguousKVCache(CFG, 2, n), 8),
    "PagedKVCache(num_blocks)": (lambda n: PagedKVCache(CFG, n, 4), 3),
    "PagedKVCache(block_size)": (lambda n: PagedKVCache(CFG, 3, n), 4),
    "PagedKVCache.from_memory_budget(budget_bytes)": (lambda n: PagedKVCache.from_memory_budget(CFG, n, 4), 10_000),
    "BlockAllocator(num_blocks)": (lambda n: BlockAllocator(n), 4),
    "BlockSpaceManager(block_size)": (lambda n: BlockSpaceManager(4, n), 4),
    "BlockSpaceManager.allocate(num_tokens)": (lambda n: BlockSpaceManager(4, 4).allocate("s", n), 5),
    "blocks_needed(num_tokens)": (lambda n: blocks_needed(n, 4), 9),
    "blocks_needed(block_size)": (lambda n: blocks_needed(9, n), 4),
    "BlockTable(num_tokens)": (lambda n: BlockTable(4, [0, 1], n), 5),
    "generate(max_new_tokens)": (lambda n: generate(MODEL, [[1, 2]], n), 2),
    "generate(block_size)": (lambda n: generate(MODEL, [[1, 2]], 2, cache="paged", block_size=n), 4),
    "PagedDecoder(num_blocks)": (lambda n: PagedDecoder(MODEL, "torch", [[1, 2]], 2, 4, num_blocks=n), 2),
    "profile_decoding(repeats)": (lambda n: profile_decoding(MODEL, [1, 2], 2, "contiguous", count_flops=False,
                                                             repeats=n), 1),
    "LiveRequests(num_blocks)": (lambda n: LiveRequests(num_blocks=n, block_size=4), 4),
    "LiveRequests.add(length)": (lambda n: LiveRequests(num_blocks=4, block_size=4).add(n), 3),
    "kv_cache_bytes(seq_len)": (lambda n: kv_cache_bytes("Llama-3-8B", n, 1), 8),
    "kv_slots(kv_bytes)": (lambda n: kv_slots("Llama-3-8B", n), 10**6),
    "weights_bytes(tp)": (lambda n: weights_bytes("Llama-3-8B", tp=n), 2),
    "tokens_to_reach(batch_size)": (lambda n: tokens_to_reach("Llama-3-8B", 10**9, n), 2),
    "plan_memory(seq_len)": (lambda n: plan_memory("Llama-3-8B", "H100", n), 4096),
    "plan_memory(block_size)": (lambda n: plan_memory("Llama-3-8B", "H100", 4096, block_size=n), 16),
    "KVDType(bits)": (lambda n: KVDType("x", n), 8),
    "PagedPolicy(block_size)": (lambda n: PagedPolicy(64, 16, block_size=n), 4),
    "simulate(max_batch)": (lambda n: simulate(TRACE, PagedPolicy(64, 16, block_size=4), max_batch=n), 2),
    "synthetic_trace(num_requests)": (lambda n: synthetic_trace(n, 1.0), 3),
    "ServingSetup(num_requests)": (lambda n: ServingSetup(num_requests=n), 10),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_numpy_integers_are_accepted_like_ints(entry):
    call, good = ENTRY_POINTS[entry]
    call(good)
    call(np.int64(good))
    call(np.int32(good))


BAD = {"bool": True, "nan": float("nan"), "float-2.0": 2.0, "float-2.5": 2.5, "negative": -3, "str": "4",
       "None": None}
# Inputs that mean something on purpose at these entry points (documented in their docstrings).
MEANINGFUL = {
    ("SamplingParams(top_k)", "None"): "no top-k limit",
    ("SamplingParams(seed)", "None"): "unseeded: refused for sampling, but with its own message",
    ("PagedDecoder(num_blocks)", "None"): "size the pool from the prompts",
    ("ModelConfig(head_dim)", "None"): "hidden_size // num_heads",
    ("ContiguousKVCache(max_seq_len)", "None"): "the model's max_seq_len",
    ("plan_memory(block_size)", "None"): "no paging",
    ("LiveRequests.add(length)", "str"): "a text prompt",
}
CASES = [(e, b) for e in sorted(ENTRY_POINTS) for b in BAD if (e, b) not in MEANINGFUL]


@pytest.mark.parametrize("entry,bad", CASES, ids=[f"{e}-{b}" for e, b in CASES])
def test_bools_floats_negatives_and_strings_raise_our_error_naming_the_value(entry, bad):
    call, _ = ENTRY_POINTS[entry]
    value = BAD[bad]
    with pytest.raises(PagedKVError) as info:
        call(value)
    shown = repr(value)
    assert shown in str(info.value), f"{entry}: the error does not name {shown}: {info.value}"
