"""Input checks shared by the kernels' host wrappers. Each failure names the bad value."""

import torch

from paged_kv.validate import count
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
