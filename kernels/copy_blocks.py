"""Copy-on-write: copy whole KV blocks, every layer's K and V, in one launch.

What you will learn here:

* what **copy-on-write** asks of the storage (vLLM paper §4.4; vLLM v0's ``copy_blocks`` cache
  op): the block manager hands over a *block mapping*, pairs ``(src, dst)`` of physical block ids,
  and before any new token is written every layer's K and V of block ``src`` must be in ``dst``.
  The kernel does not know why; it only copies bytes.
* **one launch for all layers**: the cache keeps its layers stacked, ``[L, NB, BS, Hkv, D]``, so
  layer ``l`` of block ``b`` starts at element ``(l * NB + b) * E`` (``E = BS * Hkv * D``, the
  elements of one block of one layer).  The grid is ``(pairs, layers)``; each program copies one
  block of one layer of K and of V, ``BLOCK_E`` elements per iteration.  A per-layer loop of
  ``torch`` index copies would launch ``2 * L`` kernels instead.
* why the offsets are **int64**: ``(l * NB + b) * E`` passes 2^31 for a real pool (32 layers of
  8,192 blocks of 16 x 8 x 128 elements is 2^35).

Layouts: ``k_caches, v_caches [L, NB, BS, Hkv, D]`` (:class:`paged_kv.storage.PagedKVCache`),
contiguous, same dtype and device; ``block_mapping [N, 2]`` int64 ``(src, dst)``.  Legend: L layers,
NB blocks, BS block size, Hkv kv heads, D head_dim, N copies, E elements of one block of one layer.
"""

import torch

from paged_kv.errors import CacheError, TensorError

from . import timing
from .checks import check_apart, check_contiguous, check_tensor, check_writable
from .runtime import check_kernel_dtype, require_triton, tl, triton


# ---------------------------------------------------------------------------------------------
# Plain PyTorch reference.
# Bytes: reads N blocks of every layer of K and of V (2 * L * N * E elements) and writes as many;
# every other block keeps its bytes.
# ---------------------------------------------------------------------------------------------
def copy_blocks_reference(k_caches, v_caches, block_mapping):
    """Copy block ``src`` into block ``dst`` for every ``(src, dst)`` row of ``block_mapping [N, 2]``,
    in every layer of ``k_caches, v_caches [L, NB, BS, Hkv, D]``, in place.  Checks its arguments
    as :func:`copy_blocks` does, but takes caches of any layout whose elements do not share memory
    (torch indexing writes through strides; the kernel needs them contiguous)."""
    _check_copy_args(k_caches, v_caches, block_mapping)
    if block_mapping.shape[0] == 0:
        return
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    k_caches[:, dst] = k_caches[:, src]          # (L, N, BS, Hkv, D): read all sources, then write
    v_caches[:, dst] = v_caches[:, src]


def _check_copy_args(k_caches, v_caches, block_mapping) -> None:
    """The checks :func:`copy_blocks` and :func:`copy_blocks_reference` share."""
    check_tensor("k_caches", k_caches, 5)
    check_tensor("v_caches", v_caches, 5, dtype=k_caches.dtype, device=k_caches.device)
    check_writable("k_caches", k_caches)
    check_writable("v_caches", v_caches)
    check_apart({"k_caches": k_caches, "v_caches": v_caches})
    if v_caches.shape != k_caches.shape:
        raise TensorError(f"k_caches and v_caches must have one shape, got {tuple(k_caches.shape)} "
                          f"and {tuple(v_caches.shape)}")
    check_tensor("block_mapping", block_mapping, 2, dtype=torch.int64, device=k_caches.device)
    if block_mapping.shape[1] != 2:
        raise TensorError(f"block_mapping must be [N, 2] (src, dst), got {tuple(block_mapping.shape)}")
    if block_mapping.shape[0] == 0:
        return
    NB = k_caches.shape[1]
    lo, hi = int(block_mapping.min()), int(block_mapping.max())
    if lo < 0 or hi >= NB:
        raise CacheError(f"block ids must be in 0..{NB - 1}, got {block_mapping.tolist()}")
    src, dst = block_mapping[:, 0].tolist(), block_mapping[:, 1].tolist()
    if len(set(dst)) != len(dst):
        raise CacheError(f"a block is a destination twice: {block_mapping.tolist()}")
    if set(dst) & set(src):
        raise CacheError(f"a destination is also a source (its copy would depend on the order): "
                         f"{block_mapping.tolist()}")


# ---------------------------------------------------------------------------------------------
# The Triton kernel: one program per (copy, layer); K and V of that layer's block.
# ---------------------------------------------------------------------------------------------
@triton.jit
def block_start(layer, num_blocks, block_id, elements):
    """First element of block ``block_id`` of layer ``layer`` in a ``[L, NB, E]`` cache, in int64:
    ``(layer * NB + block_id) * E`` passes 2^31 on a real pool, so every factor is widened first."""
    return (layer.to(tl.int64) * num_blocks + block_id.to(tl.int64)) * elements


