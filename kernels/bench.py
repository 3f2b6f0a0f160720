"""``python -m kernels.bench``: time every kernel against PyTorch's SDPA on the same inputs.

Each kernel module exposes ``benchmark(device, dtype, timer) -> list[dict]``; this file finds
them, runs them and prints one table.  Units are formulas, not impressions:

* decode kernels are memory-bound: **GB/s** = bytes of K/V (and q, out) moved / seconds;
* prefill is compute-bound: **TFLOP/s** = 4 * B * H * D * (causal query-key pairs) / seconds.

``vs SDPA`` is SDPA's time divided by ours (> 1: ours is faster).  On a CPU the kernels run in the
Triton interpreter, so only a tiny sanity shape is timed and the numbers mean nothing about GPUs.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import torch

from ._runtime import default_device, interpreter_active, triton_available, triton_status

KERNEL_MODULES = ("prefill_attention", "decode_attention", "paged_attention", "cache_ops")


def make_timer(device: torch.device, warmup: int = 3, rep: int = 20):
    """Return ``timer(fn) -> seconds`` (median). CUDA: events via ``triton.testing.do_bench``."""
    if device.type == "cuda":
        import triton.testing

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


def run(device: torch.device | None = None, dtypes=None, modules=KERNEL_MODULES) -> list[dict]:
    """Run every available kernel module's ``benchmark``; returns the rows."""
    device = device or default_device()
    if not triton_available():  # e.g. macOS/Windows: nothing to time; say why instead
        print(f"no Triton kernels timed: {triton_status()}")
        return []
    if dtypes is None:
        if device.type == "cuda":
            dtypes = [torch.float16]
            if torch.cuda.get_device_capability(device) >= (8, 0):
                dtypes.append(torch.bfloat16)
        else:
            dtypes = [torch.float32]
    timer = make_timer(device, warmup=1 if interpreter_active() else 3, rep=3 if interpreter_active() else 20)
    rows = []
    for name in modules:
        try:
            mod = importlib.import_module(f"kernels.{name}")
        except ModuleNotFoundError:
            continue
        if not hasattr(mod, "benchmark"):
            continue
        for dtype in dtypes:
            rows.extend(mod.benchmark(device, dtype, timer))
    return rows


def format_rows(rows: list[dict]) -> str:
    head = f"{'kernel':<26} {'shape':<36} {'dtype':<9} {'ms':>9} {'rate':>14} {'vs SDPA':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['vs_sdpa']:.2f}x" if r["vs_sdpa"] else "-"
        # Other ratios a module adds as vs_<name>=... (e.g. vs_contig) print as "<name> 1.23x".
        more = "".join(f"  {k[3:]} {v:.3g}x" for k, v in r.items() if k.startswith("vs_") and k != "vs_sdpa" and v)
        lines.append(f"{r['kernel']:<26} {r['shape']:<36} {r['dtype']:<9} {r['ms']:>9.3f} "
                     f"{r['rate']:>9.3g} {r['unit']:<4} {ratio:>8}{more}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", nargs="*", default=list(KERNEL_MODULES), help="subset of kernel modules")
    args = ap.parse_args(argv)
    print(triton_status())
    device = default_device()
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    print(format_rows(run(device, modules=args.kernels)))


if __name__ == "__main__":
    main()
