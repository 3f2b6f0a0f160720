"""Input checks shared by the kernels' host wrappers. Each failure names the bad value."""

import math

import torch

from paged_kv.validate import count, real
from paged_kv.errors import ConfigError, TensorError

from .runtime import check_kernel_dtype


def check_tensor(name: str, t, ndim: int, dtype=None, device=None) -> None:
    """Raise ``TensorError`` unless ``t`` is a tensor with ``ndim`` dims (and dtype/device)."""
    if not isinstance(t, torch.Tensor):
        raise TensorError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise TensorError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if dtype is not None and t.dtype != dtype:
        raise TensorError(f"{name} must be {dtype}, got {t.dtype}")
    if device is not None and t.device != device:
        raise TensorError(f"{name} is on {t.device}, expected {device} (same as q)")


def softmax_scale(scale, head_dim: int) -> float:
    """The attention logits' scale: ``1 / sqrt(head_dim)`` when ``scale`` is None (the paper's
    ``1/sqrt(d)``), else ``scale`` as a float.

    Raises:
        ConfigError: ``scale`` is not a finite number > 0 (a NaN would turn every output NaN,
            ``True`` would run as 1.0, a string fail inside ``float``).
    """
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    return real("scale (or None for 1/sqrt(head_dim))", scale, 0.0, low_open=True)


def check_tuning(name: str, value, minimum: int = 1, power_of_two: bool = False,
                 error: type = ConfigError) -> int:
    """``value`` as an int, or raise ``error`` (``ConfigError``) naming it.

    For the wrappers' tuning knobs (``num_splits``, ``block_m``, ``block_n``) and sizes taken
    from shapes (``head_dim``: pass ``error=TensorError``).  Python and numpy integers pass;
    bools, floats and other types do not.  ``minimum``: the smallest allowed value (16 for a
    tile that feeds ``tl.dot``); ``power_of_two``: ``tl.arange`` needs a power-of-two length.
    """
    n = count(name, value, minimum, error)
    if power_of_two and n & (n - 1):
        raise error(f"{name} must be a power of two (e.g. 16, 32, 64), got {n}")
    return n


def check_same(name: str, value, expected, what: str) -> None:
    if value != expected:
        raise TensorError(f"{name}: {what} is {value}, expected {expected}")


def check_qkv(q, k, v) -> None:
    """Same dtype/device for q, k, v; a supported compute dtype; GQA-compatible head counts.

    Shapes are checked by the caller; here ``q.shape[-2]`` is H and ``k.shape[-2]`` is Hkv.
    """
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TensorError(f"{name} is {t.dtype} but q is {q.dtype}; all must match")
        if t.device != q.device:
            raise TensorError(f"{name} is on {t.device} but q is on {q.device}")
    if k.shape != v.shape:
        raise TensorError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    H, Hkv = q.shape[-2], k.shape[-2]
    if Hkv == 0 or H % Hkv:
        raise TensorError(f"num_heads {H} is not a multiple of num_kv_heads {Hkv}")
    if q.shape[-1] != k.shape[-1]:
        raise TensorError(f"head_dim of q ({q.shape[-1]}) and k ({k.shape[-1]}) differ")
    check_tuning("head_dim D", q.shape[-1], error=TensorError)
    check_kernel_dtype(q.dtype, q.device)


def check_seq_lens(seq_lens, B: int, max_len: int, device, name: str = "seq_lens",
                   min_len: int = 1) -> None:
    """``seq_lens`` is int32 ``[B]`` on ``device`` with ``min_len <= seq_lens[b] <= max_len``."""
    check_tensor(name, seq_lens, 1, dtype=torch.int32, device=device)
    check_same(name, seq_lens.shape[0], B, "length")
    if B == 0:
        return
    lo, hi = int(seq_lens.min()), int(seq_lens.max())
    if lo < min_len:
        raise TensorError(f"{name} must be >= {min_len}, got {lo}")
    if hi > max_len:
        raise TensorError(f"{name} has {hi}, more than the {max_len} tokens the tensor holds")