@triton.jit
def copy_blocks_kernel(
    KCaches, VCaches,         # [L, NB, E] contiguous, the same dtype
    Mapping,                  # int64 [N, 2]: (src, dst) block ids
    NB,                       # blocks per layer
    E: tl.constexpr,          # elements of one block of one layer: BS * Hkv * D
    BLOCK_E: tl.constexpr,    # elements per iteration (a power of two)
):
    pair = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1)
    src = tl.load(Mapping + pair * 2)                   # int64
    dst = tl.load(Mapping + pair * 2 + 1)
    src_start = block_start(layer, NB, src, E)          # int64: past 2^31 on a real pool
    dst_start = block_start(layer, NB, dst, E)
    offs = tl.arange(0, BLOCK_E)
    for start in range(0, E, BLOCK_E):
        idx = start + offs
        mask = idx < E
        k = tl.load(KCaches + src_start + idx, mask=mask)
        v = tl.load(VCaches + src_start + idx, mask=mask)
        tl.store(KCaches + dst_start + idx, k, mask=mask)
        tl.store(VCaches + dst_start + idx, v, mask=mask)


def copy_blocks(k_caches, v_caches, block_mapping, block_e: int = 1024):
    """Copy-on-write copies for every layer in one launch (in place).

    Args:
        k_caches, v_caches: ``[L, NB, BS, Hkv, D]`` all layers' caches, contiguous, same dtype
            and device; written in place.
        block_mapping: ``[N, 2]`` int64 rows ``(src, dst)``; destinations distinct and never a
            source (the manager's copies go into fresh blocks); a source may repeat.
        block_e: elements each program moves per iteration (a power of two; capped at the block).

    Strides: ``block_mapping`` is only read: any layout, copied contiguous first when it is not.
    The caches are written in place, and the kernel addresses block ``b`` of layer ``l`` as the
    flat run of ``E`` elements from ``(l * NB + b) * E``, so they must be contiguous.  A
    contiguous copy would take the writes and lose them, so any other layout is refused with
    ``TensorError`` naming the cache and its strides (``kernels/checks.py``,
    ``check_contiguous``).  The reference takes any layout whose elements do not share memory.

    Raises:
        TensorError: a bad rank, shape, dtype or device, or a non-contiguous cache.
        CacheError: a block id outside the pool, or a mapping whose result would depend on the
            order of the copies (a destination twice, or also a source).
        DTypeNotSupportedError, KernelUnavailableError: see :mod:`kernels.runtime`.
    """
    _check_copy_args(k_caches, v_caches, block_mapping)
    for name, t in (("k_caches", k_caches), ("v_caches", v_caches)):
        check_contiguous(name, t, "the kernel copies each block as one flat run of BS * Hkv * D elements")
    check_kernel_dtype(k_caches.dtype, k_caches.device)
    N = block_mapping.shape[0]
    if N == 0:
        return
    require_triton()
    L, NB = k_caches.shape[:2]
    E = k_caches[0, 0].numel()
    copy_blocks_kernel[(N, L)](
        k_caches, v_caches, block_mapping.contiguous(), NB,
        E=E, BLOCK_E=min(triton.next_power_of_2(E), triton.next_power_of_2(block_e)),
    )


def benchmark(device, dtype, timer):
    """Rows for ``python -m kernels.bench``: GB/s of one step's copy-on-write copies, ours vs a
    torch index copy.

    Bytes moved: every copied block of every layer of K and V read once and written once,
    ``2 * 2 * L * N * E * itemsize``.  ``vs torch`` is the reference's time over ours.
    """
    if device.type == "cuda":
        shapes = [(32, 4096, 16, 8, 128, 64), (32, 4096, 16, 8, 128, 512), (80, 2048, 16, 8, 128, 256)]
    else:
        shapes = [(2, 16, 4, 2, 16, 3)]  # a sanity shape: the interpreter is slow
    rows = []
    for L, NB, BS, Hkv, D, N in shapes:
        g = torch.Generator(device=device).manual_seed(0)
        k = torch.randn(L, NB, BS, Hkv, D, device=device, dtype=dtype, generator=g)
        v = torch.randn_like(k)
        perm = torch.randperm(NB, device=device, generator=g)
        mapping = torch.stack([perm[:N], perm[N:2 * N]], dim=1).to(torch.int64)
        ours = timer(lambda: copy_blocks(k, v, mapping))
        ref = timer(lambda: copy_blocks_reference(k, v, mapping))
        moved = 2 * 2 * L * N * BS * Hkv * D * k.element_size()
        rows.append(timing.row("copy_blocks", f"L={L} NB={NB} BS={BS} Hkv={Hkv} D={D} N={N}", dtype, ours,
                               "GB/s", moved, vs_torch=ref / ours))
    return rows
