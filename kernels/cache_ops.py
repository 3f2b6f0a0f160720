"""Cache writes: put this step's new keys and values into their slots of a paged KV cache.

What you will learn here:

* the **slot mapping** (vLLM paper, §4.3; vLLM's ``reshape_and_cache_flash``): the block
  manager gives every new token a slot ``= physical_block_id * block_size + offset``, and the
  kernel only follows it -- one program per token copies that token's ``Hkv * D`` keys and
  values to ``cache[slot // block_size, slot % block_size]``.  ``-1`` means "padding, skip";
* why offsets are **int64**: a cache tensor of a real model easily holds more than 2^31
  elements (Llama-3-8B, one layer of 16-token blocks with 8 KV heads of 128: 16,384 elements a
  block, so block 131,072 already starts past 2^31).  ``block_id * stride`` computed in int32
  would wrap around and write somewhere else.  :func:`cache_offset` is the one place that
  computes the offset; the paged attention kernel reuses it.

Layouts (vLLM's flash backend): new ``k, v [T, Hkv, D]``; one layer's ``k_cache, v_cache
[NB, BS, Hkv, D]``; ``slot_mapping [T]`` int64.  Legend: T tokens, Hkv kv heads, D head_dim,
NB blocks, BS block size (tokens per block).
"""

import torch

from paged_kv.errors import CacheError, TensorError

from .checks import check_apart, check_tensor, check_tuning, check_writable
from .runtime import check_kernel_dtype, require_triton, tl, triton
from . import timing


