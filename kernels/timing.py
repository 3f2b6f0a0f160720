"""Timing helpers the kernels' ``benchmark`` functions share: a timer and one result row.

Kept apart from :mod:`kernels.bench` (which imports every kernel module) so that a kernel module
can use them without importing the runner.
"""

from __future__ import annotations

import statistics
import time

import torch

__all__ = ["make_timer", "row"]


def make_timer(device: torch.device, warmup: int = 3, rep: int = 20):
    """Return ``timer(fn) -> seconds`` (median). CUDA: events via ``triton.testing.do_bench``."""
    if device.type == "cuda":
        import triton.testing  # only on a GPU machine, where triton is installed

        return lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100) / 1e3

    def timer(fn):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(rep):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return lambda fn: timer(fn)


def row(kernel: str, shape: str, dtype, seconds: float, unit: str, amount: float,
        sdpa_seconds: float | None = None, **extra) -> dict:
    """One result row; ``amount`` is bytes (unit GB/s) or FLOPs (unit TFLOP/s)."""
    scale = 1e9 if unit == "GB/s" else 1e12
    out = {"kernel": kernel, "shape": shape, "dtype": str(dtype).replace("torch.", ""),
           "ms": seconds * 1e3, "rate": amount / seconds / scale, "unit": unit,
           "vs_sdpa": (sdpa_seconds / seconds) if sdpa_seconds else None}
    out.update(extra)
    return out
