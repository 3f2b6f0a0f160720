"""``PagedKVCache``: one pool of fixed-size blocks per layer, read and written through block tables.

Storage only, as in vLLM (paper §4.1-4.3): the cache does not know which sequence owns which
block.  The bookkeeping half (:class:`paged_kv.blocks.BlockSpaceManager`) decides that and hands
over a **slot mapping** (where each new token's K/V goes) and **block tables** (where each
sequence's tokens are); this class writes with :func:`kernels.cache_ops.store_kv` and reads with
:func:`kernels.paged_attention.paged_decode_attention` (or their PyTorch references).

Layout: ``k_cache``, ``v_cache`` of shape ``[L, NB, BS, Hkv, D]``, so layer ``l``'s cache
``k_cache[l]`` is ``[NB, BS, Hkv, D]``, the layout of vLLM's flash-attention backend (token-major inside a block, so one token's heads are
contiguous and a slot's ``Hkv * D`` elements are written in one piece).

Legend: B batch, T tokens, H query heads, Hkv kv heads, D head_dim, L layers, NB blocks,
BS block size (tokens per block).
"""

from __future__ import annotations

import torch

from kernels import cache_ops, copy_blocks, paged_attention, paged_prefill

from ..defaults import BLOCK_SIZE
from ..errors import ConfigError, TensorError
from ..memory import kv_bytes_per_token
from ..model.attention import AttentionMetadata, check_backend, check_reduction_backend
from ..model.reduction import split_attention
from ..model.config import ModelConfig
from ..validate import count

__all__ = ["KV_DTYPE_NAMES", "PagedKVCache"]