# ---------------------------------------------------------------------------------------------
# Strides: the wrappers' one policy.
#
# A tensor a kernel only *reads* (q, k, v, lengths, block tables, slot mappings, a cache that
# attention reads) may have any strides: transposed, step-sliced, narrowed, expanded.  The wrapper
# passes the kernel its strides where the kernel takes them, and otherwise a ``.contiguous()``
# copy (no copy when it already is), and allocates every output from that contiguous tensor,
# never ``*_like`` of the caller's view.  A tensor a kernel *writes in place* (a cache, a swap
# destination) cannot be copied -- the writes would land in the copy and be lost -- so its
# layout is checked here and refused, naming the argument and its strides, when the kernel
# could not write it exactly.
# ---------------------------------------------------------------------------------------------
def _strides_overlap(shape, strides) -> bool:
    reach = 0                                           # furthest offset of the dims seen so far
    for stride, size in sorted((abs(st), sz) for st, sz in zip(strides, shape) if sz > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def may_overlap(t: torch.Tensor) -> bool:
    """True unless the strides prove that no two elements of ``t`` share memory.

    Sort the dims of size > 1 by stride; each stride must pass the furthest offset the smaller
    dims reach.  A stride 0 (``expand``) fails at once.  The test is sufficient, not necessary:
    an exotic interleaving such as shape ``(3, 2)`` with strides ``(2, 3)`` is disjoint but fails
    it (no tensor built by slicing, transposing or narrowing a fresh one does).
    """
    return _strides_overlap(t.shape, t.stride())


def may_share(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True unless ``a`` and ``b`` provably share no element.

    Different storages never share.  Two views of one storage with one shape, strides and dtype
    (``kv[:, 0]`` and ``kv[:, 1]`` of a ``[NB, 2, BS, Hkv, D]`` cache, FlashInfer's layout) are
    apart when the pair, taken as one tensor with an extra dim whose stride is the offset between
    them, has no overlap (:func:`may_overlap`'s test).  Otherwise: apart when their ranges of
    bytes do not meet.  Sufficient, not necessary, like :func:`may_overlap`.
    """
    if not a.numel() or not b.numel() or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    if a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride():
        gap = abs(b.storage_offset() - a.storage_offset())
        return _strides_overlap((2, *a.shape), (gap, *a.stride()))

    def extent(t):                                      # [first, last] byte of t in the storage
        lo = hi = t.storage_offset()
        for st, sz in zip(t.stride(), t.shape):
            (lo, hi) = (lo + st * (sz - 1), hi) if st < 0 else (lo, hi + st * (sz - 1))
        return lo * t.element_size(), (hi + 1) * t.element_size() - 1
    (a0, a1), (b0, b1) = extent(a), extent(b)
    return a0 <= b1 and b0 <= a1


def check_apart(tensors: dict) -> None:
    """Raise ``TensorError`` if a tensor written in place may share memory with another argument
    (``tensors``: name -> tensor, the written ones first): the K cache given as the V cache, or
    ``k`` a view into ``k_cache``, would make one write overwrite another, or the result depend
    on the order the kernel's programs run in."""
    names = list(tensors)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            if may_share(tensors[x], tensors[y]):
                a, b = tensors[x], tensors[y]
                raise TensorError(
                    f"{x} (shape {tuple(a.shape)}, strides {a.stride()}, offset {a.storage_offset()}) "
                    f"and {y} (shape {tuple(b.shape)}, strides {b.stride()}, offset {b.storage_offset()}) "
                    f"share memory, and one of them is written in place: pass separate tensors")


def check_writable(name: str, t: torch.Tensor) -> None:
    """Raise ``TensorError`` unless ``t`` can be written in place element by element.

    Any strides pass (transposed, step-sliced, narrowed), but not a view in which several
    elements share memory (``expand``, some ``as_strided``): which write would win is undefined,
    and a copy would receive the writes instead of the caller's tensor.
    """
    if t.numel() and may_overlap(t):
        raise TensorError(
            f"{name} (shape {tuple(t.shape)}, strides {t.stride()}) is written in place, but some "
            f"of its elements share memory (an expand() or as_strided() view?), so which write "
            f"wins is undefined: pass a tensor whose elements are its own, e.g. from torch.empty")


def check_contiguous(name: str, t: torch.Tensor, why: str) -> None:
    """Raise ``TensorError`` unless ``t`` is contiguous; ``why``: what the kernel assumes.

    For a tensor written in place whose kernel computes flat offsets: a ``.contiguous()`` copy
    would take the writes and the caller's tensor would never see them, so the wrapper refuses.
    """
    if not t.is_contiguous():
        raise TensorError(
            f"{name} must be contiguous ({why}); got strides {t.stride()} for shape "
            f"{tuple(t.shape)}, contiguous would be {_contiguous_strides(t.shape)}. It is written "
            f"in place, so it cannot be copied contiguous (the copy would take the writes): "
            f"allocate it contiguous, e.g. with torch.empty(shape)")


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for size in reversed(tuple(shape)):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