# ---------------------------------------------------------------------------------------------
# Plain PyTorch reference.
# Bytes: reads T*Hkv*D elements of k and of v and T int64 slots; writes the same number of
# cache elements (only the written slots: every other slot of the cache keeps its bytes).
# ---------------------------------------------------------------------------------------------
def store_kv_reference(k, v, k_cache, v_cache, slot_mapping):
    """Write ``k, v [T, Hkv, D]`` into ``k_cache, v_cache [NB, BS, Hkv, D]`` in place.

    Token ``t`` goes to block ``slot_mapping[t] // BS``, offset ``slot_mapping[t] % BS``;
    ``slot_mapping[t] == -1`` skips the token (padding).  Checks its arguments as
    :func:`store_kv` does (any dtype is fine here), so a slot of ``-5`` or ``NB * BS`` raises
    ``CacheError`` instead of wrapping around, and strides as it does: any for the inputs, any
    for the caches but one whose elements share memory (``TensorError``).
    """
    _check_store_args(k, v, k_cache, v_cache, slot_mapping)
    BS = k_cache.shape[1]
    keep = slot_mapping >= 0                                # (T,) which tokens are real
    slots = slot_mapping[keep]
    k_cache[slots // BS, slots % BS] = k[keep]              # (T_real, Hkv, D) rows
    v_cache[slots // BS, slots % BS] = v[keep]


def _check_store_args(k, v, k_cache, v_cache, slot_mapping) -> None:
    """The checks :func:`store_kv` and :func:`store_kv_reference` share (see ``store_kv``)."""
    check_tensor("k", k, 3)
    check_tensor("v", v, 3, dtype=k.dtype, device=k.device)
    check_tensor("k_cache", k_cache, 4, dtype=k.dtype, device=k.device)
    check_tensor("v_cache", v_cache, 4, dtype=k.dtype, device=k.device)
    check_tensor("slot_mapping", slot_mapping, 1, dtype=torch.int64, device=k.device)
    check_writable("k_cache", k_cache)
    check_writable("v_cache", v_cache)
    check_apart({"k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v})
    T, Hkv, D = k.shape
    NB, BS = k_cache.shape[:2]
    if v.shape != k.shape:
        raise TensorError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if v_cache.shape != k_cache.shape:
        raise TensorError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} "
                          f"must have the same shape")
    if tuple(k_cache.shape[2:]) != (Hkv, D):
        raise TensorError(f"k has [Hkv, D] = {[Hkv, D]}, the cache holds {list(k_cache.shape[2:])}")
    check_tuning("num_kv_heads Hkv", Hkv, error=TensorError)
    check_tuning("head_dim D", D, error=TensorError)
    if slot_mapping.shape[0] != T:
        raise TensorError(f"slot_mapping has {slot_mapping.shape[0]} entries for {T} tokens")
    if T == 0:
        return
    lo, hi = torch.stack([slot_mapping.min(), slot_mapping.max()]).tolist()   # one sync
    if lo < -1 or hi >= NB * BS:
        bad = lo if lo < -1 else hi
        raise CacheError(f"slot {bad} is outside the cache's {NB} blocks x {BS} slots "
                         f"(valid: 0..{NB * BS - 1}, or -1 to skip)")
    real = slot_mapping[slot_mapping >= 0]
    uniq, seen = torch.unique(real, return_counts=True)
    if uniq.numel() != real.numel():         # two tokens into one slot: which one lands is undefined
        raise CacheError(f"slots {uniq[seen > 1].tolist()[:8]} are each named by more than one token "
                         f"of slot_mapping (only -1, skip, may repeat)")


# ---------------------------------------------------------------------------------------------
# The one offset formula, shared with kernels/paged_attention.py.
# ---------------------------------------------------------------------------------------------
@triton.jit
def cache_offset(block_id, in_block, stride_block, stride_slot):
    """Element offset of token ``in_block`` of physical block ``block_id``, computed in int64.

    ``block_id`` may be int32 (a block table entry) or int64 (a slot // BS); it is widened
    before the multiplication, so the product cannot wrap around for caches > 2^31 elements.
    """
    return block_id.to(tl.int64) * stride_block + in_block.to(tl.int64) * stride_slot


# ---------------------------------------------------------------------------------------------
# The Triton kernel. One program copies one token's K and V (all Hkv heads) to its slot.
# ---------------------------------------------------------------------------------------------
@triton.jit
def _store_kv_kernel(
    K, V,                     # new keys / values [T, Hkv, D] (contiguous)
    KCache, VCache,           # one layer's caches [NB, BS, Hkv, D], each with its own strides
    SlotMapping,              # int64 [T]: slot of each token, -1 = skip (contiguous)
    stride_kt, stride_kh,     # strides of k and v (elements); their D stride is 1
    stride_kcb, stride_kcs,   # k cache strides of a block and of a slot within the block
    stride_kch, stride_kcd,   # k cache strides of a KV head and of one head_dim element
    stride_vcb, stride_vcs,   # the same four for the v cache
    stride_vch, stride_vcd,
    Hkv: tl.constexpr,        # kv heads
    BLOCK_H: tl.constexpr,    # next power of two >= Hkv (rows masked)
    D: tl.constexpr,          # head_dim
    BLOCK_D: tl.constexpr,    # next power of two >= D (columns masked)
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block (BS)
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(SlotMapping + t)                     # int64
    if slot >= 0:                                       # padding (slot -1) writes nothing
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        mask = (offs_h[:, None] < Hkv) & (offs_d[None, :] < D)       # (BLOCK_H, BLOCK_D)
        src = t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
        block, in_block = slot // BLOCK_SIZE, slot % BLOCK_SIZE
        # Head and D offsets in int64 too: a permuted (head- or D-major) cache has strides of
        # NB * BS * ..., past 2^31 on a big pool.
        heads, dims = offs_h[:, None].to(tl.int64), offs_d[None, :].to(tl.int64)
        k_dst = (cache_offset(block, in_block, stride_kcb, stride_kcs)
                 + heads * stride_kch + dims * stride_kcd)
        v_dst = (cache_offset(block, in_block, stride_vcb, stride_vcs)
                 + heads * stride_vch + dims * stride_vcd)
        k = tl.load(K + src, mask=mask)                 # (BLOCK_H, BLOCK_D)
        v = tl.load(V + src, mask=mask)
        tl.store(KCache + k_dst, k, mask=mask)
        tl.store(VCache + v_dst, v, mask=mask)


def store_kv(k, v, k_cache, v_cache, slot_mapping):
    """Write new tokens' keys and values into their slots of a paged cache (in place).

    Args:
        k, v: ``[T, Hkv, D]`` this step's keys and values.
        k_cache, v_cache: ``[NB, BS, Hkv, D]`` one layer's caches, same dtype and device as
            ``k``, written in place.
        slot_mapping: ``[T]`` int64, ``0 <= slot < NB * BS`` or ``-1`` to skip the token.
            Two tokens must not share a slot (which one wins would be unspecified).

    Strides: ``k``, ``v`` and ``slot_mapping`` are only read: any layout, copied contiguous
    first when they are not.  The caches are written in place, so never copied: the kernel
    writes through their own strides, k's and v's apart, which serves any layout (transposed,
    sliced, narrowed) except one whose elements share memory (an ``expand``), refused with
    ``TensorError`` (``kernels/checks.py``, ``check_writable``).

    Raises:
        TensorError: wrong rank, shapes that do not fit, dtype/device mismatch, a cache whose
            elements share memory.
        CacheError: a slot outside ``-1 .. NB*BS - 1``.
        DTypeNotSupportedError, KernelUnavailableError: see :mod:`kernels.runtime`.
    """
    _check_store_args(k, v, k_cache, v_cache, slot_mapping)
    check_kernel_dtype(k.dtype, k.device)
    T, Hkv, D = k.shape
    BS = k_cache.shape[1]
    if T == 0:
        return
    require_triton()
    # Read-only inputs: contiguous (no copy when they are); the kernel reads them with unit D
    # and slot strides.  The caches go in as they are, with their strides.
    k, v, slot_mapping = k.contiguous(), v.contiguous(), slot_mapping.contiguous()
    _store_kv_kernel[(T,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1),
        *k_cache.stride(), *v_cache.stride(),
        Hkv=Hkv, BLOCK_H=triton.next_power_of_2(Hkv), D=D, BLOCK_D=triton.next_power_of_2(D),
        BLOCK_SIZE=BS,
    )


def benchmark(device, dtype, timer):
    """Rows for ``python -m kernels.bench``: GB/s of one decode step's cache write, ours vs torch.

    Bytes moved: K and V read once and written once (``4 * T * Hkv * D * itemsize``) plus the
    ``8 * T`` bytes of slots.  ``vs torch`` is the PyTorch reference's time over ours.
    """

    if device.type == "cuda":
        shapes = [(256, 8, 128, 16, 65536), (4096, 8, 128, 16, 65536), (64, 32, 64, 16, 16384)]
    else:
        shapes = [(8, 2, 64, 16, 16)]  # a sanity shape: the interpreter is slow
    rows = []
    for T, Hkv, D, BS, NB in shapes:
        g = torch.Generator(device=device).manual_seed(0)
        k = torch.randn(T, Hkv, D, device=device, dtype=dtype, generator=g)
        v = torch.randn(T, Hkv, D, device=device, dtype=dtype, generator=g)
        k_cache = torch.zeros(NB, BS, Hkv, D, device=device, dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
        slots = torch.randperm(NB * BS, device=device, generator=g)[:T]
        ours = timer(lambda: store_kv(k, v, k_cache, v_cache, slots))
        ref = timer(lambda: store_kv_reference(k, v, k_cache, v_cache, slots))
        moved = 4 * T * Hkv * D * k.element_size() + 8 * T
        rows.append(timing.row("store_kv", f"T={T} Hkv={Hkv} D={D} BS={BS} NB={NB}", dtype, ours,
                        "GB/s", moved, vs_torch=ref / ours))
    return rows


# ---------------------------------------------------------------------------------------------
# Swapping: whole blocks between two pools (the GPU's and a pinned CPU one), every layer.
# ---------------------------------------------------------------------------------------------
def swap_blocks(src_cache, dst_cache, block_mapping):
    """Copy blocks ``src -> dst`` between two pools of ``[L, NB, BS, Hkv, D]`` (the pools may differ
    in NB and live on different devices), for every layer at once, in place in ``dst_cache``.

    What you will learn: preemption by swapping (vLLM paper §4.5) moves a preempted sequence's
    blocks to CPU memory and back.  That is not a kernel's job: the bytes cross PCIe as a DMA
    transfer (vLLM's ``swap_blocks`` issues ``cudaMemcpyAsync`` per block).  Here the blocks are
    gathered into one contiguous buffer and copied in one transfer, ``non_blocking`` from pinned
    memory, and the call **waits for it**: the caller may reuse the source blocks (swap out) or
    overwrite the CPU buffer (swap in) as soon as this returns.  On a machine without a GPU both
    pools are CPU tensors and the same code runs.

    Bytes: reads and writes ``L * N * BS * Hkv * D`` elements of the cache (call it for K and for V).

    Args:
        src_cache, dst_cache: ``[L, NB_src, BS, Hkv, D]`` and ``[L, NB_dst, BS, Hkv, D]``, same dtype.
        block_mapping: ``[N, 2]`` int64 ``(src block, dst block)`` rows, destinations distinct.

    Strides: ``src_cache`` and ``block_mapping`` are only read: any layout.  ``dst_cache`` is
    written in place (``index_copy_``, through its own strides): any layout but one whose
    elements share memory (an ``expand``), refused with ``TensorError`` before anything moves.

    Raises:
        TensorError: ranks, shapes or dtypes that do not fit, a mapping that is not int64 ``[N, 2]``,
            a destination whose elements share memory.
        CacheError: a block id outside its pool, or a destination named twice.
    """
    check_tensor("src_cache", src_cache, 5)
    check_tensor("dst_cache", dst_cache, 5, dtype=src_cache.dtype)
    check_writable("dst_cache", dst_cache)
    if src_cache.shape[0] != dst_cache.shape[0] or src_cache.shape[2:] != dst_cache.shape[2:]:
        raise TensorError(f"pools differ beyond their block counts: {tuple(src_cache.shape)} and "
                          f"{tuple(dst_cache.shape)}")
    check_tensor("block_mapping", block_mapping, 2, dtype=torch.int64)
    if block_mapping.shape[1] != 2:
        raise TensorError(f"block_mapping must be [N, 2] (src, dst), got {tuple(block_mapping.shape)}")
    if block_mapping.shape[0] == 0:
        return
    src_ids, dst_ids = block_mapping[:, 0].cpu(), block_mapping[:, 1].cpu()
    for name, ids, nb in (("source", src_ids, src_cache.shape[1]), ("destination", dst_ids, dst_cache.shape[1])):
        if int(ids.min()) < 0 or int(ids.max()) >= nb:
            raise CacheError(f"{name} block ids must be in 0..{nb - 1}, got {ids.tolist()}")
    if len(set(dst_ids.tolist())) != len(dst_ids):
        raise CacheError(f"a destination block is named twice: {block_mapping.tolist()}")
    gathered = src_cache.index_select(1, src_ids.to(src_cache.device))       # (L, N, BS, Hkv, D)
    dst_cache.index_copy_(1, dst_ids.to(dst_cache.device), gathered.to(dst_cache.device, non_blocking=True))
    for t in (src_cache, dst_cache):
        if t.device.type == "cuda":                     # wait: the caller may overwrite the source
            torch.cuda.synchronize(t.device)