# torch dtype -> the name paged_kv.memory prices it under.
KV_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class PagedKVCache:
    """Per layer, a pool of ``num_blocks`` blocks of ``block_size`` token slots for K and for V.

    Args:
        cfg: the model's config (layers, kv heads, head_dim).
        num_blocks: physical blocks per layer (NB); block ``i`` of every layer belongs to the
            same tokens, so one block id serves all layers (as in vLLM).
        block_size: token slots per block (BS).
        dtype, device: of the cache tensors (must match the model's activations).
        num_cpu_blocks: blocks of a CPU swap pool (pinned memory beside a GPU; 0: none), for
            preemption by swapping (vLLM paper §4.5).

    Memory: ``2 * L * NB * BS * Hkv * D * dtype_bytes`` bytes, allocated up front (zeros);
    :attr:`nbytes` reports it from the real tensors, :attr:`bytes_per_block` per block id.

    Raises:
        ConfigError: a bad size, a dtype the ledger cannot price, or a pool too large to allocate
            on ``device`` (the message gives its bytes).
        TensorError: K/V or queries of the wrong dtype, device or shape; metadata without a
            slot mapping or block tables.
        CacheError: a slot outside the pool.
    """

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int = BLOCK_SIZE,
                 dtype: torch.dtype = torch.float32, device=None, num_cpu_blocks: int = 0) -> None:
        self.cfg = cfg
        self.num_blocks = count("num_blocks", num_blocks, 1)
        self.block_size = count("block_size", block_size, 1)
        if dtype not in KV_DTYPE_NAMES:
            raise ConfigError(f"cache dtype must be one of {list(KV_DTYPE_NAMES)}, got {dtype}")
        self.dtype, self.device = dtype, torch.device(device or "cpu")
        # All layers in one tensor (L, NB, BS, Hkv, D): k_cache[l] is layer l's (NB, BS, Hkv, D) view,
        # and one copy-on-write launch reaches every layer (kernels/copy_blocks.py).
        shape = (cfg.num_layers, self.num_blocks, self.block_size, cfg.num_kv_heads, cfg.head_dim)
        try:
            self.k_cache = torch.zeros(shape, dtype=dtype, device=self.device)
            self.v_cache = torch.zeros(shape, dtype=dtype, device=self.device)
        except (RuntimeError, MemoryError) as e:       # torch's out-of-memory errors subclass RuntimeError
            nbytes = 2 * torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            raise ConfigError(f"num_blocks={self.num_blocks} blocks of {self.block_size} tokens need "
                              f"{nbytes:,} bytes ({nbytes / 2**30:,.2f} GiB) for K and V on {self.device}, "
                              f"which cannot be allocated: {str(e).splitlines()[0]}") from None
        self.num_cpu_blocks = count("num_cpu_blocks", num_cpu_blocks, 0)
        cpu_shape = (cfg.num_layers, self.num_cpu_blocks, self.block_size, cfg.num_kv_heads, cfg.head_dim)
        pin = self.device.type == "cuda"               # pinned host memory: DMA without a staging copy
        self.cpu_k_cache = torch.zeros(cpu_shape, dtype=dtype, pin_memory=pin)
        self.cpu_v_cache = torch.zeros(cpu_shape, dtype=dtype, pin_memory=pin)

    @classmethod
    def from_memory_budget(cls, cfg: ModelConfig, budget_bytes: int, block_size: int = BLOCK_SIZE,
                           dtype: torch.dtype = torch.float32, device=None) -> "PagedKVCache":
        """As many whole blocks as fit in ``budget_bytes`` (bytes, over all layers, K and V).

        One block costs ``block_size * kv_bytes_per_token`` (:func:`paged_kv.memory.kv_bytes_per_token`),
        so ``num_blocks = budget_bytes // that``; the leftover (less than a block) stays unused.

        Raises:
            ConfigError: ``budget_bytes`` is not an int number of bytes (a float such as ``1e6``
                is refused: write ``10**6`` or ``1_000_000``), or is smaller than one block.
        """
        block_size = count("block_size", block_size, 1)
        if dtype not in KV_DTYPE_NAMES:
            raise ConfigError(f"cache dtype must be one of {list(KV_DTYPE_NAMES)}, got {dtype}")
        per_block = block_size * kv_bytes_per_token(cfg, KV_DTYPE_NAMES[dtype])
        try:
            budget_bytes = count("budget_bytes", budget_bytes, 0)
        except ConfigError:
            raise ConfigError(f"budget_bytes must be an int number of bytes (e.g. 10**6 or "
                              f"1_000_000, not 1e6), got {budget_bytes!r}") from None
        if budget_bytes < per_block:
            raise ConfigError(f"a budget of {budget_bytes!r} bytes holds no block: one block of "
                              f"{block_size} tokens takes {per_block:,} bytes")
        return cls(cfg, budget_bytes // per_block, block_size, dtype, device)

    # --- sizes -----------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes held by all K and V tensors of all layers (what ``torch`` allocated)."""
        return (self.k_cache.numel() + self.v_cache.numel()) * self.k_cache.element_size()

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id costs over all layers, K and V: ``nbytes / num_blocks``."""
        return self.nbytes // self.num_blocks

    @property
    def num_slots(self) -> int:
        """Token slots in the pool: ``num_blocks * block_size``."""
        return self.num_blocks * self.block_size

    # --- writes ----------------------------------------------------------------------------
    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
              backend: str = "torch") -> None:
        """Write this step's ``k, v [B, T, Hkv, D]`` to the slots ``meta.slot_mapping [B, T]``.

        ``-1`` in the slot mapping marks padding (not written).  ``backend="triton"`` uses the
        :func:`~kernels.cache_ops.store_kv` kernel, ``"torch"`` its PyTorch reference.
        """
        check_backend(backend)
        slots = self._slot_mapping(meta, k)
        cache_k, cache_v = self.k_cache[layer], self.v_cache[layer]
        if k.dtype != self.dtype or k.device != cache_k.device or v.dtype != k.dtype:
            raise TensorError(f"K/V are {k.dtype}/{v.dtype} on {k.device}, the cache is {self.dtype} on {cache_k.device}")
        if k.dim() != 4 or v.shape != k.shape or k.shape[2:] != cache_k.shape[2:]:
            raise TensorError(f"K/V shapes {tuple(k.shape)}, {tuple(v.shape)} do not fit "
                              f"[B, T, Hkv={self.cfg.num_kv_heads}, D={self.cfg.head_dim}]")
        k, v, slots = k.flatten(0, 1), v.flatten(0, 1), slots.flatten()     # (B*T, Hkv, D), (B*T,)
        if backend == "triton":
            cache_ops.store_kv(k, v, cache_k, cache_v, slots)
            return
        cache_ops.store_kv_reference(k, v, cache_k, cache_v, slots)

    def copy_blocks(self, copies: list[tuple[int, int]], backend: str = "torch") -> None:
        """Copy whole blocks ``src -> dst`` in every layer, K and V (copy-on-write, vLLM paper §4.4).

        ``copies`` is what :meth:`paged_kv.blocks.BlockSpaceManager.take_copies` returns.
        ``backend="triton"`` runs :func:`kernels.copy_blocks.copy_blocks` (one launch for all layers),
        ``"torch"`` its PyTorch reference.

        Raises:
            CacheError: a block id outside the pool, or copies whose order would matter.
        """
        check_backend(backend)
        if not copies:
            return
        mapping = torch.tensor(copies, dtype=torch.int64, device=self.device).reshape(-1, 2)   # (N, 2)
        if backend == "triton":
            copy_blocks.copy_blocks(self.k_cache, self.v_cache, mapping)
        else:
            copy_blocks.copy_blocks_reference(self.k_cache, self.v_cache, mapping)

    def swap_out(self, mapping: list[tuple[int, int]]) -> None:
        """Copy GPU blocks to CPU blocks, ``(gpu, cpu)`` pairs from
        :meth:`paged_kv.blocks.BlockSpaceManager.swap_out` (all layers, K and V); returns when done."""
        self._swap(mapping, (self.k_cache, self.v_cache), (self.cpu_k_cache, self.cpu_v_cache))

    def swap_in(self, mapping: list[tuple[int, int]]) -> None:
        """Copy CPU blocks back to GPU blocks, ``(cpu, gpu)`` pairs from ``swap_in``; returns when done."""
        self._swap(mapping, (self.cpu_k_cache, self.cpu_v_cache), (self.k_cache, self.v_cache))

    def _swap(self, mapping, src, dst) -> None:
        if not mapping:
            return
        pairs = torch.tensor(mapping, dtype=torch.int64).reshape(-1, 2)
        for s, d in zip(src, dst):
            cache_ops.swap_blocks(s, d, pairs)

    # --- reads -----------------------------------------------------------------------------
    def prefill_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          meta: AttentionMetadata, backend: str, reduction=None) -> torch.Tensor:
        """Attention of a prefill chunk's queries ``q [B, T, H, D]`` over everything its sequence
        holds: the tokens cached before the chunk (``meta.context_lens``) through the
        block tables, and the chunk itself causally.  The chunk's ``k, v`` are already stored
        (:meth:`store` runs first), so they are read from the cache like the rest.  Returns
        ``[B, T, H, D]``; ``backend="triton"`` runs :func:`kernels.paged_prefill.paged_prefill_attention`.
        ``reduction`` (a :class:`~paged_kv.model.reduction.ReductionOrder`, torch backend): the
        blocks are gathered and reduced by :func:`~paged_kv.model.reduction.split_attention`.
        """
        if meta.block_tables is None:
            raise TensorError("the paged cache needs meta.block_tables ([B, max_blocks] int32)")
        if check_reduction_backend(reduction, backend) is not None:
            return self._split_attention(layer, q, meta.context_lens, meta.query_lens, meta, reduction)
        args = (q, self.k_cache[layer], self.v_cache[layer], meta.block_tables, meta.context_lens, meta.query_lens)
        if check_backend(backend) == "triton":
            return paged_prefill.paged_prefill_attention(*args)
        return paged_prefill.paged_prefill_attention_reference(*args)

    def decode_attention(self, layer: int, q: torch.Tensor, meta: AttentionMetadata, backend: str,
                         reduction=None) -> torch.Tensor:
        """Attention of ``q [B, H, D]`` over each sequence's ``meta.seq_lens[b]`` cached tokens,
        found through ``meta.block_tables [B, max_blocks]``.  Returns ``[B, H, D]``.  With a
        ``reduction``, the new token is a pass of one query after ``seq_lens - 1`` cached keys."""
        if meta.block_tables is None:
            raise TensorError("the paged cache needs meta.block_tables ([B, max_blocks] int32)")
        if check_reduction_backend(reduction, backend) is not None:
            ones = torch.ones_like(meta.seq_lens)
            return self._split_attention(layer, q[:, None], meta.seq_lens - ones, ones, meta, reduction)[:, 0]
        args = (q, self.k_cache[layer], self.v_cache[layer], meta.block_tables, meta.seq_lens)
        if check_backend(backend) == "triton":
            return paged_attention.paged_decode_attention(*args)
        return paged_attention.paged_decode_attention_reference(*args)

    def _split_attention(self, layer, q, context_lens, query_lens, meta, reduction) -> torch.Tensor:
        """Gather each row's ``context + query`` keys through its block table (a used block id
        outside the pool is a ``CacheError``), then :func:`split_attention` in ``reduction``'s order."""
        seq_lens = (context_lens + query_lens).to(torch.int32)
        paged_attention.check_block_tables(meta.block_tables, seq_lens, self.num_blocks, self.block_size,
                                           q.shape[0], q.device)
        k, v = paged_attention.gather_kv(self.k_cache[layer], self.v_cache[layer], meta.block_tables, seq_lens)
        return split_attention(q, k, v, context_lens.to(torch.int32), query_lens.to(torch.int32), reduction)

    def _slot_mapping(self, meta: AttentionMetadata, k: torch.Tensor) -> torch.Tensor:
        slots = meta.slot_mapping
        if slots is None:
            raise TensorError("the paged cache needs meta.slot_mapping ([B, T] int64, -1 = padding)")
        if slots.dtype != torch.int64 or tuple(slots.shape) != tuple(k.shape[:2]):
            raise TensorError(f"slot_mapping must be int64 [B, T] = {list(k.shape[:2])}, "
                              f"got {slots.dtype} {list(slots.shape)}")
        return slots

    def __repr__(self) -> str:
        return (f"PagedKVCache(layers={self.cfg.num_layers}, num_blocks={self.num_blocks}, "
                f"block_size={self.block_size}, Hkv={self.cfg.num_kv_heads}, D={self.cfg.head_dim}, "
                f"{str(self.dtype).replace('torch.', '')}, {self.nbytes:,} bytes)")
