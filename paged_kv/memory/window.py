"""Sliding-window layers in whole blocks: the KV blocks one sequence holds on a layer that attends
to its last ``W`` tokens, at one length (:func:`window_blocks`), at its peak up to a length
(:func:`window_peak_blocks`) and over any life (:func:`window_max_blocks`).

Unpaged, a sliding layer keeps ``min(T, W)`` tokens (:func:`~paged_kv.memory.ledger.kv_cache_bytes`
without a block size).  Paged, it keeps whole blocks, and a window rarely starts on a block
boundary: the block holding the window's first token stays until the window has left all of it.
So ``W / BS`` blocks (62.5 for a 1,000-token window in blocks of 16) is never the count.

Follows vLLM v1's sliding-window manager, read from its source:

* ``KVCacheManager.allocate_slots`` (``vllm/v1/core/kv_cache_manager.py``) frees first, then
  allocates: ``remove_skipped_blocks(request, c)`` with ``c`` tokens computed, then blocks for
  the ``c + n`` tokens that need a slot (``cdiv(c + n, BS)``,
  ``SingleTypeKVCacheManager.allocate_new_blocks``).
* ``SlidingWindowManager.get_num_skipped_tokens`` (``vllm/v1/core/single_type_kv_cache_manager.py``)
  skips ``max(0, c - W + 1)`` tokens: the next token attends to itself and the ``W - 1`` before it.
  ``SingleTypeKVCacheManager.remove_skipped_blocks`` frees only the blocks *wholly* inside the
  skipped tokens, ``skipped // BS`` of them (replaced by the null block).

Decoding one token per step (``n = 1``), a sequence of ``T = c + 1`` tokens therefore holds

    ``held(T) = ceil(T / BS) - floor(max(0, T - W) / BS)``

blocks: those from the one holding token ``T - W`` (the oldest not yet freed) to the last.  It is
not monotone: it rises when a new block opens and falls when the window leaves an old one (8,192
tokens, W = 4,096, BS = 16: 256 blocks, the window aligned; 8,193 tokens: 257).  The most it holds
at any length up to ``T``:

    ``peak(T) = ceil(min(T, W + BS - 1) / BS)``

Up to ``W`` nothing is freed (``ceil(T / BS)``); past it, ``W`` consecutive tokens that start
``r`` tokens into a block span ``ceil((r + W) / BS)`` blocks, worst at ``r = BS - 1``, first reached
at ``T = W + BS - 1``.  Over a whole life that is ``ceil((W - 1) / BS) + 1`` blocks.  A pool sized
for a batch must hold the peak: sequences growing in step reach it together.

vLLM's own pool bound, ``SlidingWindowSpec.max_memory_usage_bytes`` (``vllm/v1/kv_cache_interface.py``,
behind the "Maximum concurrency" it logs), is ``cdiv(min(W - 1 + max_num_batched_tokens,
max_model_len), BS) + 1`` blocks: the ``W - 1`` tokens still in the window plus one step's new
tokens, "+1 here because the sliding window may not start from the beginning of the block".  With
one new token a step it is ``cdiv(W, BS) + 1``: our maximum, or one block more when ``BS``
divides ``W - 1`` (it rounds ``W`` tokens up before adding the straddled block); a bound, where
this module counts what the manager holds.  Not counted here: a prefill chunk of ``n`` tokens
holds the blocks of ``W - 1 + n`` tokens for one step, which is why vLLM's bound adds
``max_num_batched_tokens``.  ``tests/memory/test_window.py`` checks all three functions against a
token-by-token simulation of the manager over a grid of windows, block sizes and lengths.

Legend: T tokens of the sequence (the latest one's K/V written), W window, BS block size.
"""

from __future__ import annotations

from ..validate import count

__all__ = ["window_blocks", "window_max_blocks", "window_peak_blocks"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _checked(seq_len, window, block_size) -> tuple[int, int, int]:
    return count("seq_len", seq_len, 0), count("window", window, 1), count("block_size", block_size, 1)


def window_blocks(seq_len: int, window: int, block_size: int) -> int:
    """Blocks a sliding-window layer holds for one sequence of ``seq_len`` tokens, once the blocks
    wholly before its window are freed (vLLM v1's ``SlidingWindowManager``; the rule and its
    derivation are in the module docstring): ``ceil(T / BS) - floor(max(0, T - W) / BS)``.

    Raises:
        ConfigError: a negative length, or a window or block size below 1.
    """
    t, w, bs = _checked(seq_len, window, block_size)
    return _cdiv(t, bs) - max(0, t - w) // bs


def window_peak_blocks(seq_len: int, window: int, block_size: int) -> int:
    """The most blocks a sliding-window layer holds for one sequence at any length up to
    ``seq_len``, growing one token per step: ``ceil(min(T, W + BS - 1) / BS)`` (the module
    docstring derives it).  What a pool must set aside for the sequence to reach ``seq_len``.

    Raises:
        ConfigError: a negative length, or a window or block size below 1.
    """
    t, w, bs = _checked(seq_len, window, block_size)
    return _cdiv(min(t, w + bs - 1), bs)


def window_max_blocks(window: int, block_size: int) -> int:
    """The most blocks a sliding-window layer ever holds for one sequence, at any length:
    ``ceil((W - 1) / BS) + 1``, the window's tokens plus the block it may straddle.

    Raises:
        ConfigError: a window or block size below 1.
    """
    w, bs = count("window", window, 1), count("block_size", block_size, 1)
    return _cdiv(w - 1, bs) + 1
